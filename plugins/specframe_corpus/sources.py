"""Corpus sources for a datastore: where documents come from, as batches of text or of token ids.

`Source` is what the builder reads; here are the sources that read files (`TextFiles`, `JsonlTexts`) or
take token ids (`TokenDocuments`). The target's own answers are sources too (`answers.py`,
`self_prompts.py`), and `source_specs.py` turns a `--source` argument into any of them. Every source
yields documents in a fixed order, so a build is reproducible.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specframe.kit.files import check_encodable, parse_json
from specframe_corpus.datastore import DatastoreError

TEXT_FIELDS = ("text", "content", "answer", "output", "completion", "response", "code")
TURN_FIELDS = ("messages", "conversations", "conversation", "turns")
BATCH_BYTES = 1 << 20  # text handed to the tokenizer per batch


@dataclass
class Source:
    """Documents from one place. `batches()` yields lists of `str` or of id arrays; `total` sizes progress."""

    spec: str
    kind: str
    total: int = 0  # units for the progress bar (files, lines or prompts)
    meta: dict = field(default_factory=dict)

    def prepare(self, target, out: Path) -> None:
        """Called by the builder before `batches()`; sources that need the target override it."""

    def batches(self) -> Iterator[tuple[list, int]]:
        """(documents, units done) pairs; documents are `str` (to tokenize) or int arrays (already ids)."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"source": self.spec, "kind": self.kind, **self.meta}


@dataclass
class TextFiles(Source):
    """Each file is one document; binary files (NUL bytes) and files that are not UTF-8 are skipped."""

    files: list[Path] = field(default_factory=list)

    def batches(self) -> Iterator[tuple[list, int]]:
        docs, size, done, skipped = [], 0, 0, 0
        for file in self.files:
            done += 1
            try:
                raw = file.read_bytes()
                text = raw.decode("utf-8") if b"\0" not in raw else None
            except (OSError, UnicodeDecodeError):
                text = None
            if text is None:
                skipped += 1
                continue
            if text.strip():
                docs.append(text)
                size += len(raw)
            if size >= BATCH_BYTES:
                yield docs, done
                docs, size = [], 0
        self.meta["skipped_files"] = skipped
        if docs:
            yield docs, done


@dataclass
class JsonlTexts(Source):
    """One document per line (a text field), or one per chat turn (a list of messages or strings)."""

    path: Path = Path()
    field_name: str | None = None

    def numbered_lines(self) -> Iterator[tuple[int, str]]:
        """(line number in the file, line) of every line this source reads: here, all of them."""
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, 1):
                yield number, decode_line(raw, self.path, number)

    def batches(self) -> Iterator[tuple[list, int]]:
        docs, size, done = [], 0, 0
        for done, (number, line) in enumerate(self.numbered_lines(), 1):
            if not line.strip():
                continue
            for text in texts_of(parse_line(line, self.path, number), self.field_name, self.path, number):
                docs.append(text)
                size += len(text)
            if size >= BATCH_BYTES:
                yield docs, done
                docs, size = [], 0
        if docs:
            yield docs, done


@dataclass
class TokenDocuments(Source):
    """Documents given directly as token ids (the Python API, tests, and the model's own answers)."""

    documents: list = field(default_factory=list)

    def batches(self) -> Iterator[tuple[list, int]]:
        for start in range(0, len(self.documents), 256):
            chunk = self.documents[start : start + 256]
            yield [np.asarray(d, dtype=np.int64) for d in chunk], start + len(chunk)


def decode_line(raw: bytes, path: Path, number: int) -> str:
    """Line `number` of the JSONL file `path` as text; a line that is not UTF-8 is named."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DatastoreError(
            f"datastore source '{path}', line {number}: not UTF-8 text ({err.reason} at byte {err.start}); "
            "JSON files are UTF-8: convert it (e.g. `iconv -f latin1 -t utf-8`)"
        ) from None


def parse_line(line: str, path: Path, number: int) -> object:
    return parse_json(line, f"datastore source '{path}', line {number}",
                      "write one JSON object or string per line", DatastoreError)


def texts_of(record: object, field_name: str | None, path: Path, number: int) -> list[str]:
    """The documents of one JSONL record: `field_name`, else the first known text or turns field; a text
    holding a lone surrogate (a `\\ud800` escape without its pair), which no tokenizer takes, is refused."""
    where = f"datastore source '{path}', line {number}"
    return [check_encodable(text, where, "fix or remove that escape", DatastoreError)
            for text in _texts(record, field_name, path, number)]


def _texts(record: object, field_name: str | None, path: Path, number: int) -> list[str]:
    if isinstance(record, str):
        return [record] if record.strip() else []
    if not isinstance(record, dict):
        raise DatastoreError(f"datastore source '{path}', line {number}: expected a JSON object or string")
    names = (field_name,) if field_name else TURN_FIELDS + TEXT_FIELDS
    for name in names:
        value = record.get(name)
        if isinstance(value, str):
            return [value] if value.strip() else []
        if isinstance(value, list):
            turns = [
                t
                if isinstance(t, str)
                else next(
                    (
                        t[k]
                        for k in ("content", "value", "text")
                        if isinstance(t, dict) and isinstance(t.get(k), str)
                    ),
                    "",
                )
                for t in value
            ]
            return [t for t in turns if t.strip()]
    wanted = f"field '{field_name}'" if field_name else f"any of {', '.join(names)}"
    raise DatastoreError(
        f"datastore source '{path}', line {number}: no text in {wanted} (keys: "
        f"{', '.join(map(str, record)) or 'none'}); name the field with --field"
    )
