"""The state of several sequences decoded together (`StateBackend.batch`): the `BatchBackend` interface a
backend's rows implement, what one row commits (`Commit`), and the rows of a backend written for one
sequence: `RowByRow` (the default `StateBackend.batch`: a copy per row) and `OneRow` (the backend itself,
for requests decoded one at a time).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from specframe.terms.errors import ConfigurationError
from specframe.terms.kinds import DEFAULT_COMPONENTS, ComponentKind
from specframe.terms.records import TargetScores
from specframe.terms.tree import TokenTree

Commit = tuple[TargetScores, list[int], int]  # what one row commits: its scores, accepted path, bonus


class BatchBackend(ABC):
    """The target's state for several sequences (rows) decoded together: each step scores every active
    row's tree, ideally in one forward, and commits each row's accepted path on its own.

    Rows are keyed by the int `add` returns and may come and go between steps (a finished request's row
    is removed, a queued one added: continuous batching). A row's scores must be what
    `StateBackend.score` would give for that row's tree alone, so that each row decodes exactly as its
    request would alone; how a backend keeps that true across batch shapes is for it to say and test
    (`specframe.testing.checks` has the check). `one_forward` says whether a step's rows share one
    forward (False: scored one after the other, as `RowByRow` does).
    """

    one_forward: ClassVar[bool] = False

    def __init__(self, backend):
        # The single-sequence `StateBackend` this batches (its options, its target). Not annotated: the
        # interface that returns a batch imports this module, so this one cannot import it back.
        self.backend = backend

    @abstractmethod
    def add(self, ids: list[int]) -> int:
        """Start a row: process `ids[:-1]`, keep `ids[-1]` pending (as `StateBackend.prefill`); its key."""

    @abstractmethod
    def remove(self, row: int) -> None:
        """Drop a row and free its state."""

    @abstractmethod
    def committed_length(self, row: int) -> int:
        """Tokens in `row`'s committed state, its pending root excluded."""

    @abstractmethod
    def score(self, trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        """Target logits at the root and every node of each row's tree (rows not in `trees` idle this
        step). Never changes a committed state; a new `score` discards the previous uncommitted one."""

    def forward_rows(self, sizes: Mapping[int, int]) -> list[int]:
        """The query rows of each forward one `score` runs for trees of `sizes[row]` nodes: what the
        batch planner prices with the backend's single-sequence cost (a forward of n rows costs what a
        tree of n - 1 nodes costs alone). Default: one forward per row, its root and nodes, as `RowByRow`
        scores; a backend that packs rows into one forward says how (padding included)."""
        return [n + 1 for n in sizes.values()]

    @abstractmethod
    def commit(self, accepted: Mapping[int, Commit]) -> None:
        """For each row in `accepted`: append the root and the nodes `path` of its scored tree, make
        `bonus` pending (as `StateBackend.commit`). Every row scored by the latest `score` is committed
        in this one call."""


class RowByRow(BatchBackend):
    """A batch as one copy of a one-sequence backend per row, scored one after the other: the default
    `StateBackend.batch` (see there). Each copy starts its own state at `prefill`; what the copies share
    (the target, measured limits) is read-only. Refuses a backend that does not declare so
    (`BackendCapabilities.fresh_state_per_copy`): its copies could share one sequence's state."""

    def __init__(self, backend):
        if not backend.capabilities.fresh_state_per_copy:
            name, default = backend.name, DEFAULT_COMPONENTS[ComponentKind.BACKEND]
            raise ConfigurationError(
                f"backend '{name}' cannot decode a batch: its rows would be copies of one backend, "
                f"independent only when prefill starts all of a sequence's state afresh, and '{name}' does "
                "not declare that (BackendCapabilities.fresh_state_per_copy). Call generate for each "
                f"prompt, or decode the batch with a backend that batches, such as --backend {default}; a "
                "backend's author declares fresh_state_per_copy=True when prefill makes all state new, or "
                "overrides batch() (docs/how-to/batch-decoding.md)")
        super().__init__(backend)
        self.rows: dict = {}  # row -> its copy of the backend
        self._next = 0

    def add(self, ids: list[int]) -> int:
        row, self._next = self._next, self._next + 1
        state = copy.copy(self.backend)
        state.prefill(ids)
        self.rows[row] = state
        return row

    def remove(self, row: int) -> None:
        del self.rows[row]

    def committed_length(self, row: int) -> int:
        return self.rows[row].committed_length

    def score(self, trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        return {row: self.rows[row].score(tree) for row, tree in trees.items()}

    def commit(self, accepted: Mapping[int, Commit]) -> None:
        for row, (scored, path, bonus) in accepted.items():
            self.rows[row].commit(scored, path, bonus)


class OneRow(BatchBackend):
    """A backend written for one sequence as the rows of requests decoded one at a time
    (`StateBackend.rows(1)`): the backend itself, whose one row is its state (`prefill` starts it afresh,
    so a row that ended needs no removal). Unlike `RowByRow` it copies nothing, so it serves backends
    whose copies would share state."""

    ROW = 0

    def add(self, ids: list[int]) -> int:
        self.backend.prefill(ids)
        return self.ROW

    def remove(self, row: int) -> None:
        pass

    def committed_length(self, row: int) -> int:
        return self.backend.committed_length

    def score(self, trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        return {row: self.backend.score(tree) for row, tree in trees.items()}

    def commit(self, accepted: Mapping[int, Commit]) -> None:
        for scored, path, bonus in accepted.values():
            self.backend.commit(scored, path, bonus)
