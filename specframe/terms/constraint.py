"""Constraints on what a request may emit (structured output): the interface the decoder works with.

A `Constraint` (a JSON schema, a regular expression or a grammar, compiled for one tokenizer) starts one
`ConstraintState` per request. A state says which tokens may come next (`allowed`), and `advance` returns
the state after one more token without changing its own: states are values, so every node of a tree has
the state of its own path (`PathStates`), and a rejected branch leaves nothing behind to roll back.

The law, defined once: at every position the target's logits are masked to the allowed tokens (the others
set to -inf) before temperature, top-k and top-p (`Sampler.probs`); greedy is the argmax of the masked
logits. The reasoning: docs/explanation/structured-output.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from specframe.terms.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from specframe.terms.forest import Forest


class ConstraintError(ConfigurationError):
    """A constraint that cannot be used: an invalid schema, regular expression or grammar, one no token
    sequence satisfies, a pipeline that cannot honour it, or a state with no token left to emit."""


class ConstraintState(ABC):
    """Where a request stands in its constraint after the tokens emitted so far. Never changed in place:
    `advance` returns a new state."""

    @abstractmethod
    def allowed(self) -> np.ndarray:
        """(V,) bool: the tokens that may come next (V: the constraint's vocabulary)."""

    @abstractmethod
    def advance(self, token: int) -> ConstraintState:
        """The state after `token`; raises `ConstraintError` when `token` is not allowed here."""

    @property
    def is_done(self) -> bool:
        """True when the constraint is complete: nothing but an end-of-sequence token may follow."""
        return False

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the constraint forces from here (where exactly one token is allowed, then
        again after it). A draft, verified like any other: a subclass may return the library's tokenizing
        of forced text, which the target may still spell otherwise."""
        out: list[int] = []
        state = self
        while len(out) < limit:
            allowed = np.flatnonzero(state.allowed())
            if len(allowed) != 1:
                break
            out.append(int(allowed[0]))
            state = state.advance(out[-1])
        return out

    def advance_all(self, tokens: Sequence[int]) -> ConstraintState:
        """The state after `tokens`, one after the other."""
        state = self
        for token in tokens:
            state = state.advance(int(token))
        return state


class Constraint(ABC):
    """A compiled constraint for one tokenizer: what a request is given (`generate(..., constraint=)`).
    `vocab_size` is the tokenizer's vocabulary (the target's may be larger: its extra rows are never
    allowed); `describe` names it in messages."""

    vocab_size: int

    @abstractmethod
    def start(self) -> ConstraintState:
        """The state before any generated token (a new request)."""

    def describe(self) -> str:
        return type(self).__name__


class PathStates:
    """The constraint states and masks of the token paths under one step's root, each computed once.

    A path is the tuple of tokens from the root's child down to a node; its state is its parent path's
    state advanced by its last token, when that token is allowed there. Trees and proposals of one step
    share these, so pruning the proposal, pruning the tree and masking the scores walk each path once."""

    def __init__(self, root: ConstraintState, vocab: int):
        self.vocab = vocab  # the target's vocabulary: masks are padded to it with False
        self._known: dict[tuple[int, ...], tuple[ConstraintState, np.ndarray] | None] = {}
        self._known[()] = (root, self._padded(root.allowed()))

    def _padded(self, allowed: np.ndarray) -> np.ndarray:
        if len(allowed) >= self.vocab:
            return allowed[: self.vocab]
        return np.concatenate([allowed, np.zeros(self.vocab - len(allowed), bool)])

    def entry(self, path: tuple[int, ...]) -> tuple[ConstraintState, np.ndarray] | None:
        """(state, (V,) mask) after `path`, or None when the constraint forbids the path."""
        if path not in self._known:
            parent = self.entry(path[:-1])
            if parent is None or not parent[1][path[-1]]:
                self._known[path] = None
            else:
                state = parent[0].advance(path[-1])
                self._known[path] = (state, self._padded(state.allowed()))
        return self._known[path]

    def keep(self, forest: Forest) -> list[int]:
        """The nodes of `forest` (a tree or a proposal) whose whole path the constraint allows."""
        paths: list[tuple[int, ...]] = []
        keep = []
        for i, (token, parent) in enumerate(zip(forest.tokens.tolist(), forest.parents.tolist())):
            path = (paths[parent] if parent >= 0 else ()) + (token,)
            paths.append(path)
            if self.entry(path) is not None:
                keep.append(i)
        return keep

    def masks(self, forest: Forest) -> np.ndarray:
        """(N + 1, V) bool: the allowed tokens after the root (row 0) and after each node (row i + 1) of a
        tree whose every path is allowed (`keep` it first)."""
        rows = [self._known[()][1]]
        paths: list[tuple[int, ...]] = []
        for token, parent in zip(forest.tokens.tolist(), forest.parents.tolist()):
            paths.append((paths[parent] if parent >= 0 else ()) + (token,))
            found = self.entry(paths[-1])
            if found is None:
                raise ConstraintError(f"tree node {len(paths) - 1} is on a path the constraint forbids "
                                      "(prune the tree with PathStates.keep before masking it)")
            rows.append(found[1])
        return np.stack(rows)


def mask_logits(logits: torch.Tensor, masks: np.ndarray) -> torch.Tensor:
    """(N + 1, V) `logits` with the tokens `masks` forbids set to -inf (a new tensor)."""
    import torch

    allowed = torch.from_numpy(masks).to(logits.device)  # (N + 1, V)
    return logits.masked_fill(~allowed, float("-inf"))
