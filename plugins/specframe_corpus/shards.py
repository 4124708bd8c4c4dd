"""Sharded datastores: ordinary datastores (the shards) behind one manifest, opened and searched as one.

Layout of a sharded datastore directory::

    manifest.json   format and version, tokenizer identity, totals, and the shards in corpus order
    shard-00000/    an ordinary datastore (see `datastore.py`), written by the same builder
    shard-00001/    ...

Documents are never split across shards, and every shard separates its documents with SEP like any
datastore, so no match spans two documents, hence none spans two shards: a sharded store and one store
over the same documents find the same matches.

Retrieval asks every shard for its longest match and merges: the longest match length wins, and the
shards that match at that length contribute their continuations. When all of those continue from at most
`k` occurrences, every one is used, as one store uses them, and the drafter's trie is exactly that of one
store. Past `k` both draw a spread sample of `k` occurrences of the same match, but not the same sample:
one store spreads it over its suffix-array interval (ordered by the text before each match, across
document boundaries); a sharded store gives each shard a share of `k` in proportion to its occurrences
and spreads it over that shard's sample.

Positions are global: position p of shard i is `offsets[i] + p` in the concatenation of the shards'
token arrays, so a `Match` names its shard without a second array.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from specframe.kit.files import current_umask, read_json
from specframe_corpus.datastore import (
    HEADER, Datastore, DatastoreError, TokenizerIdentity, file_digest, parse_identity,
)
from specframe_corpus.retrieval import NO_MATCH, Match, SuffixIndex, spread

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "specframe-rest-sharded-datastore"
MANIFEST_VERSION = 1
REBUILD_HINT = (
    "rebuild the whole store with `specframe datastore build --model MODEL --source SOURCE --shards N "
    "--overwrite --out {path}` (a shard cannot be rebuilt alone: its documents are not recorded)"
)


class ShardError(DatastoreError):
    """A sharded datastore's manifest or one of its shards is missing, corrupt, or does not match."""


