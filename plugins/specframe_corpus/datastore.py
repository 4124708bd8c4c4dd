"""The REST datastore on disk: a versioned directory, opened by memory map and checked before use.

Layout of a datastore directory::

    datastore.json   header: format and version, tokenizer identity, dtypes, counts, sources, file digests
    tokens.bin       the corpus as one token array: SEP doc_1 SEP doc_2 SEP ... doc_D SEP
    suffixes.bin     suffix array of the *reversed* token array (int32, or int64 past 2**31 tokens)
    buckets.bin      int64 (SEP + 2,): suffixes starting with token t are suffixes[buckets[t]:buckets[t + 1]]

SEP is the vocabulary size: no real token equals it, so no match can span two documents, and a
continuation stops at the end of its document. Tokens are uint16 when SEP fits, else uint32 (ids are
never truncated). Indexing the reversed corpus lets retrieval extend a match to the left one token at a
time inside one suffix-array interval, instead of one fresh search per match length (see `retrieval.py`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from specframe import SpecframeError
from specframe.kit.drafting import TokenizerIdentity
from specframe.kit.files import read_json

FORMAT = "specframe-rest-datastore"
FORMAT_VERSION = 1
HEADER, TOKENS, SUFFIXES, BUCKETS = "datastore.json", "tokens.bin", "suffixes.bin", "buckets.bin"
BUILD_HINT = "rebuild it with `specframe datastore build --model MODEL --source SOURCE --out DIR`"
CHUNK = 1 << 20  # items per slice when a check reads a whole file: memory stays bounded, whatever its size
SPARSE_FLOOR = 64 << 20  # a file may hold fewer bytes on disk than its size below this (ZFS compresses)


class DatastoreError(SpecframeError):
    """A REST datastore is missing, corrupt, from a newer format, empty, or built for another tokenizer."""


class DatastoreBusyError(DatastoreError):
    """Another process is building the same datastore: a second build would overwrite or lose its work."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id and the separator (= vocab_size) fit, else uint32."""
    if vocab_size < 1 or vocab_size >= 2**32 - 1:
        raise DatastoreError(f"datastore: vocabulary size {vocab_size} is out of the supported range")
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max else np.dtype(np.uint32)


def suffix_dtype(n_positions: int) -> np.dtype:
    return np.dtype(np.int32) if n_positions <= np.iinfo(np.int32).max else np.dtype(np.int64)


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


