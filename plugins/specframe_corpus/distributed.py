"""Building a sharded datastore: split the sources along documents, build every shard, publish a manifest.

The sources are cut into `shards` contiguous parts of about equal size in bytes (or tokens), at unit
boundaries: a file, a JSONL line or a token document, each holding whole documents, so no document is
split. Each part is built by the single-store builder (`build.build_datastore`) into its own checked,
atomically written shard directory: one after another in this process, or in parallel as Ray tasks with
`ray="local"` (a Ray instance started on this machine) or `ray=ADDRESS` (a running cluster, whose
workers must see the output directory at the same path). Ray is optional and imported only then.

A new store is built in a temporary directory beside `out` and renamed into place once its manifest is
written and it opens cleanly; `append=True` builds only the new shards, inside the existing store, and
then replaces the manifest atomically, so readers see the old store or the new one, never a mix.
"""

from __future__ import annotations

import itertools
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import specframe
from specframe.kit.files import (
    check_writable_dir, exclusive, follow_umask, io_failure, remove_stale, temp_name_pattern,
)
from specframe.kit.progress import Bar, bar as progress_bar
from specframe.kit.ray import check_ray_cpus, import_ray, ray_session
from specframe_corpus.build import build_datastore, lock_file, publish, recover
from specframe_corpus.datastore import (
    HEADER,
    DatastoreBusyError,
    DatastoreError,
    TokenizerIdentity,
    file_digest,
)
from specframe_corpus.shards import (
    MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    ShardedDatastore,
    ShardError,
    is_sharded,
    open_shard,
    shard_name,
    write_manifest,
)
from specframe_corpus.sources import (
    JsonlTexts,
    Source,
    TextFiles,
    TokenDocuments,
    decode_line,
)

SHARD_FIELDS = ("name", "n_tokens", "n_documents", "header_sha256")  # a manifest's entry for each shard


def check_ray_options(ray: str | None, ray_cpus: int | None) -> None:
    """Refuse `--ray-cpus` where it means nothing (without `--ray local`) or cannot work (below 1: the
    shard tasks, one CPU each, would wait forever)."""
    if ray_cpus is not None and ray != "local":
        raise DatastoreError(f"--ray-cpus {ray_cpus} sets the CPUs of a Ray instance started here: add "
                             "--ray local, or leave --ray-cpus out (a cluster has its own CPUs)")
    check_ray_cpus(ray_cpus)


