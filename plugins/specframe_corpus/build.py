"""Building a datastore: tokenize sources in parallel batches, index the reversed corpus, write atomically.

Everything is written into a temporary directory beside the output and renamed into place at the end, so
an interrupted or failed build leaves no half-written datastore. A build holds a lock on its output from
the existence check to the publish, refuses to run beside another build of the same store, and removes
what a killed build left (see `specframe/support/atomic_dirs.py`). `append=True` keeps the tokens of an
existing datastore (no re-tokenization) and re-indexes the whole corpus, since a suffix array cannot be
extended in place.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import specframe
from specframe.kit.files import (
    check_writable_dir, exchange, exclusive, follow_umask, io_failure, remove_stale, temp_name_pattern,
)
from specframe.kit.progress import bar as progress_bar, peak_memory_bytes
from specframe_corpus.datastore import (
    BUCKETS,
    FORMAT,
    FORMAT_VERSION,
    HEADER,
    SUFFIXES,
    TOKENS,
    Datastore,
    DatastoreBusyError,
    DatastoreError,
    TokenizerIdentity,
    file_digest,
    suffix_dtype,
    token_dtype,
)
from specframe_corpus.sources import Source

CHUNK = 1 << 24  # items per pass when streaming large arrays


def build_datastore(
    out: str | Path,
    sources: list[Source],
    target,
    *,
    append: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Build (or extend, with `append`) the datastore at `out` for `target`'s tokenizer; return its header.

    The existence check, the build and the publish all run under an exclusive lock on `out`, so a second
    build of the same store started meanwhile is refused (`DatastoreBusyError`) instead of silently
    replacing this one's result or losing an append. Leftovers of a killed build are cleaned first.
    """
    start = time.perf_counter()
    identity = TokenizerIdentity.of(target)
    out = Path(out).expanduser().absolute()
    check_writable_dir(out.parent, "directory", "build the datastore in a writable directory (its lock and "
                       "its files are written there)")
    with exclusive(lock_file(out), lambda: _busy(out)):
        recover(out)
        old = _existing(out, identity, append, overwrite)
        try:
            return _build(out, old, sources, target, identity, progress, start)
        except OSError as err:  # a full disk, mostly: the temporary store is gone, the old one kept
            raise DatastoreError(f"building datastore '{out}' failed: "
                                 + io_failure(err, "build it into another --out")) from None


def lock_file(out: Path) -> Path:
    """The lock a build of `out` holds from its existence check to its publish (removed on release)."""
    return out.parent / f".{out.name}.lock"


def _busy(out: Path) -> DatastoreBusyError:
    return DatastoreBusyError(
        f"datastore '{out}' is being built by another process right now (it holds {lock_file(out)}): "
        "wait for that build to finish, then run this one again (with --append to add to its result, "
        "or --overwrite to replace it)"
    )


def _temp_pattern(out: Path, kind: str = "building|old") -> re.Pattern[str]:
    """Names of the temporary directories a build of `out` makes: `.NAME.building-*` (the store being
    written) and `.NAME.old-*` (the previous store, moved aside by `publish`); `kind` picks one."""
    return re.compile("|".join(temp_name_pattern(f".{out.name}.{k}-") for k in kind.split("|")))


def recover(out: Path) -> None:
    """Undo what a killed build of `out` left behind; call it only while holding `lock_file(out)`.

    A build killed between the two renames of `publish` leaves no store at `out` and the previous one in
    `.NAME.old-*/store`: that store is put back. Every other temporary directory of `out` then belongs
    to no live build (a live one would hold the lock) and is removed.
    """
    if not out.exists():
        _restore_previous(out)
    remove_stale(out.parent, _temp_pattern(out), f"temporary directories of datastore '{out}'")


def _restore_previous(out: Path) -> None:
    """Move the newest complete store that a killed `publish` had moved aside back to `out`."""
    pattern = _temp_pattern(out, "old")
    moved = [p / "store" for p in out.parent.iterdir() if pattern.fullmatch(p.name)]
    moved = [p for p in moved if (p / HEADER).is_file()]
    if not moved:
        return
    previous = max(moved, key=lambda p: p.stat().st_mtime)
    previous.rename(out)
    print(
        f"specframe: restored datastore '{out}' from {previous.parent}, where a build killed while "
        "replacing it had moved it",
        file=sys.stderr,
        flush=True,
    )


