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

from dataclasses import replace
from pathlib import Path

import numpy as np

from specframe import ConfigurationError, DraftContext, Drafter, DrafterCapabilities, DraftProposal, ScoreKind
from specframe_corpus.retrieval import build_trie, context_continuations, top_nodes
from specframe_corpus.stores import open_datastore, resolve_datastore

MATCH_GROUPS = np.array([2, 4, 8])  # match lengths 1-2, 3-4, 5-8, 9+ -> groups 0, 1, 2, 3


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