def build_sharded_datastore(
    out: str | Path,
    sources: list[Source],
    target,
    *,
    shards: int,
    ray: str | None = None,
    ray_cpus: int | None = None,
    append: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Build the sharded store at `out` from `sources` in `shards` shards (with `append`: add `shards` new
    shards to the existing store); return its manifest. `ray`: None builds in this process, "local" on a
    Ray instance started here (`ray_cpus` CPUs, default all), else on the Ray cluster at that address.

    Like `build_datastore`, the whole check-build-publish sequence holds an exclusive lock on `out`.
    """
    start = time.perf_counter()
    if shards < 1:
        raise DatastoreError(f"datastore '{out}': --shards must be at least 1, got {shards}")
    check_ray_options(ray, ray_cpus)
    identity = TokenizerIdentity.of(target)
    out = Path(out).expanduser().absolute()
    parts = split_sources(sources, shards)
    check_writable_dir(out.parent, "directory", "build the datastore in a writable directory (its lock and "
                       "its files are written there)")
    with exclusive(lock_file(out), lambda: busy(out)):
        restore_previous(out)
        recover(out)
        previous = existing_manifest(out, identity, append, overwrite)
        build = Build(parts, target, identity, ray, ray_cpus, progress, start, [s.spec for s in sources])
        try:
            return build.extend(out, previous) if previous else build.create(out)
        except OSError as err:  # a full disk, mostly (a shard's own build names its failure itself)
            raise DatastoreError(f"building datastore '{out}' failed: "
                                 + io_failure(err, "build it into another --out")) from None


def busy(out: Path) -> DatastoreBusyError:
    return DatastoreBusyError(
        f"datastore '{out}' is being built by another process right now (it holds {lock_file(out)}): "
        "wait for that build to finish, then run this one again"
    )


@dataclass
class Build:
    """One build or append: the parts to build as shards, how, and the record it leaves in the manifest."""

    parts: list[list[Source]]
    target: object
    identity: TokenizerIdentity
    ray: str | None
    ray_cpus: int | None
    progress: bool
    start: float
    specs: list[str]

    def create(self, out: Path) -> dict:
        """Build every shard and the manifest in a temporary directory, check the store, publish it."""
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
        try:
            manifest = self.manifest(None, self.build_shards(tmp, 0))
            write_manifest(tmp, manifest)
            ShardedDatastore.open(tmp, expect=self.identity)  # never publish a store that does not open
            follow_umask(tmp)
            publish(tmp, out)
            return manifest
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def extend(self, out: Path, previous: dict) -> dict:
        """Build the new shards inside `out`, check them, then replace the manifest atomically."""
        remove_unlisted_shards(out, previous)
        first = len(previous["shards"])
        try:
            results = self.build_shards(out, first)
            for result in results:
                open_shard(out, result, self.identity)
        except BaseException:
            remove_unlisted_shards(out, previous)  # what this append built, and what a killed shard left
            raise
        manifest = self.manifest(previous, results)
        write_manifest(out, manifest)
        return manifest

    def build_shards(self, root: Path, first: int) -> list[dict]:
        """Build part i into `root/shard-(first + i)`; one result (`build_shard`) per part, in order."""
        jobs = [(root / shard_name(first + i), part) for i, part in enumerate(self.parts)]
        with progress_bar(total=len(jobs), desc=f"building {len(jobs)} shards", unit="shard",
                          show=self.progress, dynamic_ncols=True) as bar:
            if self.ray is None:
                return [finished(bar, build_shard(path, part, self.target)) for path, part in jobs]
            return build_on_ray(jobs, TokenizerTarget.of(self.target), self.ray, self.ray_cpus, bar)

    def manifest(self, previous: dict | None, results: list[dict]) -> dict:
        """The manifest listing `previous`'s shards and then the new ones, with a record of this build."""
        shards = (previous["shards"] if previous else []) + [{k: r[k] for k in SHARD_FIELDS} for r in results]
        seconds = time.perf_counter() - self.start
        record = {
            "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "appended": previous is not None,
            "executor": "in-process" if self.ray is None else f"ray {self.ray}",
            "sources": self.specs,
            "seconds": round(seconds, 2),
            "tokens_per_second": round(sum(r["n_tokens"] for r in results) / seconds),
            "shards": [{k: r[k] for k in ("name", "seconds", "peak_memory_bytes")} for r in results],
        }
        return {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "specframe_version": specframe.__version__,
            "tokenizer": self.identity.to_json(),
            "n_tokens": sum(s["n_tokens"] for s in shards),
            "n_documents": sum(s["n_documents"] for s in shards),
            "shards": shards,
            "builds": (previous["builds"] if previous else []) + [record],
        }


def finished(bar: Bar, result: dict) -> dict:
    """Count one finished shard on the progress bar."""
    bar.update(1)
    bar.set_postfix(last=result["name"], tokens=f"{result['n_tokens']:,}")
    return result


def build_shard(out: Path, sources: list[Source], target) -> dict:
    """Build one shard with the single-store builder; its manifest entry plus the build's time and the
    peak resident memory of the process that built it (a Ray task's own worker process)."""
    header = build_datastore(out, sources, target, progress=False)
    return {
        "name": out.name,
        "n_tokens": header["n_tokens"],
        "n_documents": header["n_documents"],
        "header_sha256": file_digest(out / HEADER),
        "seconds": header["build"]["seconds"],
        "peak_memory_bytes": header["build"]["peak_memory_bytes"],
    }


def existing_manifest(out: Path, identity: TokenizerIdentity, append: bool, overwrite: bool) -> dict | None:
    """The manifest to extend (with `append`), after refusing to clobber anything by accident."""
    if not out.exists():
        return None
    if append:
        if not is_sharded(out):
            raise ShardError(
                f"'{out}' is not a sharded datastore (it has no {MANIFEST}): --append with --shards adds "
                "shards to a sharded store; append to a single store without --shards"
            )
        return ShardedDatastore.open(out, expect=identity).manifest  # every existing shard must be sound
    if out.is_dir() and not any(out.iterdir()):
        return None
    if overwrite and (is_sharded(out) or (out / HEADER).is_file()):
        return None
    raise DatastoreError(
        f"'{out}' already exists: pass --append to add shards to it, --overwrite to replace a "
        "datastore, or choose another --out"
    )


def restore_previous(out: Path) -> None:
    """Put back a sharded store that a build killed while replacing it (between the two renames of
    `publish`) had moved aside; `recover` does this for single stores and removes the rest."""
    if out.exists():
        return
    pattern = re.compile(temp_name_pattern(f".{out.name}.old-"))
    moved = [p / "store" for p in out.parent.iterdir() if pattern.fullmatch(p.name)]
    moved = [p for p in moved if is_sharded(p)]
    if moved:
        previous = max(moved, key=lambda p: p.stat().st_mtime)
        previous.rename(out)
        print(f"specframe: restored sharded datastore '{out}' from {previous.parent}, where a build killed "
              "while replacing it had moved it", file=sys.stderr, flush=True)


def remove_unlisted_shards(out: Path, manifest: dict) -> None:
    """Remove shard directories the manifest does not list, and temporary directories and lock files of
    shards: an append that failed or was killed left them (we hold the store's lock, so no live build
    owns them)."""
    listed = "|".join(re.escape(entry["name"]) for entry in manifest["shards"])
    pattern = re.compile(rf"(?!(?:{listed})$)shard-\d+|\.shard-\d+\.(?:(?:building|old)-[a-z0-9_]+|lock)")
    remove_stale(out, pattern, f"unlisted shards of sharded datastore '{out}'")


@dataclass(frozen=True)
class TokenizerTarget:
    """What a shard build uses of a target: its name, tokenizer and vocabulary size (the tokenizer's
    identity, and the tokenizing). Ray tasks get this instead of the model."""

    name: str
    tokenizer: object
    vocab_size: int

    @classmethod
    def of(cls, target) -> TokenizerTarget:
        return cls(target.name, target.tokenizer, target.vocab_size)


def build_on_ray(jobs: list[tuple[Path, list[Source]]], target: TokenizerTarget, address: str,
                 num_cpus: int | None, bar: Bar) -> list[dict]:
    """Build every (directory, sources) job as a Ray task; results in job order, counted as they finish.

    Each task runs in a fresh worker process (`max_calls=1`), so the peak memory it reports is its own.
    At most as many tasks as the cluster has CPUs are in flight. A failed shard stops the submitting; the
    shards already running finish, and then the failed shard's own error is raised. Nothing is cancelled:
    cancelling a task as it finishes can abort Ray's driver (a race in Ray's task manager, "Check failed:
    it != submissible_tasks_.end()", seen with Ray 2.60), and that would lose the error with the process.
    """
    ray = import_ray(DatastoreError, "build without --ray (the shards are then built one after another in "
                                     "this process)")
    with ray_session(ray, address, num_cpus):
        task = ray.remote(num_cpus=1, max_calls=1)(build_shard)
        shared = ray.put(target)
        window = max(1, int(ray.cluster_resources().get("CPU", 1)))
        waiting = iter(enumerate(jobs))
        pending: dict = {}  # in flight: task reference -> job index
        results: list[dict] = [{}] * len(jobs)
        failure: Exception | None = None
        try:
            while True:
                if failure is None:
                    for index, (path, part) in itertools.islice(waiting, window - len(pending)):
                        pending[task.remote(path, part, shared)] = index
                if not pending:
                    break
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                index = pending.pop(ref)
                try:
                    results[index] = finished(bar, ray.get(ref))
                except ray.exceptions.RayError as err:
                    failure = failure or err
        finally:
            if pending:  # interrupted: let the running workers finish before the caller removes their output
                ray.wait(list(pending), num_returns=len(pending), timeout=60)
        if failure is not None:
            cause = getattr(failure, "cause", None)
            if isinstance(cause, DatastoreError):
                raise cause from None  # the shard's own message, without the worker's traceback
            raise failure
        return results


@dataclass
class Units:
    """A source as a sequence of units that each hold whole documents (files, JSONL lines, token
    documents): the size of each, and how to make the source of units [a, b)."""

    sizes: np.ndarray  # (U,) bytes (files, lines) or tokens (documents)
    part: Callable[[int, int], Source]


def split_sources(sources: list[Source], n: int) -> list[list[Source]]:
    """The sources cut into `n` contiguous parts of about equal size, at unit boundaries, in order."""
    units = [units_of(source) for source in sources]
    sizes = np.concatenate([u.sizes for u in units])  # (U,)
    if len(sizes) < n:
        names = ", ".join(s.spec for s in sources)
        raise DatastoreError(
            f"cannot split {len(sizes)} files, JSONL lines or documents ({names}) into {n} shards: a "
            f"shard holds whole documents; use --shards {max(len(sizes), 1)} or fewer"
        )
    bounds = cut_points(sizes, n)
    firsts = np.cumsum([0] + [len(u.sizes) for u in units]).tolist()  # first unit of each source, then U
    return [
        [u.part(max(a, lo) - lo, min(b, hi) - lo)
         for u, lo, hi in zip(units, firsts[:-1], firsts[1:]) if max(a, lo) < min(b, hi)]
        for a, b in zip(bounds[:-1], bounds[1:])
    ]


def cut_points(sizes: np.ndarray, n: int) -> list[int]:
    """Bounds 0 = b_0 < b_1 < ... < b_n = len(sizes) cutting `sizes` into `n` contiguous, non-empty
    groups whose sums are about equal (each cut just after the unit crossing its share of the total)."""
    cum = np.cumsum(np.maximum(sizes, 1))  # (U,) an empty unit still counts a little
    bounds = [0]
    for j in range(1, n):
        want = int(np.searchsorted(cum, cum[-1] * j / n)) + 1
        bounds.append(min(max(want, bounds[-1] + 1), len(sizes) - (n - j)))
    return bounds + [len(sizes)]


def units_of(source: Source) -> Units:
    """The units of a source whose documents are known before building; others cannot be split."""
    spec, kind = source.spec, source.kind
    if isinstance(source, TextFiles):
        files = source.files
        return Units(np.array([file_size(f) for f in files], np.int64), lambda a, b: TextFiles(
            spec, kind, b - a, part_meta(source, a, b, files=b - a), files[a:b]))
    if isinstance(source, TokenDocuments):
        docs = source.documents
        return Units(np.array([len(d) for d in docs], np.int64), lambda a, b: TokenDocuments(
            spec, kind, b - a, part_meta(source, a, b), docs[a:b]))
    if isinstance(source, JsonlTexts):
        offsets = line_offsets(source.path)  # (lines + 1,)
        return Units(np.diff(offsets), lambda a, b: JsonlLines(
            spec, kind, b - a, part_meta(source, a, b), source.path, source.field_name, int(offsets[a]), a))
    raise DatastoreError(
        f"datastore source '{source.spec}' ({source.kind}) cannot be split into shards: its documents "
        "are only known while building; build it into a store of its own, without --shards"
    )


def part_meta(source: Source, a: int, b: int, **changes) -> dict:
    """What a shard's header records of the part [a, b) of `source`: the source's own description, the
    range of its units (files, lines or documents) and the counts that change."""
    return {**source.meta, **changes, "part": [a, b]}


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # unreadable: the builder skips it


def line_offsets(path: Path, chunk: int = 1 << 24) -> np.ndarray:
    """(lines + 1,) int64: the byte offset where every line of `path` starts, then the file's size."""
    starts, size = [np.zeros(1, np.int64)], 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            starts.append(size + np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n")) + 1)
            size += len(block)
    offsets = np.concatenate(starts)
    return offsets if offsets[-1] == size else np.append(offsets, size)  # a last line without "\n"


@dataclass
class JsonlLines(JsonlTexts):
    """`total` lines of a JSONL file from byte `offset`, the first being line `first + 1` of the file
    (error messages give line numbers of the whole file)."""

    offset: int = 0
    first: int = 0

    def numbered_lines(self) -> Iterator[tuple[int, str]]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            for done in range(1, self.total + 1):
                yield self.first + done, decode_line(f.readline(), self.path, self.first + done)
