"""`rest`: retrieval-based drafting (He et al., 2023) from a datastore, optionally merged with the live
context.

Each step: find the longest suffix of the text (up to `n_max` tokens) in the datastore, take the next
`m` tokens after up to `k` of its occurrences spread over all of them, merge them into a frequency trie
and propose its best `c` nodes. With `live > 0` the prompt and the text generated so far are a second
source (as prompt lookup uses them), merged into the same trie with that weight: each source's
continuations share a total weight of 1 (the datastore) or `live` (the context). No match proposes
nothing, so the step decodes one token; REST's published code drafts a fixed token instead.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np

from specframe import ConfigurationError, DraftContext, Drafter, DrafterCapabilities, DraftProposal, ScoreKind
from specframe.runtime.load import specframe_home
from specframe_rest.datastore import HEADER, Datastore, TokenizerIdentity, read_header
from specframe_rest.retrieval import SuffixIndex, build_trie, context_continuations, top_nodes
from specframe_rest.shards import ShardedDatastore, ShardedIndex, index_of, open_store, version_file

ENV_DATASTORE = "SPECFRAME_DATASTORE"
DEFAULT_DATASTORE = "python-site"  # used when neither the option nor the environment names one, if built
_opened: dict[tuple[str, int], tuple] = {}  # (path, header or manifest mtime) -> (store, index)
_identities: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> identity
MATCH_GROUPS = np.array([2, 4, 8])  # match lengths 1-2, 3-4, 5-8, 9+ -> groups 0, 1, 2, 3


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
    tokenizer = target.tokenizer
    if tokenizer is None:
        return TokenizerIdentity.of(target)
    cached = _identities.get(tokenizer)
    if cached is None or cached.vocab_size != target.vocab_size:
        cached = _identities[tokenizer] = TokenizerIdentity.of(target)
    return cached


class RestDrafter(Drafter):
    """Options: `datastore` (a directory or a name in `datastore_home()`; default `$SPECFRAME_DATASTORE`,
    else `python-site` if built for the target),
    `c` (nodes proposed, default the step's budget), `k` (matches sampled), `m` (continuation length),
    `n_max` (longest suffix tried), `live` (weight of the context as a second source; 0 = off),
    `live_k` (context matches used) and `by_length` (scale each source's weight by its match length)."""

    name = "rest"
    capabilities = DrafterCapabilities(proposes_trees=True, score_kind=ScoreKind.FREQUENCY)

    def __init__(
        self,
        target,
        *,
        datastore: str | None = None,
        c: int | None = None,
        k: int = 256,
        m: int = 10,
        n_max: int = 16,
        live: float = 0.0,
        live_k: int = 8,
        by_length: bool = False,
    ):
        super().__init__(target)
        live = float(live)
        if min(k, m, n_max, live_k) < 1 or (c is not None and c < 1) or live < 0:
            raise ConfigurationError(
                f"rest: need c, k, m, n_max, live_k >= 1 and live >= 0; got c={c}, k={k}, "
                f"m={m}, n_max={n_max}, live={live}, live_k={live_k}"
            )
        path = resolve_datastore(datastore, target)
        if path is None and live == 0:
            raise ConfigurationError(
                "rest needs a datastore: rest(datastore=DIR), or set $SPECFRAME_DATASTORE, or build the "
                "default one with `specframe datastore build --model MODEL --source python-site --out "
                "python-site`; or use only the live context with rest(live=1)"
            )
        self.store, self.index = open_datastore(path, target) if path is not None else (None, None)
        self.c, self.k, self.m, self.n_max, self.live, self.live_k = c, k, m, n_max, live, live_k
        self.by_length = bool(by_length)
        self.last_match_length = 0  # longest datastore match of the latest step, for diagnostics

    @classmethod
    def example_options(cls, target, workdir: str) -> dict:
        """A small datastore built in `workdir` (see `examples.py`)."""
        from specframe_rest.examples import example_datastore

        return {"datastore": str(example_datastore(target, Path(workdir)))}

    def propose(self, context: DraftContext) -> DraftProposal:
        c = min(self.c or context.budget, context.budget)
        if c < 1:
            return DraftProposal.empty()
        tokens = context.tokens
        rows, weights, longest = [], [], 0
        if self.index is not None:
            match = self.index.longest_match(tokens[-self.n_max :], self.n_max, self.k)
            self.last_match_length = match.length
            if len(match.starts):
                longest = match.length
                rows.append(self.index.continuations(match.starts, self.m))  # (S, m)
                share = match.length if self.by_length else 1.0
                weights.append(np.full(len(match.starts), share / len(match.starts)))
        if self.live > 0:
            length, live_rows = context_continuations(tokens, self.n_max, self.m, self.live_k)  # (S', m)
            if len(live_rows):
                longest = max(longest, length)
                rows.append(live_rows)
                share = self.live * (length if self.by_length else 1.0)
                weights.append(np.full(len(live_rows), share / len(live_rows)))
        if not rows:
            return DraftProposal.empty()
        proposal = top_nodes(build_trie(np.concatenate(rows), np.concatenate(weights)), c)
        # Label every node with the step's longest match (1-2, 3-4, 5-8, 9+ tokens): adaptive speculation
        # learns acceptance per label (`DraftProposal.group`), and longer matches predict better.
        return replace(proposal, group=np.full(len(proposal), MATCH_GROUPS.searchsorted(longest)))
