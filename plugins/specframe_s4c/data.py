"""Training corpora for draft heads: text files, JSONL, or the Python standard library, as token blocks.

A `--data` source is one of:
- `python-stdlib` (alias `python-site`): the `.py` files of the running interpreter's standard library;
- a directory: every `.py`, `.txt` and `.md` file under it (sorted, so runs are reproducible);
- a `.jsonl` file: the `text` field of each line (or, failing that, every string value joined);
- any other file: its text.
`source[:N]` keeps the first N documents (e.g. `python-stdlib:400`).
"""

from __future__ import annotations

import json
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from specframe.errors import ConfigurationError

TEXT_SUFFIXES = (".py", ".txt", ".md")


def iter_documents(source: str) -> Iterator[str]:
    """The documents of one `--data` source, in a fixed order."""
    limit = None
    name = source
    if ":" in source and source.rsplit(":", 1)[1].isdigit():
        name, count = source.rsplit(":", 1)
        limit = int(count)
    docs = _documents(name)
    for i, doc in enumerate(docs):
        if limit is not None and i >= limit:
            return
        if doc.strip():
            yield doc


def _documents(name: str) -> Iterator[str]:
    if name in ("python-stdlib", "python-site"):
        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts
                       and "test" not in p.parts and "tests" not in p.parts)
        rng = random.Random(0)  # a fixed shuffle, so a prefix `:N` spans many packages
        rng.shuffle(files)
        yield from (_read(p) for p in files)
        return
    path = Path(name).expanduser()
    if path.is_dir():
        yield from (_read(p) for p in sorted(path.rglob("*")) if p.suffix in TEXT_SUFFIXES and p.is_file())
    elif path.is_file() and path.suffix == ".jsonl":
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip():
                record = json.loads(line)
                text = record.get("text") if isinstance(record, dict) else None
                yield text if isinstance(text, str) else _strings(record)
    elif path.is_file():
        yield _read(path)
    else:
        raise ConfigurationError(
            f"s4c training: data source '{name}' is not 'python-stdlib', a directory, a .jsonl or a text file")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _strings(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(_strings(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(_strings(v) for v in value)
    return ""


def token_blocks(tokenizer, sources: list[str], block: int, max_tokens: int | None = None,
                 eos: int | None = None) -> np.ndarray:
    """Tokenize the documents of `sources`, join them with EOS, cut into (num_blocks, block) int64 rows."""
    ids: list[int] = []
    for source in sources:
        for doc in iter_documents(source):
            ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
            if eos is not None:
                ids.append(eos)
            if max_tokens is not None and len(ids) >= max_tokens:
                break
    if max_tokens is not None:
        ids = ids[:max_tokens]
    rows = len(ids) // block
    if rows == 0:
        raise ConfigurationError(f"s4c training: the data holds {len(ids)} tokens, fewer than one block ({block})")
    return np.asarray(ids[: rows * block], dtype=np.int64).reshape(rows, block)  # (B, T)