class Datastore:
    """An opened datastore: `tokens` and `suffixes` are read-only memory maps of the files.

    Opening checks the header, the file sizes (against the header, and against the bytes really on disk,
    so a sparse file cannot claim gigabytes), the separators framing the corpus, the token range, the
    buckets, the range of every suffix-array entry and the order of a sample of them, so a truncated or
    corrupt store fails here with a clear message rather than later with wrong drafts or an exception.
    `verify()` additionally compares every file with its recorded digest.
    """

    def __init__(
        self, path: Path, header: dict, tokens: np.ndarray, suffixes: np.ndarray, buckets: np.ndarray
    ):
        self.path, self.header = path, header
        self.tokens, self.suffixes, self.buckets = tokens, suffixes, buckets
        self.separator = int(header["separator"])
        self.identity = TokenizerIdentity(**header["tokenizer"])

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def open(cls, path: str | os.PathLike, expect: TokenizerIdentity | None = None) -> Datastore:
        """Open and check the datastore at `path`; with `expect`, refuse one built for another tokenizer."""
        path = Path(path).expanduser()
        header = read_header(path)
        if expect is not None:
            cls.check_identity(path, TokenizerIdentity(**header["tokenizer"]), expect)
        n = int(header["n_positions"])
        sep = int(header["separator"])
        tokens = _map(path, TOKENS, header["token_dtype"], n)
        suffixes = _map(path, SUFFIXES, header["suffix_dtype"], n)
        buckets = _map(path, BUCKETS, "int64", sep + 2)  # mapped, not read: checked in chunks
        store = cls(path, header, tokens, suffixes, buckets)
        store._check()
        return store

    @staticmethod
    def check_identity(path: Path, have: TokenizerIdentity, expect: TokenizerIdentity) -> None:
        """Refuse a datastore whose token ids mean something else for the target."""
        if not have.matches(expect):
            raise DatastoreError(
                f"datastore '{path}' was built with tokenizer {have.name} (vocab {have.vocab_size}, "
                f"{have.fingerprint[:19]}) but the target uses tokenizer {expect.name} (vocab "
                f"{expect.vocab_size}, {expect.fingerprint[:19]}); {BUILD_HINT} for this model"
            )

    def _check(self) -> None:
        """Cheap structural checks: one pass over the tokens, the buckets and the suffix array's range (in
        chunks, so memory stays bounded), and the suffix array's order on a sample."""
        tokens, sep, n = self.tokens, self.separator, len(self.tokens)
        where = f"datastore '{self.path}'"
        if n < 3 or tokens[0] != sep or tokens[-1] != sep:
            raise DatastoreError(
                f"{where}: {TOKENS} does not start and end with the document separator: "
                f"the file is corrupt; {BUILD_HINT}"
            )
        high = sum(int(np.count_nonzero(part >= sep)) for part in chunks(tokens))
        if high != int(self.header["n_documents"]) + 1:  # one cheap pass; the exact diagnosis only on failure
            top = int(tokens.max())
            if top > sep:
                raise DatastoreError(
                    f"{where}: token id {top} is out of range for vocabulary size {sep}: the file "
                    f"is corrupt or was written for another model; {BUILD_HINT}"
                )
            raise DatastoreError(
                f"{where}: {high - 1} documents in {TOKENS} but the header says "
                f"{self.header['n_documents']}: the store is corrupt; {BUILD_HINT}"
            )
        b = self.buckets
        if b[0] != 0 or b[-1] != n or any(np.any(np.diff(part) < 0) for part in chunks(b, overlap=1)):
            raise DatastoreError(f"{where}: {BUCKETS} is inconsistent with the token array; {BUILD_HINT}")
        # Every position in the corpus, so that retrieval never indexes outside it (one pass, in chunks)
        if any(part.min() < 0 or part.max() >= n for part in chunks(self.suffixes)):
            raise DatastoreError(f"{where}: {SUFFIXES} holds positions outside the corpus; {BUILD_HINT}")
        sample = (
            np.arange(n - 1)
            if n <= 4097  # every adjacent pair of a small store, else a fixed sample
            else np.random.default_rng(0).integers(0, n - 1, size=4096)
        )
        pos = self.suffixes[sample].astype(np.int64)
        nxt = self.suffixes[sample + 1].astype(np.int64)
        if pos.min() < 0 or pos.max() >= n or nxt.min() < 0 or nxt.max() >= n:
            raise DatastoreError(f"{where}: {SUFFIXES} holds positions outside the corpus; {BUILD_HINT}")
        first, second = tokens[n - 1 - pos], tokens[n - 1 - nxt]  # first reversed token of each suffix
        if np.any(first > second):
            raise DatastoreError(f"{where}: {SUFFIXES} is not sorted: the file is corrupt; {BUILD_HINT}")

    def verify(self) -> None:
        """Compare every file with the digest recorded at build time (reads everything once)."""
        for name, meta in self.header["files"].items():
            if file_digest(self.path / name) != meta["sha256"]:
                raise DatastoreError(
                    f"datastore '{self.path}': {name} does not match its recorded digest: "
                    f"the file was modified or damaged; {BUILD_HINT}"
                )

    def describe(self) -> dict:
        """The header plus derived sizes, as `specframe datastore info` prints it."""
        on_disk = sum((self.path / name).stat().st_size for name in self.header["files"])
        corpus = int(self.header["n_tokens"])
        return {
            **self.header,
            "path": str(self.path),
            "bytes_on_disk": on_disk,
            "bytes_per_token": on_disk / corpus if corpus else None,
        }


