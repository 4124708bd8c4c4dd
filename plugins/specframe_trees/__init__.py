"""Tree builders that need nothing but the proposal's structure and scores."""

from __future__ import annotations

import specframe
from specframe import BuildContext, DraftProposal, TokenTree, TreeBuilder, TreeBuilderCapabilities
from specframe.kit.drafting import SAMPLED_DRAWS, draw_order_prefix
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

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        if proposal.draw in SAMPLED_DRAWS:
            keep = draw_order_prefix(proposal, context.budget, allowed=lambda ranks: ranks[-1] == 0)
            return TokenTree.from_proposal(proposal, keep, draw_order_prefix=True)
        keep: list[int] = []
        kids = proposal.children[0]  # the root's
        while kids and len(keep) < context.budget:
            node = max(kids, key=lambda i: (proposal.scores[i], -i))
            keep.append(node)
            kids = proposal.children[node + 1]
        return TokenTree.from_proposal(proposal, keep)


@specframe.hookimpl
def register_tree_builders(register):
    register(ChainTreeBuilder)
    register(TrieTreeBuilder)
    register(StaticTreeBuilder)
    register(BeamTreeBuilder)
    register(DynamicTreeBuilder)
