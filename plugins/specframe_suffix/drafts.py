"""Drafts of the `suffix` drafter's sources, and their merge into one labelled forest.

Each source (the request, earlier responses, a corpus, `suffix-heads`' draft heads) drafts a forest in
the library's encoding; `merge` joins them, labelling every node with the source and match length that
gave its score (`group_of`), so adaptive speculation learns per source how far to trust it. The drafter
(`drafter.py`) and the sources outside it (`corpus.py`, `heads.py`) all build on these records, which
import nothing of theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specframe import DraftProposal, ScoreKind

REQUEST, RESPONSES, CORPUS, HEADS = 0, 1, 2, 3  # draft sources (HEADS: `suffix-heads` only)
SOURCES = ("request", "responses", "corpus", "heads")
# `DraftProposal.group` labels, source x match-length class: request 0-2 and earlier responses 3-5
# (matches of 1-2, 3-8, 9+ tokens), corpus 6-7 (1-4, 5+ tokens), draft heads 8 (no match involved).
GROUP_BASE = (0, 3, 6, 8)
MATCH_BOUNDS = ((2, 8), (2, 8), (4,), ())


def group_of(source: int, match_len: int) -> int:
    """The `DraftProposal.group` label of a draft from `source` with a match of `match_len` tokens."""
    return GROUP_BASE[source] + int(np.searchsorted(MATCH_BOUNDS[source], match_len))


@dataclass
class SourceDraft:
    """One source's draft: a forest in the library's encoding (parents index earlier nodes, -1 = root)."""

    source: int
    tokens: Sequence[int]
    parents: Sequence[int]
    probs: Sequence[float]
    match_len: int

    @property
    def group(self) -> int:
        return group_of(self.source, self.match_len)


def merge(drafts: Sequence[SourceDraft]) -> DraftProposal:
    """The union of the drafts as a trie: the same token under the same merged parent is one node, scored
    by the highest probability any draft gives it and labelled with that draft's group. Each draft's
    probabilities never increase downwards, so neither do their maxima (a `ScoreKind.FREQUENCY` forest)."""
    index: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    groups: list[int] = []
    for draft in drafts:
        mapped: list[int] = []  # draft node -> merged node
        for token, parent, prob in zip(draft.tokens, draft.parents, draft.probs):
            key = (mapped[parent] if parent >= 0 else -1, int(token))
            if key[0] >= 0:  # float32 products may exceed the parent by an ulp: keep scores monotone
                prob = min(prob, scores[key[0]])
            node = index.get(key)
            if node is None:
                node = index[key] = len(tokens)
                tokens.append(key[1])
                parents.append(key[0])
                scores.append(float(prob))
                groups.append(draft.group)
            elif prob > scores[node]:
                scores[node], groups[node] = float(prob), draft.group
            mapped.append(node)
    if not tokens:
        return DraftProposal.empty()
    return DraftProposal(np.array(tokens, np.int64), np.array(parents, np.int64), np.array(scores),
                         score_kind=ScoreKind.FREQUENCY, group=np.array(groups, np.int64))
