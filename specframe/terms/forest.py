"""`Forest`: tokens hanging under an implicit root, parents before children.

A drafter's `DraftProposal` and the `TokenTree` built from it are both such forests; this base holds
what they share, so that builders, verifiers and checks ask the forest for its structure instead of
rebuilding it. Node i carries `tokens[i]` under `parents[i]` (-1 = the root, which is not a node).
Derived structure is computed once, on first use, and shared: the arrays must not be changed in place
afterwards, and the lists returned (`children`, `paths`) must be copied before being changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(eq=False)
class Forest:
    """Nodes 0..N-1 in topological order: `-1 <= parents[i] < i`."""

    tokens: np.ndarray  # (N,) int64
    parents: np.ndarray  # (N,) int64, -1 = root

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        self.parents = np.asarray(self.parents, dtype=np.int64).reshape(-1)
        n, name = len(self.tokens), type(self).__name__
        if len(self.parents) != n:
            raise ValueError(f"{name}: {n} tokens but {len(self.parents)} parents")
        if n and (np.any(self.parents >= np.arange(n)) or np.any(self.parents < -1)):
            raise ValueError(f"{name}: parents must satisfy -1 <= parents[i] < i (topological order), "
                             f"got {self.parents.tolist()}")

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def depth(self) -> np.ndarray:
        """(N,) int64 edges from the root: children of the root have depth 1."""
        depth = np.ones(len(self), np.int64)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                depth[i] = depth[p] + 1
        return depth

    @cached_property
    def children(self) -> list[list[int]]:
        """children[0] lists the root's children, children[i + 1] those of node i, in index order."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents.tolist()):
            kids[p + 1].append(i)
        return kids

    @cached_property
    def _child_by_token(self) -> dict[tuple[int, int], int]:
        """(parent, token) -> the first child of `parent` carrying `token`."""
        index: dict[tuple[int, int], int] = {}
        for i, key in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
            index.setdefault(key, i)
        return index

    def child(self, parent: int, token: int) -> int | None:
        """The first child of `parent` (-1 = the root) carrying `token`, or None.

        Verifiers descend with it; "first" matters for raw i.i.d. streams, where a token may repeat.
        """
        return self._child_by_token.get((int(parent), int(token)))

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(int(node))
            node = int(self.parents[node])
        return path[::-1]

    def kept_parents(self, keep: np.ndarray) -> np.ndarray:
        """(K,) parents of the sorted nodes `keep`, renumbered 0..K-1 among them (-1 stays the root).

        How a sub-forest is cut out (`TokenTree.from_proposal`, REST's top nodes); raises `ValueError`
        when a kept node's parent is not kept.
        """
        remap = np.full(len(self) + 1, -1, np.int64)  # (N + 1,) the last slot maps the root (-1) to -1
        remap[keep] = np.arange(len(keep))
        parents = self.parents[keep]  # (K,)
        kept = remap[parents]  # (K,)
        orphans = (parents >= 0) & (kept < 0)  # (K,)
        if np.any(orphans):
            node = int(np.asarray(keep)[orphans][0])
            raise ValueError(f"{type(self).__name__}: node {node} is kept but its parent "
                             f"{int(self.parents[node])} is not; the kept nodes must include every ancestor")
        return kept

    @cached_property
    def paths(self) -> list[list[int]]:
        """Root-to-leaf paths as lists of node indices, in order of their leaves."""
        return [self.path_to(i) for i in range(len(self)) if not self.children[i + 1]]
