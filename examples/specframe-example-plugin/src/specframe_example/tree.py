"""`breadth-first`: a tree builder that spends the budget level by level.

Shallow nodes are the likeliest to be accepted (a node can only be accepted after its parent), so this
builder keeps every child of the root first, then every grandchild, and so on; inside a level, the
best-scored nodes go first. A node is only kept when its parent was.

It ranks sampled siblings by score, so it does not keep a draw-order prefix: it leaves
`keeps_draw_order` False, and `TokenTree.from_proposal` labels its trees as retrieved text.
"""

from __future__ import annotations

from specframe import BuildContext, DraftProposal, TokenTree, TreeBuilder, TreeBuilderCapabilities


class BreadthFirstTreeBuilder(TreeBuilder):
    name = "breadth-first"
    capabilities = TreeBuilderCapabilities(keeps_draft_probs=True)

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        kept: list[int] = []
        level = proposal.children[0]  # the root's children
        while level and len(kept) < context.budget:
            best = sorted(level, key=lambda i: (-proposal.scores[i], i))[: context.budget - len(kept)]
            kept += best
            level = [child for node in best for child in proposal.children[node + 1]]
        return TokenTree.from_proposal(proposal, kept)
