"""TokenTree records against brute force, on random parent lists."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe import DraftProposal, TokenTree


@st.composite
def parent_lists(draw, max_nodes=24):
    n = draw(st.integers(0, max_nodes))
    return [draw(st.integers(-1, i - 1)) for i in range(n)]


def brute_ancestors(parents: list[int], i: int) -> set[int]:
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


@settings(max_examples=200, deadline=None)
@given(parent_lists())
def test_tree_records_match_brute_force(parents):
    n = len(parents)
    tree = TokenTree(np.arange(n) + 100, np.array(parents, dtype=np.int64))
    for i in range(n):
        anc = brute_ancestors(parents, i)
        assert tree.depth[i] == len(anc)
        assert tree.position_offsets[i + 1] == len(anc)
        expected_row = [True] + [j in anc for j in range(n)]
        assert tree.ancestor_mask[i + 1].tolist() == expected_row
        assert tree.path_to(i) == sorted(anc)
    assert tree.ancestor_mask[0].tolist() == [True] + [False] * n
    leaves = [i for i in range(n) if i not in parents]
    assert tree.paths == [sorted(brute_ancestors(parents, leaf)) for leaf in leaves]
    for i in range(n):
        assert tree.children[parents[i] + 1].count(i) == 1


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, -2]])
def test_non_topological_parents_are_refused(parents):
    with pytest.raises(ValueError, match="topological"):
        TokenTree(np.zeros(len(parents)), np.array(parents))


def test_from_sequences_builds_weighted_trie():
    proposal = DraftProposal.from_sequences([[1, 2, 3], [1, 2, 4], [5]], weights=[1.0, 2.0, 1.0])
    assert proposal.tokens.tolist() == [1, 2, 3, 4, 5]
    assert proposal.parents.tolist() == [-1, 0, 1, 1, -1]
    assert proposal.scores.tolist() == [3.0, 3.0, 1.0, 2.0, 1.0]


def test_from_proposal_requires_closed_subset():
    proposal = DraftProposal.from_sequences([[1, 2, 3]])
    tree = TokenTree.from_proposal(proposal, [0, 1])
    assert tree.tokens.tolist() == [1, 2] and tree.parents.tolist() == [-1, 0]
    with pytest.raises(ValueError, match="ancestor"):
        TokenTree.from_proposal(proposal, [0, 2])


@pytest.mark.parametrize("parents", [[], [-1], [-1, 0, -1], [-1, -1, 1, 2]])
@pytest.mark.parametrize("pad", [0, 1, 3])
def test_padding_is_a_chain_after_the_last_node_that_no_real_node_sees(parents, pad):
    tree = TokenTree(np.arange(len(parents), dtype=np.int64) + 5, np.array(parents, np.int64))
    grown = tree.padded(pad, token=99)
    n = len(tree)
    assert len(grown) == n + pad and grown.tokens[n:].tolist() == [99] * pad
    assert grown.tokens[:n].tolist() == tree.tokens.tolist()
    np.testing.assert_array_equal(grown.ancestor_mask[: n + 1, : n + 1], tree.ancestor_mask)
    assert not grown.ancestor_mask[: n + 1, n + 1:].any()  # no real row sees the padding
    assert grown.packed_parents[n + 1:].tolist() == list(range(n, n + pad))  # from the last real row
    tail = tree.position_offsets[-1] + 1 + np.arange(pad)  # one position further per padding row
    np.testing.assert_array_equal(grown.position_offsets[n + 1:], tail)
