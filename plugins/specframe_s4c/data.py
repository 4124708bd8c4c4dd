"""Training corpora for draft heads: text files, JSONL, or the Python standard library, as token blocks.

A `--data` source is one of:
- `python-stdlib` (alias `python-site`): the `.py` files of the running interpreter's standard library;
- a directory: every `.py`, `.txt` and `.md` file under it (sorted, so runs are reproducible);
- a `.jsonl` file: the `text` field of each line (or, failing that, every string value joined);
- any other file: its text;
- `answers:NAME`: the target's own chats from a `model:self` datastore build named NAME (its
  `NAME.prompts.jsonl` and cached greedy answers `NAME.answers.jsonl` in the datastore directory), each
  as token ids: the prompt in the chat template, then the answer; or its own code from a
  `model-continue:python-stubs` build (a stub as raw text, then the body the target wrote). Heads trained
  on these learn what the target itself says, which is what they must predict when drafting for it.
`source[:N]` keeps the first N documents (e.g. `python-stdlib:400`).
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from specframe import ConfigurationError
from specframe.kit.files import parse_json

TEXT_SUFFIXES = (".py", ".txt", ".md")


def iter_documents(source: str, tokenizer=None) -> Iterator[str | list[int]]:
    """The documents of one `--data` source, in a fixed order: texts, or token ids (`answers:`, which
    needs the target's `tokenizer`)."""
    limit = None
    name = source
    if ":" in source and source.rsplit(":", 1)[1].isdigit():
        name, count = source.rsplit(":", 1)
        limit = int(count)
    answers = name.startswith("answers:")
    docs = _answers(name.removeprefix("answers:"), tokenizer) if answers else _documents(name)
    for i, doc in enumerate(docs):
        if limit is not None and i >= limit:
            return
        if doc if isinstance(doc, list) else doc.strip():
            yield doc


def _answers(name: str, tokenizer) -> Iterator[list[int]]:
    from specframe_corpus.answers import built_answers
    from specframe_corpus.datastore import DatastoreError

    try:
        yield from built_answers(name, tokenizer)
    except DatastoreError as err:
        raise ConfigurationError(f"s4c training: --data answers:{name}: {err}") from None


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
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if line.strip():
                record = json_line(path, number, line)
                text = record.get("text") if isinstance(record, dict) else None
                yield text if isinstance(text, str) else _strings(record)
    elif path.is_file():
        yield _read(path)
    else:
        raise ConfigurationError(
            f"s4c training: data source '{name}' is not 'python-stdlib', a directory, a .jsonl or a "
            "text file")


def json_line(path: Path, number: int, line: str):
    """Line `number` of the JSONL file `path`, parsed by the kit's reader of untrusted JSON: refused, with
    its number, unless it is JSON that Python can hold (not too deep, no integer of more than 4300 digits)."""
    return parse_json(line, f"s4c training: line {number} of the --data file {path}",
                      "fix or remove that line (each line must be a JSON object, its text in a "
                      "\"text\" field)", ConfigurationError)


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
        for doc in iter_documents(source, tokenizer):
            text = not isinstance(doc, list)
            ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"] if text else doc)
            if eos is not None:
                ids.append(eos)
            if max_tokens is not None and len(ids) >= max_tokens:
                break
    if max_tokens is not None:
        ids = ids[:max_tokens]
    rows = len(ids) // block
    if rows == 0:
        raise ConfigurationError(
            f"s4c training: the data holds {len(ids)} tokens, fewer than one block ({block})")
    return np.asarray(ids[: rows * block], dtype=np.int64).reshape(rows, block)  # (B, T)
