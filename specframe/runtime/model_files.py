"""Checks of model directories on disk: the files a Hugging Face model needs, and damage (truncated
safetensors, unparsable JSON, files missing from a finished GGUF conversion) found before loading, so
each kind of bad directory gets a message that names what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

from specframe.terms.errors import ModelLoadError

CONVERSION_MARKER = "specframe-conversion.json"  # written last into a conversion: its files and sizes


WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def check_model_files(directory: Path) -> None:
    """Refuse a directory without config.json, weights or tokenizer files, naming what is missing."""
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"{directory} has no config.json: it is not a Hugging Face model directory; "
                             f"pass one with --model, or {save_hint(directory)}")
    if not any(any(directory.glob(pattern)) for pattern in WEIGHT_FILES):
        raise ModelLoadError(f"{directory} has no model weights (model.safetensors or pytorch_model.bin); "
                             f"{save_hint(directory)}")
    if not any((directory / file).is_file() for file in TOKENIZER_FILES):
        raise ModelLoadError(f"{directory} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}); "
                             f"{save_hint(directory)}")


def save_hint(directory: Path) -> str:
    return f"save a model there with model.save_pretrained('{directory}') and tokenizer.save_pretrained(...)"


def write_marker(directory: Path) -> None:
    """Record every file of a finished conversion with its size; written last, so it means complete."""
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    (directory / CONVERSION_MARKER).write_text(json.dumps({"files": files}, indent=2) + "\n")


def conversion_damage(directory: Path) -> str | None:
    """What is wrong with the cached conversion in `directory`, or None when it looks complete.

    Checks the sizes recorded by `_write_marker` and the safetensors headers against the file sizes, so
    a truncated or partly deleted cache is converted again instead of failing later with an obscure
    error. Caches converted before the marker existed are checked by parsing their JSON files instead.
    """
    if not (directory / "config.json").is_file():
        return "config.json is missing"
    weights = sorted(directory.glob("*.safetensors"))
    if not weights:
        return "it holds no .safetensors weights"
    marker = directory / CONVERSION_MARKER
    damage = _size_damage(directory, marker) if marker.is_file() else _json_damage(directory)
    if damage is None:
        damage = next(filter(None, map(safetensors_damage, weights)), None)
    return damage


def _size_damage(directory: Path, marker: Path) -> str | None:
    """The first file whose size differs from the one `_write_marker` recorded."""
    try:
        recorded = json.loads(marker.read_text())["files"]
        items = list(recorded.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return f"{CONVERSION_MARKER} is unreadable"
    for name, size in items:  # what `write_marker` writes: plain names in this directory, sizes in bytes
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0
                and name not in ("", ".", "..") and Path(name).name == name and "\0" not in name):
            return f"{CONVERSION_MARKER} records {name!r}: {size!r}, not a file of this directory and a size"
    for name, size in items:
        file = directory / name
        actual = file.stat().st_size if file.is_file() else None
        if actual != size:
            return f"{name} is missing" if actual is None else f"{name} has {actual} bytes, expected {size}"
    return None


def _json_damage(directory: Path) -> str | None:
    """The first JSON file of `directory` that does not parse (a truncated write, usually)."""
    for file in sorted(directory.glob("*.json")):
        try:
            json.loads(file.read_text())
        except (OSError, ValueError) as err:
            return f"{file.name} is not valid JSON ({err})"
    return None


def safetensors_damage(file: Path) -> str | None:
    """What is wrong with the safetensors `file` (8-byte header length, JSON header, tensor data), or None.

    The header's largest data offset fixes the file size, so a truncated file is found without reading
    its tensors.
    """
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else None
        if length is None or 8 + length > size:
            return f"{file.name} is truncated inside its header ({size} bytes)"
        try:
            header = json.loads(f.read(length))
            ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            return f"{file.name} has a corrupt header"
    if not all(isinstance(end, int) and not isinstance(end, bool) and end >= 0 for end in ends):
        return f"{file.name} has a corrupt header (a data offset that is not a byte count)"
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"{file.name} has {size} bytes, its header says {expected}"
    return None


def damaged_weights(directory: Path) -> tuple[Path, str] | None:
    """The first safetensors file of `directory` whose header does not match its size, with the reason."""
    for file in sorted(directory.glob("*.safetensors")):
        reason = safetensors_damage(file)
        if reason:
            return file, reason
    return None
