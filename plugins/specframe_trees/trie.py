"""`trie`: keep the `budget` best-scored nodes of a proposal, closed under parents.

Best-first expansion from the root: a node becomes eligible once its parent is kept, and the eligible
node with the highest score (ties: the lowest index) is kept next. When scores never increase from a
parent to its child, as in frequency tries (REST) or cumulative probabilities, this is exactly the set of
the `budget` highest (score, -index) nodes, which is also the parent-closed set of maximal total score.

Sampled drafts are cut differently: the first `budget` nodes in draw order
(`specframe.kit.drafting.draw_order_prefix`), whatever their scores, so that `rejection` can still use
their q. Choosing the best-scored sampled nodes, or keeping everything only when it happens to fit,
would bias it.
"""

from __future__ import annotations

import heapq

from specframe import BuildContext, DraftProposal, TokenTree, TreeBuilder, TreeBuilderCapabilities
from specframe.kit.drafting import SAMPLED_DRAWS, draw_order_prefix


class TrieTreeBuilder(TreeBuilder):
    name = "trie"
    capabilities = TreeBuilderCapabilities(keeps_draw_order=True)

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        budget = context.budget
        if proposal.draw in SAMPLED_DRAWS:
            keep = draw_order_prefix(proposal, budget)
            return TokenTree.from_proposal(proposal, keep, draw_order_prefix=True)
        n = len(proposal)
        if n <= budget:
            return TokenTree.from_proposal(proposal, list(range(n)))
        scores = proposal.scores.tolist()
        children = proposal.children  # children[p + 1] lists node p's children
        frontier = [(-scores[i], i) for i in children[0]]
        heapq.heapify(frontier)
        keep: list[int] = []
        while frontier and len(keep) < budget:
            _, node = heapq.heappop(frontier)
            keep.append(node)
            for child in children[node + 1]:
                heapq.heappush(frontier, (-scores[child], child))
        return TokenTree.from_proposal(proposal, keep)