def read_header(path: Path) -> dict:
    """The parsed, version-checked header of the datastore directory `path`."""
    file = path / HEADER
    if not file.is_file():
        raise DatastoreError(
            f"no datastore at '{path}' ({HEADER} is missing); build one with "
            "`specframe datastore build --model MODEL --source SOURCE --out DIR`"
        )
    header = read_json(file, BUILD_HINT, DatastoreError, where=f"datastore '{path}': {HEADER}")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise DatastoreError(
            f'\'{path}\' is not a specframe REST datastore ({HEADER} lacks "format": "{FORMAT}")'
        )
    version = header.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise DatastoreError(f"datastore '{path}': invalid format_version {version!r}; {BUILD_HINT}")
    if version > FORMAT_VERSION:
        raise DatastoreError(
            f"datastore '{path}' has format version {version}, newer than the version "
            f"{FORMAT_VERSION} this specframe reads: upgrade specframe, or {BUILD_HINT}"
        )
    required = (
        "tokenizer",
        "separator",
        "token_dtype",
        "suffix_dtype",
        "n_positions",
        "n_tokens",
        "n_documents",
        "sources",
        "files",
    )
    missing = [key for key in required if key not in header]
    if missing:
        raise DatastoreError(f"datastore '{path}': {HEADER} lacks {', '.join(missing)}; {BUILD_HINT}")
    _check_field_types(path, header)
    if header["n_tokens"] == 0:
        raise DatastoreError(f"datastore '{path}' holds no tokens; {BUILD_HINT} from a non-empty source")
    return header


HEADER_TYPES = {"separator": int, "n_positions": int, "n_tokens": int, "n_documents": int,
                "token_dtype": str, "suffix_dtype": str, "tokenizer": dict, "sources": list, "files": dict}
EXPECTED = {int: "an integer >= 0", str: "a dtype name", dict: "an object", list: "a list"}
TOKEN_DTYPES, SUFFIX_DTYPES = ("uint16", "uint32"), ("int32", "int64")  # all the builder ever writes


def _check_field_types(path: Path, header: dict) -> None:
    """Refuse a header whose fields have the wrong type (a hand-edited or corrupt file) by name, then one
    whose values disagree with each other or with what the builder writes (`_check_values`)."""
    for key, kind in HEADER_TYPES.items():
        value = header[key]
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            expected = EXPECTED[kind]
            raise DatastoreError(f"datastore '{path}': {HEADER} field \"{key}\" is {value!r}, expected "
                                 f"{expected}; the store is corrupt, {BUILD_HINT}")
    _check_values(path, header)


def parse_identity(value: object) -> TokenizerIdentity | None:
    """The tokenizer identity a header records (name, fingerprint, vocab_size, each of its type), or None."""
    kinds = {"name": str, "fingerprint": str, "vocab_size": int}
    if not isinstance(value, dict) or set(value) != set(kinds):
        return None
    if not all(isinstance(value[k], t) and not isinstance(value[k], bool) for k, t in kinds.items()):
        return None
    return TokenizerIdentity(**value) if value["vocab_size"] > 0 else None