def _build(
    out: Path,
    old: Datastore | None,
    sources: list[Source],
    target,
    identity: TokenizerIdentity,
    progress: bool,
    start: float,
) -> dict:
    """Write the store (the tokens of `old`, then `sources`) into a temporary directory, check, publish it."""
    dtype, sep = token_dtype(identity.vocab_size), identity.vocab_size
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        stats, tokenize_s = _write_tokens(tmp / TOKENS, old, sources, target, dtype, sep, out, progress)
        if sum(s["documents"] for s in stats) == 0:
            raise DatastoreError(
                f"datastore '{out}': the sources ({', '.join(s.spec for s in sources)}) hold no "
                "documents (empty files, an empty glob match, or only binary files)"
            )
        index_start = time.perf_counter()
        n = _write_index(tmp, dtype, sep)
        index_s = time.perf_counter() - index_start
        new_tokens = sum(s["tokens"] for s in stats)
        build = {
            "seconds": round(time.perf_counter() - start, 2),
            "tokenize_seconds": round(tokenize_s, 2),
            "index_seconds": round(index_s, 2),
            "tokens_per_second": round(new_tokens / tokenize_s) if tokenize_s else None,
            "peak_memory_bytes": peak_memory_bytes("cpu"),
            "appended": old is not None,
        }
        header = _header(tmp, identity, dtype, n, stats, old.header if old is not None else None, build)
        (tmp / HEADER).write_text(json.dumps(header, indent=2) + "\n")
        Datastore.open(tmp, expect=identity)  # never publish a store that does not open
        del old
        follow_umask(tmp)
        publish(tmp, out)
        return header
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_tokens(path: Path, old: Datastore | None, sources: list[Source], target, dtype: np.dtype, sep: int,
                  out: Path, progress: bool) -> tuple[list[dict], float]:
    """Write the token file at `path`: the tokens of `old` (or a first separator), then each source's
    documents; return each source's stats and the seconds the sources took to tokenize."""
    with open(path, "wb") as f:
        if old is not None:
            for s in range(0, len(old.tokens), CHUNK):
                f.write(np.asarray(old.tokens[s : s + CHUNK]).tobytes())
        else:
            f.write(np.array([sep], dtype).tobytes())
        tokenize_start = time.perf_counter()
        stats = [write_source(source, target, f, dtype, sep, out, progress) for source in sources]
        return stats, time.perf_counter() - tokenize_start


def _write_index(tmp: Path, dtype: np.dtype, sep: int) -> int:
    """Index the token file in `tmp`: its suffix array and bucket offsets; return its length in tokens."""
    n = (tmp / TOKENS).stat().st_size // dtype.itemsize
    tokens = np.memmap(tmp / TOKENS, dtype=dtype, mode="r", shape=(n,))
    suffix_array(tokens).tofile(tmp / SUFFIXES)
    bucket_offsets(tokens, sep).tofile(tmp / BUCKETS)
    return n


