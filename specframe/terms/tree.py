"""`TokenTree`: the one tree type every drafter's proposal becomes before the target scores it.

Nodes are numbered 0..N-1 in topological order (a parent before its children). The root is the last
token already emitted; it is not a node, but it is row/column 0 of every *packed* quantity, because the
backend feeds it to the target together with the nodes: packed index 0 = root, packed index i + 1 = node i.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from specframe.terms.forest import Forest
from specframe.terms.proposal import SAMPLED_DRAWS, DraftProposal, DrawMethod

if TYPE_CHECKING:
    import torch

@dataclass(eq=False)
class TokenTree(Forest):
    """A token tree under the root: node i has `tokens[i]` and parent `parents[i]` (-1 = the root).

    `depth[i]` counts edges from the root (children of the root have depth 1), so the position of
    node i is `prefix_len + depth[i]` when the root sits at `prefix_len`. `Forest` checks the parents and
    gives `depth`, `children`, `child`, `paths` and `path_to`.
    """

    draft_probs: torch.Tensor | None = None  # (N, V) q each node was drawn from, if the drafter had it
    draw: DrawMethod = DrawMethod.RETRIEVED  # how the drafter chose the tokens (see `DrawMethod`)
    origin: np.ndarray | None = None  # (N,) each node's index in the proposal it came from, if known

    @classmethod
    def empty(cls) -> TokenTree:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @classmethod
    def from_proposal(cls, proposal: DraftProposal, keep: np.ndarray | list[int], *,
                      draw_order_prefix: bool = False) -> TokenTree:
        """The sub-forest of `proposal` made of the nodes `keep` (closed under parents), renumbered.

        A sampled proposal stays verifiable with its q (verifier `rejection`) only if the builder chose
        `keep` by a rule that never looks at the drawn tokens and keeps, below every node, a prefix of
        the children in draw order; the builder says so with `draw_order_prefix=True` (the function
        `draw_order_prefix` below is such a rule). Otherwise the tree is labelled `RETRIEVED`, even when
        every node happens to be kept: whether everything fits a budget, or whether i.i.d. draws
        coincided, depends on the drawn tokens, so "nothing was dropped" is itself biased evidence.
        `RETRIEVED` trees are verified by sampling and matching, which is lossless for any tree.
        """
        keep = np.sort(np.asarray(keep, dtype=np.int64))
        draw = proposal.draw
        if draw in SAMPLED_DRAWS and not draw_order_prefix:
            draw = DrawMethod.RETRIEVED
        probs = None if proposal.draft_probs is None else proposal.draft_probs[keep.tolist()]
        return cls(proposal.tokens[keep], proposal.kept_parents(keep), probs, draw, origin=keep)

    def subtree(self, keep: np.ndarray | list[int]) -> TokenTree:
        """The nodes `keep` (closed under parents), renumbered, as a tree verified by sampling and
        matching: a cut chosen after the draws is no draw-order prefix (see `from_proposal`)."""
        keep = np.sort(np.asarray(keep, dtype=np.int64))
        draw = DrawMethod.RETRIEVED if self.draw in SAMPLED_DRAWS else self.draw
        probs = None if self.draft_probs is None else self.draft_probs[keep.tolist()]
        origin = None if self.origin is None else self.origin[keep]
        return TokenTree(self.tokens[keep], self.kept_parents(keep), probs, draw, origin=origin)

    def padded(self, pad: int, token: int) -> TokenTree:
        """This tree with a chain of `pad` throwaway nodes carrying `token` after its last node (after the
        root when it is empty), or the tree itself when `pad` <= 0. No original node has the chain among
        its ancestors, so scoring the padded tree gives the original rows unchanged: backends pad small
        forwards this way to a row count the CPU multiplies faster
        (`specframe.runtime.devices.forward_min_rows`)."""
        if pad <= 0:
            return self
        n = len(self)
        return TokenTree(np.concatenate([self.tokens, np.full(pad, token, np.int64)]),
                         np.concatenate([self.parents, np.arange(n - 1, n - 1 + pad)]))

    @property
    def sampled(self) -> bool:
        """True when the children of every node are draws from their q row (see `DrawMethod`)."""
        return self.draw in SAMPLED_DRAWS and self.draft_probs is not None

    # --- packed quantities (root at index 0) -------------------------------------------------------

    @cached_property
    def packed_parents(self) -> np.ndarray:
        """(N + 1,) parent in packed numbering; the root's parent is -1."""
        return np.concatenate([[-1], self.parents + 1])

    @cached_property
    def position_offsets(self) -> np.ndarray:
        """(N + 1,) position of each packed entry relative to the root: 0 for the root, depth for nodes."""
        return np.concatenate([[0], self.depth])

    @cached_property
    def ancestor_mask(self) -> np.ndarray:
        """(N + 1, N + 1) bool: entry [i, j] is True when packed j is i or an ancestor of i."""
        n = len(self) + 1
        mask = np.zeros((n, n), dtype=bool)
        mask[:, 0] = True
        parents = self.packed_parents
        for i in range(1, n):
            mask[i] = mask[parents[i]]
            mask[i, i] = True
        return mask


def draw_order_prefix(proposal: DraftProposal, budget: int,
                      allowed: Callable[[tuple[int, ...]], bool] | None = None) -> list[int]:
    """Nodes to keep from a sampled proposal, chosen without looking at any drawn token.

    Walks the nodes in index order (the drafter's draw order, `DrawMethod` rule 2) and keeps node i when
    its parent was kept, every earlier sibling was kept, `allowed(ranks)` holds for its rank path (its
    rank among its siblings in draw order, then its parent's, up to the root: `(r1, ..., rk)` from the
    root down) and fewer than `budget` nodes are kept. Each decision depends only on the positions of
    draws made before node i, never on its token or on later draws, so the kept children of every node
    are a prefix of its draws whose length is independent of their values: exactly what rejection
    sampling needs (pass the result to `TokenTree.from_proposal(..., draw_order_prefix=True)`).

    `allowed=None` keeps the first `budget` nodes (a `trie` for sampled drafts); `lambda r: r[-1] == 0`
    follows the first-drawn child (a `chain`); a set of rank paths gives a static shape.
    """
    parents = proposal.parents.tolist()
    rank_path: dict[int, tuple[int, ...]] = {-1: ()}  # kept node (and the root) -> its rank path
    seen: dict[int, int] = {}  # parent -> children met so far, in index order
    taken: dict[int, int] = {}  # parent -> children kept so far
    keep: list[int] = []
    for i, parent in enumerate(parents):
        if len(keep) >= budget:
            break
        if parent not in rank_path:  # the parent was not kept
            continue
        rank = seen.get(parent, 0)
        seen[parent] = rank + 1
        path = rank_path[parent] + (rank,)
        if taken.get(parent, 0) != rank or (allowed is not None and not allowed(path)):
            continue  # an earlier sibling was dropped, or the shape excludes this rank
        rank_path[i] = path
        taken[parent] = rank + 1
        keep.append(i)
    return keep
