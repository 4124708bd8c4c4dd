"""Where a token tree goes in one llama.cpp batch: each row's position and sequence ids, and which sequence
holds the accepted branch at a commit.

llama.cpp's attention mask lets a batch token see a cache cell when the cell holds the token's *first*
sequence id and a position no later than the token's. So every root-to-leaf path of the packed tree
(root, then the nodes) gets a sequence id, numbered by leaf in tree order, and every row carries the ids
of all paths through it, smallest first. A row's first id is a path through the row itself; the cells
holding that id at positions up to the row's are the committed prefix (which every path id is copied to),
the row's ancestors and the row: exactly what the row attends to in plain decoding along its path.

Only the first id decides what a row sees; the others decide which rows *see the row*: a path id on a
cell makes the cell visible to every row whose first id it is, all of them the cell's descendants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specframe import TokenTree


@dataclass(frozen=True)
class TreeLayout:
    """The rows of one scored tree, root first: positions relative to the root and sequence ids."""

    offsets: np.ndarray  # (R,) each row's depth below the root: its position is the root's plus this
    seq_ids: list[list[int]]  # per row, the ids of the root-to-leaf paths through it, ascending
    paths: int  # root-to-leaf paths, so sequence ids 0..paths-1

    @property
    def rows(self) -> int:
        return len(self.offsets)


ROOT_ONLY = TreeLayout(np.zeros(1, dtype=np.int64), [[0]], 1)  # a plain step's: the root in sequence 0
ROOT_ONLY.offsets.setflags(write=False)


def tree_layout(tree: TokenTree) -> TreeLayout:
    """The layout of the packed `tree` (root, then its nodes in order)."""
    if len(tree) == 0:
        return ROOT_ONLY
    parents = tree.packed_parents  # (R,)
    leaf = np.ones(len(parents), dtype=bool)
    leaf[parents[1:]] = False
    seq_ids: list[list[int]] = [[] for _ in parents]
    for path, row in enumerate(np.flatnonzero(leaf).tolist()):
        while row >= 0:  # the leaf and its ancestors, up to the root
            seq_ids[row].append(path)
            row = int(parents[row])
    return TreeLayout(tree.position_offsets, seq_ids, int(leaf.sum()))


def kept_sequence(layout: TreeLayout, path: list[int]) -> int:
    """The id of a root-to-leaf path through the last accepted row (the root when `path` is empty): the
    cells holding it up to that row's position are the root and the accepted nodes."""
    return layout.seq_ids[path[-1] + 1 if path else 0][0]
