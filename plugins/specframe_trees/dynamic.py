"""`dynamic`: EAGLE-2 style trees, expansion by cumulative log-probability and a global rerank.

Expansion: at each depth, the `topk` candidates with the highest cumulative log-probability are
expanded, i.e. their children in the drafter's forest become candidates (the root is expanded first).
Rerank: of all candidates, the `budget` best by cumulative log-probability form the tree. A child's
log-probability never exceeds its parent's, so the best nodes are closed under ancestors; ties are broken
towards shallower and earlier nodes, and a node whose parent was not taken is skipped. See
`specframe_trees.forest` for the forest convention the drafter follows, and for why sampled drafts are
refused with `rejection`.
"""

from __future__ import annotations

import numpy as np

from specframe import (
    BuildContext, ConfigurationError, DraftProposal, ScoreKind, TokenTree, TreeBuilder,
    TreeBuilderCapabilities,
)
from specframe_trees.forest import check_forest


class DynamicTreeBuilder(TreeBuilder):
    """`dynamic(topk=4, depth=6)`: expand the `topk` best nodes per depth, keep the `budget` best overall."""

    name = "dynamic"
    capabilities = TreeBuilderCapabilities(needs_draft_probs=True, needs_score_kind=ScoreKind.LOG_PROB)

    option_limits = {"topk": (1, 4096), "depth": (1, 4096)}  # more than any budget fills

    def __init__(self, *, topk: int = 4, depth: int = 6):
        super().__init__()
        if topk < 1 or depth < 1:
            raise ConfigurationError(
                f"tree builder 'dynamic': topk and depth must be >= 1, got {topk}, {depth}")
        self.topk, self.depth = int(topk), int(depth)

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        check_forest(proposal, self.name)
        scores = proposal.scores
        candidates: list[int] = []
        expand = [-1]
        for _ in range(self.depth):
            layer = [c for e in expand for c in proposal.children[e + 1]]
            if not layer:
                break
            candidates += layer
            expand = [layer[j] for j in np.lexsort((np.array(layer), -scores[layer]))[: self.topk]]
        if not candidates:
            return TokenTree.empty()
        cand = np.array(candidates)
        order = cand[np.lexsort((cand, proposal.depth[cand], -scores[cand]))]  # best first
        taken: set[int] = set()
        keep: list[int] = []
        for node in order.tolist():
            if len(keep) >= context.budget:
                break
            parent = int(proposal.parents[node])
            if parent < 0 or parent in taken:
                taken.add(node)
                keep.append(node)
        return TokenTree.from_proposal(proposal, keep)
