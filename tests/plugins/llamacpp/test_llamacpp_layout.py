"""The `llamacpp` backend's batch layout, checked without llama.cpp: under llama.cpp's visibility rule (a
row sees a cell that holds the row's first sequence id at a position no later than the row's), every row
of a tree sees exactly its ancestors and itself, and a commit's sequence holds exactly the accepted path."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe import TokenTree
from specframe_llamacpp.layout import kept_sequence, tree_layout


@st.composite
def trees(draw, most: int = 40) -> TokenTree:
    n = draw(st.integers(0, most))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    return TokenTree(np.zeros(n, np.int64), np.array(parents, np.int64))


def visible(layout, row: int, cell: int) -> bool:
    """llama.cpp's rule for a batch row and the cell another row of the same batch was stored in."""
    return layout.seq_ids[row][0] in layout.seq_ids[cell] and layout.offsets[cell] <= layout.offsets[row]


@settings(max_examples=200, deadline=None)
@given(trees())
def test_every_row_sees_exactly_its_ancestors_and_itself(tree):
    layout = tree_layout(tree)
    seen = np.array([[visible(layout, r, c) for c in range(layout.rows)] for r in range(layout.rows)])
    assert np.array_equal(seen, tree.ancestor_mask)


@settings(max_examples=200, deadline=None)
@given(trees())
def test_one_sequence_per_leaf_and_every_row_in_a_path_of_its_own(tree):
    layout = tree_layout(tree)
    leaves = sum(not kids for kids in tree.children)  # children[0] is the root's, so an empty tree has 1
    assert layout.paths == leaves
    for ids in layout.seq_ids:
        assert ids == sorted(set(ids)) and ids and max(ids) < layout.paths


@settings(max_examples=200, deadline=None)
@given(trees(), st.data())
def test_the_kept_sequence_holds_the_root_and_the_accepted_path_up_to_its_depth(tree, data):
    layout = tree_layout(tree)
    node = data.draw(st.integers(-1, len(tree) - 1))
    path = tree.path_to(node) if node >= 0 else []
    seq = kept_sequence(layout, path)
    kept = [r for r in range(layout.rows) if seq in layout.seq_ids[r] and layout.offsets[r] <= len(path)]
    assert kept == [0] + [i + 1 for i in path]
