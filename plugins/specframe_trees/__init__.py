"""Tree builders that need nothing but the proposal's structure and scores."""

from __future__ import annotations

import specframe
from specframe import DraftProposal, TokenTree, TreeBuilder, TreeBuilderCapabilities
from specframe.tree import SAMPLED_DRAWS, draw_order_prefix
from specframe_trees.beam import BeamTreeBuilder
from specframe_trees.dynamic import DynamicTreeBuilder
from specframe_trees.static import StaticTreeBuilder
from specframe_trees.trie import TrieTreeBuilder


class ChainTreeBuilder(TreeBuilder):
    """`chain`: from the root, follow the best-scored child (ties: the earliest) for up to `budget` nodes.

    For sampled drafts it follows the first-drawn child instead: picking the best-scored (for i.i.d.
    draws, the most often drawn) child would make the kept child no longer a draw from q.
    """

    name = "chain"
    capabilities = TreeBuilderCapabilities(keeps_draw_order=True, makes_chains=True)

    def build(self, proposal: DraftProposal, budget: int) -> TokenTree:
        if proposal.draw in SAMPLED_DRAWS:
            keep = draw_order_prefix(proposal, budget, allowed=lambda ranks: ranks[-1] == 0)
            return TokenTree.from_proposal(proposal, keep, draw_order_prefix=True)
        keep: list[int] = []
        parent = -1
        children = _children(proposal)
        while len(keep) < budget:
            kids = children.get(parent)
            if not kids:
                break
            parent = max(kids, key=lambda i: (proposal.scores[i], -i))
            keep.append(parent)
        return TokenTree.from_proposal(proposal, keep)


def _children(proposal: DraftProposal) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(proposal.parents.tolist()):
        kids.setdefault(p, []).append(i)
    return kids


@specframe.hookimpl
def register_tree_builders(register):
    register(ChainTreeBuilder)
    register(TrieTreeBuilder)
    register(StaticTreeBuilder)
    register(BeamTreeBuilder)
    register(DynamicTreeBuilder)
