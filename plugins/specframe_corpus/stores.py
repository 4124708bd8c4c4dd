"""Named datastores: where they live, which one a drafter uses, and each opened once per process.

Every drafter that reads a datastore (`rest`, `suffix(corpus=...)`) and every tool that writes one
(`specframe datastore build`, s4c's training data) finds it here: a bare name means a directory in
`datastore_home()`, and `open_datastore` checks the store against the target's tokenizer before use.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

from specframe.kit.files import specframe_home
from specframe_corpus.datastore import HEADER, Datastore, TokenizerIdentity, read_header
from specframe_corpus.retrieval import SuffixIndex
from specframe_corpus.shards import ShardedDatastore, ShardedIndex, index_of, open_store, version_file

ENV_DATASTORE = "SPECFRAME_DATASTORE"
DEFAULT_DATASTORE = "python-site"  # used when neither the option nor the environment names one, if built
_opened: dict[tuple[str, int], tuple] = {}  # (path, header or manifest mtime) -> (store, index)
_identities: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> identity


def datastore_home() -> Path:
    """Where named datastores live: `$SPECFRAME_HOME/datastores` (default ~/.cache/specframe/datastores)."""
    return specframe_home() / "datastores"


def resolve_datastore(value: str | os.PathLike | None, target=None) -> Path | None:
    """A datastore path from an option, else `$SPECFRAME_DATASTORE`; a bare name means one in
    `datastore_home()`. Without either, the `python-site` store in `datastore_home()` if it was built for
    `target`'s tokenizer (a default store for another model is not an error: it is just not a default)."""
    value = value if value else os.environ.get(ENV_DATASTORE)
    if not value:
        default = datastore_home() / DEFAULT_DATASTORE
        if target is None or not (default / HEADER).is_file():
            return None
        built_for = TokenizerIdentity(**read_header(default)["tokenizer"])
        return default if built_for.matches(target_identity(target)) else None
    path = Path(value).expanduser()
    named = datastore_home() / str(value)
    if not path.exists() and os.sep not in str(value) and named.exists():
        return named
    return path


def open_datastore(
    path: Path, target
) -> tuple[Datastore | ShardedDatastore, SuffixIndex | ShardedIndex]:
    """Open (once per process and file version) and check `path`, a datastore or a sharded one (see
    `shards.py`), against `target`'s tokenizer."""
    header = version_file(path)
    key = (str(header.absolute()), header.stat().st_mtime_ns if header.is_file() else 0)
    identity = target_identity(target)
    if key not in _opened:
        store = open_store(path, expect=identity)
        _opened[key] = (store, index_of(store))
    store, index = _opened[key]
    Datastore.check_identity(store.path, store.identity, identity)
    return store, index


def target_identity(target) -> TokenizerIdentity:
    """`target`'s tokenizer identity, computed once per tokenizer (it hashes the whole vocabulary)."""
    tokenizer = target.tokenizer
    if tokenizer is None:
        return TokenizerIdentity.of(target)
    cached = _identities.get(tokenizer)
    if cached is None or cached.vocab_size != target.vocab_size:
        cached = _identities[tokenizer] = TokenizerIdentity.of(target)
    return cached
