"""Tests of the example plugin: unit tests, then specframe's conformance suites on both components."""

from __future__ import annotations

import numpy as np

from specframe import DraftContext, DraftProposal
from specframe.testing import DrafterConformance, TreeBuilderConformance
from specframe_example import BigramDrafter, BreadthFirstTreeBuilder


class TestBigramConformance(DrafterConformance):
    component = BigramDrafter
    options = {"width": 2, "depth": 4}


class TestBreadthFirstConformance(TreeBuilderConformance):
    component = BreadthFirstTreeBuilder


def test_bigram_proposes_the_most_frequent_successors(tiny_target):
    drafter = BigramDrafter(tiny_target, width=2, depth=3)
    tokens = np.array([5, 7, 8, 5, 7, 9, 5, 6, 5])  # after 5: 7 twice, 6 once; after 7: 8 and 9
    proposal = drafter.propose(DraftContext(tokens, prompt_len=len(tokens), budget=8))
    assert proposal.tokens.tolist() == [7, 8, 5, 6, 5, 7]
    assert proposal.parents.tolist() == [-1, 0, 1, -1, 3, 4]
    assert np.isclose(proposal.scores[0], 2 / 3) and np.isclose(proposal.scores[3], 1 / 3)


def test_bigram_counts_incrementally_and_forgets_on_reset(tiny_target):
    drafter = BigramDrafter(tiny_target, width=1, depth=1)
    first = np.array([1, 2, 1])
    assert drafter.propose(DraftContext(first, 3, 4)).tokens.tolist() == [2]
    longer = np.concatenate([first, [3, 1]])  # now 1 -> 2 once, 1 -> 3 once: the earlier one wins ties
    assert drafter.propose(DraftContext(longer, 3, 4)).tokens.tolist() == [2]
    assert sum(drafter.successors[1].values()) == 2  # each bigram counted once across calls
    drafter.reset()
    assert drafter.propose(DraftContext(np.array([4, 1]), 2, 4)).tokens.tolist() == []


def test_breadth_first_fills_shallow_levels_first():
    #            root
    #        0 (0.2)   1 (0.9)
    #        |            |
    #        2 (0.8)      3 (0.1)
    proposal = DraftProposal(np.array([10, 11, 12, 13]), np.array([-1, -1, 0, 1]), np.array([0.2, 0.9, 0.8, 0.1]))
    tree = BreadthFirstTreeBuilder().build(proposal, budget=3)
    assert sorted(tree.tokens.tolist()) == [10, 11, 12]  # both children of the root, then the better grandchild
    assert len(BreadthFirstTreeBuilder().build(proposal, budget=1)) == 1
    assert BreadthFirstTreeBuilder().build(proposal, budget=1).tokens.tolist() == [11]
