"""`beam`: beam search over a drafter's candidate forest, keeping every token of every beam step.

As in STree (section 5.1): at depth 1 the beams are the `width` best children of the root; at depth
d + 1 they are the `width` best (by cumulative log-probability) among all children of the depth-d beams.
Every beam of every step stays in the tree, so a full run keeps width x depth nodes. `config=A..E`
selects STree's width x depth settings (3x4, 16x3, 6x3, 4x4, 3x5). See `specframe_trees.forest` for the
forest convention the drafter follows, and for why sampled drafts are refused with `rejection`.
"""

from __future__ import annotations

import numpy as np

from specframe import (
    BuildContext, ConfigurationError, DraftProposal, ScoreKind, TokenTree, TreeBuilder,
    TreeBuilderCapabilities,
)
from specframe_trees.forest import check_forest
from specframe_trees.static import STREE_CONFIGS


class BeamTreeBuilder(TreeBuilder):
    """`beam(width=4, depth=4)` or `beam(config=D)`."""

    name = "beam"
    capabilities = TreeBuilderCapabilities(needs_draft_probs=True, needs_score_kind=ScoreKind.LOG_PROB)

    option_limits = {"width": (1, 4096), "depth": (1, 4096)}  # more than any budget fills

    def __init__(self, *, width: int = 4, depth: int = 4, config: str | None = None):
        super().__init__()
        if config is not None:
            if str(config).upper() not in STREE_CONFIGS:
                raise ConfigurationError(f"tree builder 'beam': unknown config '{config}'; "
                                         f"use one of {', '.join(STREE_CONFIGS)}")
            width, depth = STREE_CONFIGS[str(config).upper()]
        if width < 1 or depth < 1:
            raise ConfigurationError(
                f"tree builder 'beam': width and depth must be >= 1, got {width}, {depth}")
        self.width, self.depth = int(width), int(depth)

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        check_forest(proposal, self.name)
        budget = context.budget
        keep: list[int] = []
        beams = [-1]
        for _ in range(self.depth):
            candidates = [c for b in beams for c in proposal.children[b + 1]]
            if not candidates or len(keep) >= budget:
                break
            order = np.lexsort((np.array(candidates), -proposal.scores[candidates]))
            beams = [candidates[j] for j in order[: min(self.width, budget - len(keep))]]
            keep += beams
        return TokenTree.from_proposal(proposal, keep)
