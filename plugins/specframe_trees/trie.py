"""`trie`: keep the `budget` best-scored nodes of a proposal, closed under parents.

Best-first expansion from the root: a node becomes eligible once its parent is kept, and the eligible
node with the highest score (ties: the lowest index) is kept next. When scores never increase from a
parent to its child, as in frequency tries (REST) or cumulative probabilities, this is exactly the set of
the `budget` highest (score, -index) nodes, which is also the parent-closed set of maximal total score.
"""

from __future__ import annotations

import heapq

from specframe import DraftProposal, TokenTree, TreeBuilder, TreeBuilderCapabilities


class TrieTreeBuilder(TreeBuilder):
    name = "trie"
    capabilities = TreeBuilderCapabilities()

    def build(self, proposal: DraftProposal, budget: int) -> TokenTree:
        n = len(proposal)
        if n <= budget:
            return TokenTree.from_proposal(proposal, list(range(n)))
        scores = proposal.scores.tolist()
        children: list[list[int]] = [[] for _ in range(n + 1)]  # children[p + 1] lists node p's children
        for i, p in enumerate(proposal.parents.tolist()):
            children[p + 1].append(i)
        frontier = [(-scores[i], i) for i in children[0]]
        heapq.heapify(frontier)
        keep: list[int] = []
        while frontier and len(keep) < budget:
            _, node = heapq.heappop(frontier)
            keep.append(node)
            for child in children[node + 1]:
                heapq.heappush(frontier, (-scores[child], child))
        return TokenTree.from_proposal(proposal, keep)
