"""`breadth-first`: a tree builder that spends the budget level by level.

Shallow nodes are the likeliest to be accepted (a node can only be accepted after its parent), so this
builder keeps every child of the root first, then every grandchild, and so on; inside a level, the
best-scored nodes go first. A node is only kept when its parent was.
"""

from __future__ import annotations

import numpy as np

from specframe import DraftProposal, TokenTree, TreeBuilder, TreeBuilderCapabilities


class BreadthFirstTreeBuilder(TreeBuilder):
    name = "breadth-first"
    capabilities = TreeBuilderCapabilities(keeps_draft_probs=True)

    def build(self, proposal: DraftProposal, budget: int) -> TokenTree:
        kept: set[int] = set()
        level = [i for i, p in enumerate(proposal.parents.tolist()) if p == -1]
        while level and len(kept) < budget:
            level.sort(key=lambda i: (-proposal.scores[i], i))
            take = level[: budget - len(kept)]
            kept.update(take)
            level = [i for i, p in enumerate(proposal.parents.tolist()) if p in kept and i not in kept]
        return TokenTree.from_proposal(proposal, np.array(sorted(kept), dtype=np.int64))