def _check_values(path: Path, header: dict) -> None:
    """Refuse a header whose values are not ones the builder writes, before any file is memory-mapped:
    the dtypes are exactly those `token_dtype` and `suffix_dtype` choose for its counts (numpy would map
    any dtype it parses, Python object pointers included), the counts agree, and the files are the
    store's own."""
    def corrupt(key: str, value: object, expected: str) -> DatastoreError:
        return DatastoreError(f"datastore '{path}': {HEADER} field \"{key}\" is {value!r}, expected "
                              f"{expected}; the store is corrupt, {BUILD_HINT}")

    identity, sep = parse_identity(header["tokenizer"]), header["separator"]
    if identity is None:
        raise corrupt("tokenizer", header["tokenizer"], "an object of name, fingerprint and vocab_size")
    if identity.vocab_size != sep:
        raise corrupt("separator", sep, f"the vocabulary size {identity.vocab_size}")
    if not 1 <= sep < 2**32 - 1:
        raise corrupt("separator", sep, "a vocabulary size below 2**32 - 1")
    n = header["n_positions"]
    if n != header["n_tokens"] + header["n_documents"] + 1:  # SEP doc_1 SEP ... doc_D SEP
        raise corrupt("n_positions", n, f"n_tokens + n_documents + 1 = "
                      f"{header['n_tokens'] + header['n_documents'] + 1}")
    for key, want in (("token_dtype", token_dtype(sep).name), ("suffix_dtype", suffix_dtype(n).name)):
        if header[key] != want:
            allowed = TOKEN_DTYPES if key == "token_dtype" else SUFFIX_DTYPES
            raise corrupt(key, header[key], f"{want!r} (one of {', '.join(allowed)}, as the builder "
                          f"writes for {'vocabulary size' if key == 'token_dtype' else 'length'} "
                          f"{sep if key == 'token_dtype' else n})")
    sizes = {TOKENS: n * np.dtype(header["token_dtype"]).itemsize,
             SUFFIXES: n * np.dtype(header["suffix_dtype"]).itemsize, BUCKETS: (sep + 2) * 8}
    files = header["files"]
    if set(files) != set(sizes):
        raise corrupt("files", sorted(files), f"the store's files {', '.join(sizes)}")
    for name, meta in files.items():
        if (not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str)
                or meta.get("bytes", sizes[name]) != sizes[name]):
            raise corrupt(f"files.{name}", meta, f"its sha256 and its size ({sizes[name]} bytes)")
    for i, source in enumerate(header["sources"]):
        if not (isinstance(source, dict) and all(isinstance(source.get(k), str) for k in ("source", "kind"))
                and all(_count(source.get(k)) for k in ("documents", "tokens"))):
            raise corrupt(f"sources[{i}]", source, "an object with source, kind, documents and tokens")
    build = header.get("build", {})
    if not isinstance(build, dict) or not isinstance(build.get("seconds", 0), (int, float)):
        raise corrupt("build", build, "an object with the build's seconds")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def chunks(array: np.ndarray, overlap: int = 0) -> Iterator[np.ndarray]:
    """`array` in consecutive slices of `CHUNK` items (each with the next `overlap` items too), so that a
    check of a memory-mapped file holds one slice in memory at a time."""
    for start in range(0, len(array), CHUNK):
        yield array[start : start + CHUNK + overlap]


def _map(path: Path, name: str, dtype: str, count: int) -> np.ndarray:
    """Memory-map `count` items of `dtype` from `path/name`, refusing a file of the wrong size."""
    file = path / name
    if dtype not in (*TOKEN_DTYPES, *SUFFIX_DTYPES, "int64"):
        raise DatastoreError(f"datastore '{path}': {name} cannot be mapped as {dtype!r}; {BUILD_HINT}")
    dtype = np.dtype(dtype)
    expected = count * dtype.itemsize
    stat = file.stat() if file.is_file() else None
    size = stat.st_size if stat else None
    if size != expected:
        state = "is missing" if size is None else f"has {size} bytes, expected {expected}"
        raise DatastoreError(f"datastore '{path}': {name} {state} (truncated or corrupt); {BUILD_HINT}")
    stored = getattr(stat, "st_blocks", None)
    if stored is not None and size > SPARSE_FLOOR and stored * 512 * 16 < size:
        raise DatastoreError(
            f"datastore '{path}': the header claims {size:,} bytes of {name}, but the file holds only "
            f"{stored * 512:,} bytes on disk (a sparse file): the store is corrupt or crafted; {BUILD_HINT}")
    return np.memmap(file, dtype=dtype, mode="r", shape=(count,))