def _header(tmp: Path, identity: TokenizerIdentity, dtype: np.dtype, n: int, stats: list[dict],
            previous: dict | None, build: dict) -> dict:
    """The header of the store written in `tmp`: its format, tokenizer, sizes (with those of the
    `previous` header it extends), sources, `build` timings and file digests."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "specframe_version": specframe.__version__,
        "tokenizer": identity.to_json(),
        "separator": identity.vocab_size,
        "token_dtype": dtype.name,
        "suffix_dtype": suffix_dtype(n).name,
        "n_positions": n,
        "n_tokens": sum(s["tokens"] for s in stats) + (previous["n_tokens"] if previous else 0),
        "n_documents": sum(s["documents"] for s in stats) + (previous["n_documents"] if previous else 0),
        "sources": (previous["sources"] if previous else []) + stats,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "build": build,
        "files": {
            name: {"bytes": (tmp / name).stat().st_size, "sha256": file_digest(tmp / name)}
            for name in (TOKENS, SUFFIXES, BUCKETS)
        },
    }


def _existing(out: Path, identity: TokenizerIdentity, append: bool, overwrite: bool) -> Datastore | None:
    """The datastore to extend (with `append`), after refusing to clobber anything by accident."""
    if not out.exists():
        return None
    if append:
        return Datastore.open(out, expect=identity)
    if out.is_dir() and not any(out.iterdir()):
        return None
    if overwrite and (out / HEADER).is_file():
        return None
    raise DatastoreError(
        f"'{out}' already exists: pass --append to add to it, --overwrite to replace a "
        "datastore, or choose another --out"
    )


def publish(tmp: Path, out: Path) -> None:
    """Move the finished store into place; an older store is replaced only after the new one is complete.

    The replacement is one atomic swap of the two directories where the system allows it (`exchange`),
    so a reader opening `out` meanwhile finds the old store or the new one, never none. Elsewhere the old
    store is moved aside first; a build killed between the two renames leaves it in `.NAME.old-*`, from
    where the next build puts it back (`recover`).
    """
    if out.exists() and exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old store
    elif out.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        out.rename(trash / "store")
        tmp.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(out)


def write_source(source: Source, target, f, dtype: np.dtype, sep: int, out: Path, progress: bool) -> dict:
    """Tokenize `source` batch by batch and append each document and a separator to `f`."""
    source.prepare(target, out)
    documents = tokens = 0
    closing = np.array([sep], dtype).tobytes()
    with progress_bar(
        total=source.total or None,
        desc=f"tokenizing {source.spec}",
        unit=_unit(source),
        show=progress,
        dynamic_ncols=True,
    ) as bar:
        for batch, done in source.batches():
            for ids in tokenize(target.tokenizer, batch, source.spec):
                if len(ids) == 0:
                    continue
                if ids.min() < 0 or ids.max() >= sep:
                    bad = int(ids.max() if ids.max() >= sep else ids.min())
                    raise DatastoreError(
                        f"datastore source '{source.spec}': token id {bad} is out of range for "
                        f"the target's vocabulary of {sep} ids (a tokenizer/model mismatch?)"
                    )
                f.write(ids.astype(dtype).tobytes())
                f.write(closing)
                documents += 1
                tokens += len(ids)
            bar.update(done - bar.n)
            bar.set_postfix(tokens=f"{tokens:,}", refresh=False)
    return {**source.describe(), "documents": documents, "tokens": tokens}


def _unit(source: Source) -> str:
    return {"jsonl": "line", "model-answers": "doc"}.get(source.kind, "file")


def tokenize(tokenizer, batch: list, spec: str) -> list[np.ndarray]:
    """Token ids of every document of `batch`: text goes through the tokenizer (the fast backend encodes a
    batch on all cores), id arrays pass through."""
    texts = [d for d in batch if isinstance(d, str)]
    if not texts:
        return [np.asarray(d, dtype=np.int64) for d in batch]
    if tokenizer is None:
        raise DatastoreError(
            f"datastore source '{spec}' is text, but the target has no tokenizer: pass token ids instead"
        )
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        encoded = iter([np.asarray(e.ids, dtype=np.int64) for e in encode(texts, add_special_tokens=False)])
    else:
        encoded = iter(
            [
                np.asarray(ids, dtype=np.int64)
                for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]
            ]
        )
    return [next(encoded) if isinstance(d, str) else np.asarray(d, dtype=np.int64) for d in batch]


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """(n,) suffix array of `tokens[::-1]`, computed with libdivsufsort.

    libdivsufsort sorts bytes; the tokens are laid out big-endian so that byte order equals token order,
    and only the suffixes starting at a token boundary are kept (filtered in chunks to bound memory).
    """
    from pydivsufsort import divsufsort

    width = tokens.dtype.itemsize
    big_endian = np.ascontiguousarray(tokens[::-1]).astype(tokens.dtype.newbyteorder(">"))  # (n,)
    byte_sa = divsufsort(big_endian.view(np.uint8))  # (n * width,) every byte suffix
    del big_endian
    result = np.empty(len(tokens), suffix_dtype(len(tokens)))
    filled = 0
    for s in range(0, len(byte_sa), CHUNK):
        chunk = byte_sa[s : s + CHUNK]
        aligned = chunk[chunk % width == 0] // width
        result[filled : filled + len(aligned)] = aligned
        filled += len(aligned)
    assert filled == len(tokens), "libdivsufsort returned a malformed suffix array"
    return result


def bucket_offsets(tokens: np.ndarray, sep: int) -> np.ndarray:
    """(sep + 2,) int64: the suffix-array range of suffixes whose first token is t is [b[t], b[t + 1])."""
    counts = np.zeros(sep + 1, np.int64)
    for s in range(0, len(tokens), CHUNK):
        counts += np.bincount(tokens[s : s + CHUNK], minlength=sep + 1)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