def shard_name(index: int) -> str:
    """The directory name of the shard at `index` in corpus order."""
    return f"shard-{index:05d}"


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether `path` holds a sharded datastore (a manifest) rather than a single one."""
    return (Path(path).expanduser() / MANIFEST).is_file()


def version_file(path: str | os.PathLike) -> Path:
    """The file rewritten whenever the store at `path` changes: its manifest, else its header."""
    path = Path(path).expanduser()
    return path / MANIFEST if (path / MANIFEST).is_file() else path / HEADER


def open_store(
    path: str | os.PathLike, expect: TokenizerIdentity | None = None
) -> Datastore | ShardedDatastore:
    """Open the datastore at `path`, sharded (it has a manifest) or single; with `expect`, refuse one built
    for another tokenizer."""
    return ShardedDatastore.open(path, expect) if is_sharded(path) else Datastore.open(path, expect)


def index_of(store: Datastore | ShardedDatastore) -> SuffixIndex | ShardedIndex:
    """The longest-match index of an opened store: both kinds answer the same queries."""
    if isinstance(store, ShardedDatastore):
        return ShardedIndex([SuffixIndex.of(shard) for shard in store.shards])
    return SuffixIndex.of(store)


class ShardedDatastore:
    """An opened sharded datastore: its manifest (also as `header`, for code reading the totals) and its
    shards, each an opened, checked, memory-mapped `Datastore`.

    Opening checks that every shard exists, opens cleanly, was built for the manifest's tokenizer and is
    the very store the manifest recorded (the digest of its header), so a shard that is missing, damaged
    or replaced fails here, naming its directory, rather than later with wrong drafts.
    """

    def __init__(self, path: Path, manifest: dict, shards: list[Datastore]):
        self.path, self.manifest, self.header, self.shards = path, manifest, manifest, shards
        self.identity = TokenizerIdentity(**manifest["tokenizer"])
        self.separator = self.identity.vocab_size

    def __len__(self) -> int:
        return sum(len(shard) for shard in self.shards)

    @classmethod
    def open(cls, path: str | os.PathLike, expect: TokenizerIdentity | None = None) -> ShardedDatastore:
        """Open and check the sharded store at `path`; with `expect`, refuse one built for another
        tokenizer."""
        path = Path(path).expanduser()
        manifest = read_manifest(path)
        identity = TokenizerIdentity(**manifest["tokenizer"])
        if expect is not None:
            Datastore.check_identity(path, identity, expect)
        return cls(path, manifest, [open_shard(path, entry, identity) for entry in manifest["shards"]])

    def verify(self) -> None:
        """Compare every file of every shard with the digest recorded at build time (reads everything)."""
        for shard in self.shards:
            try:
                shard.verify()
            except DatastoreError as err:
                raise shard_error(self.path, shard.path.name, str(err)) from None

    def describe(self) -> dict:
        """The manifest plus the fields `specframe datastore info` prints for any datastore."""
        shards = [shard.describe() for shard in self.shards]
        on_disk = sum(s["bytes_on_disk"] for s in shards) + (self.path / MANIFEST).stat().st_size
        builds = self.manifest["builds"]
        return {
            **self.manifest,
            "path": str(self.path),
            "token_dtype": shards[0]["token_dtype"],
            "sources": [source for s in shards for source in s["sources"]],
            "built_at": builds[-1].get("built_at") if builds else None,
            "build": {"seconds": round(sum(b.get("seconds", 0) for b in builds), 2)},
            "bytes_on_disk": on_disk,
            "bytes_per_token": on_disk / self.manifest["n_tokens"],
        }


def open_shard(path: Path, entry: dict, identity: TokenizerIdentity) -> Datastore:
    """Open the shard the manifest entry `entry` names, refusing one that is not the store recorded."""
    name = entry["name"]
    try:
        shard = Datastore.open(path / name, expect=identity)
    except DatastoreError as err:
        raise shard_error(path, name, str(err)) from None
    digest = file_digest(path / name / HEADER)
    if digest != entry["header_sha256"]:
        raise shard_error(
            path, name, f"its {HEADER} is not the one {MANIFEST} recorded: the shard was rebuilt or "
            "replaced after the manifest was written"
        )
    if any(shard.header[key] != entry[key] for key in ("n_tokens", "n_documents")):
        raise shard_error(path, name, f"its counts differ from those {MANIFEST} records for it")
    return shard


def shard_error(path: Path, name: str, problem: str) -> ShardError:
    """The error for an unusable shard: which one, what is wrong (the shard's own message, less its advice
    to rebuild that datastore alone), and how to fix it."""
    problem = SINGLE_STORE_HINT.sub("", problem)
    return ShardError(
        f"sharded datastore '{path}': shard '{path / name}' is unusable: {problem}. To fix it, "
        + REBUILD_HINT.format(path=path)
    )


SINGLE_STORE_HINT = re.compile(r"[;:,]? (?:upgrade specframe, or )?(?:re)?build (?:it|one) with "
                               r"`specframe datastore build [^`]*`.*$", re.S)


MANIFEST_TYPES = {"tokenizer": dict, "n_tokens": int, "n_documents": int, "shards": list, "builds": list}
SHARD_TYPES = {"name": str, "n_tokens": int, "n_documents": int, "header_sha256": str}


def read_manifest(path: Path) -> dict:
    """The parsed, version-checked manifest of the sharded store at `path`."""
    file = path / MANIFEST
    hint = REBUILD_HINT.format(path=path)
    try:
        manifest = read_json(file, hint, ShardError, where=f"sharded datastore '{path}': {MANIFEST}")
    except FileNotFoundError:
        raise ShardError(f"no sharded datastore at '{path}' ({MANIFEST} is missing); {hint}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ShardError(f"'{file}' is not a specframe sharded datastore manifest (no \"format\": "
                         f"\"{MANIFEST_FORMAT}\")")
    version = manifest.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= MANIFEST_VERSION:
        raise ShardError(
            f"sharded datastore '{path}' has manifest version {version!r}; this specframe reads versions "
            f"1 to {MANIFEST_VERSION}: upgrade specframe, or {hint}"
        )
    _check_fields(path, manifest, MANIFEST_TYPES, "")
    if parse_identity(manifest["tokenizer"]) is None:
        raise ShardError(f"sharded datastore '{path}': {MANIFEST} field \"tokenizer\" is "
                         f"{manifest['tokenizer']!r}, expected an object of name, fingerprint and "
                         f"vocab_size; the manifest is corrupt, {hint}")
    for i, build in enumerate(manifest["builds"]):
        if not isinstance(build, dict) or not isinstance(build.get("seconds", 0), (int, float)):
            raise ShardError(f"sharded datastore '{path}': {MANIFEST} field \"builds[{i}]\" is {build!r}, "
                             f"expected an object with the build's seconds; the manifest is corrupt, {hint}")
    for i, entry in enumerate(manifest["shards"]):
        _check_fields(path, entry, SHARD_TYPES, f"shards[{i}].")
        if entry["name"] != shard_name(i):  # never a path out of the store
            raise ShardError(f"sharded datastore '{path}': {MANIFEST} field \"shards[{i}].name\" is "
                             f"{entry['name']!r}, expected {shard_name(i)!r}; the manifest is corrupt, "
                             f"{hint}")
    if not manifest["shards"]:
        raise ShardError(f"sharded datastore '{path}': {MANIFEST} lists no shards; {hint}")
    counted = {key: sum(s[key] for s in manifest["shards"]) for key in ("n_tokens", "n_documents")}
    if any(counted[key] != manifest[key] for key in counted):
        raise ShardError(f"sharded datastore '{path}': the shard counts in {MANIFEST} do not add up to its "
                         f"totals; the manifest is corrupt, {hint}")
    return manifest


def _check_fields(path: Path, record: object, types: dict, prefix: str) -> None:
    """Refuse a manifest (or shard entry) lacking a field or holding one of the wrong type, by name."""
    for key, kind in types.items():
        value = record.get(key) if isinstance(record, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise ShardError(
                f"sharded datastore '{path}': {MANIFEST} field \"{prefix}{key}\" is {value!r}, expected "
                f"{'an integer >= 0' if kind is int else kind.__name__}; the manifest is corrupt, "
                + REBUILD_HINT.format(path=path)
            )


def write_manifest(path: Path, manifest: dict) -> None:
    """Replace `path`'s manifest atomically: readers see the old one or the new one, never a mix."""
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", dir=path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(manifest, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path / MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ShardedIndex:
    """Longest-suffix-match queries over several shards, answering as one `SuffixIndex` over them all."""

    def __init__(self, indexes: list[SuffixIndex]):
        self.indexes = indexes
        self.offsets = np.cumsum([0] + [index.n for index in indexes])  # (S + 1,) first global position
        self.n = int(self.offsets[-1])
        self.separator = indexes[0].separator

    def longest_match(self, query: np.ndarray, n_max: int, k: int) -> Match:
        """The longest match over all shards, with up to `k` continuation starts (see the module doc)."""
        return merge_matches([index.longest_match(query, n_max, k) for index in self.indexes],
                             self.offsets[:-1], k)

    def continuations(self, starts: np.ndarray, m: int) -> np.ndarray:
        """(len(starts), m) int64: the m tokens from each global start, PAD from its document's end on."""
        shard = np.searchsorted(self.offsets, starts, side="right") - 1  # (S,)
        rows = np.empty((len(starts), m), np.int64)  # (S, m)
        for i in np.unique(shard):
            mine = shard == i
            rows[mine] = self.indexes[i].continuations(starts[mine] - self.offsets[i], m)
        return rows


def merge_matches(matches: list[Match], offsets: np.ndarray, k: int) -> Match:
    """One match from every shard's: the longest length wins; the shards matching at that length give
    all their continuation starts if there are at most `k` in all, else shares of `k` by occurrences."""
    length = max(match.length for match in matches)
    if length == 0:
        return NO_MATCH
    best = [(match, int(offset)) for match, offset in zip(matches, offsets) if match.length == length]
    counts = np.array([match.count for match, _ in best])  # (B,) occurrences per shard
    if sum(len(match.starts) for match, _ in best) <= k:
        quotas = [len(match.starts) for match, _ in best]
    else:
        quotas = shares(k, counts)
    starts = [offset + spread(match.starts, quota) for (match, offset), quota in zip(best, quotas) if quota]
    return Match(length, int(counts.sum()), np.concatenate(starts))


def shares(k: int, counts: np.ndarray) -> list[int]:
    """`k` split in proportion to `counts` (largest remainders, ties to the earlier shard); sums to `k`."""
    exact = k * counts / counts.sum()  # (B,)
    quotas = np.floor(exact).astype(np.int64)
    extra = np.argsort(-(exact - quotas), kind="stable")[: k - int(quotas.sum())]
    quotas[extra] += 1
    return quotas.tolist()
