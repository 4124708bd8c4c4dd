"""Slot bookkeeping for a batch backend whose rows live in slots of shared buffers (`kv`'s cache,
`ssm-tree`'s attention keys beside per-row recurrent states): `SlottedRow` is where a row stands,
`SlottedRows` the `BatchBackend` that keeps rows in slots 0..N-1, moves a row into a freed slot, and checks
that a commit redeems exactly the latest scores. Re-exported by `specframe.kit.backend`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specframe.contract.batch import BatchBackend, Commit
from specframe.contract.interfaces import StateBackend
from specframe.terms.records import TargetScores


@dataclass
class SlottedRow:
    """Where a row of a `SlottedRows` batch stands: its slot in the shared buffers, committed length and
    pending root."""

    slot: int
    length: int  # committed tokens, the pending root excluded
    pending: int  # the root of its next tree
    written: int = 0  # columns past `length` its latest scoring wrote (carried along when the row moves)


class SlottedRows(BatchBackend):
    """What a batch of rows in slots of shared buffers keeps, whatever the buffers hold (`kv`'s keys,
    `ssm-tree`'s attention keys beside per-row recurrent states): active rows fill slots 0..N-1, so a step
    reads them as one view; removing a row moves the last slot's row into the freed one (`move_slot`);
    the scores of the latest `score` are issued, and a `commit` must redeem exactly them (`redeem`)."""

    def __init__(self, backend: StateBackend):
        super().__init__(backend)
        self.rows: dict = {}  # row key -> its `SlottedRow` (or a subclass)
        self._next = 0
        self._issued: dict[int, TargetScores] = {}  # what the latest `score` returned, until committed

    def admit(self, state: SlottedRow) -> int:
        """Key a new row whose state sits in slot `len(self.rows)`."""
        row, self._next = self._next, self._next + 1
        self.rows[row] = state
        return row

    def remove(self, row: int) -> None:
        gone = self.row_state(row)
        del self.rows[row]
        self._issued.pop(row, None)
        last = len(self.rows)  # the slot that empties: its row moves into the freed one
        if gone.slot != last:
            mover = next(state for state in self.rows.values() if state.slot == last)
            self.move_slot(last, gone.slot, mover.length + mover.written)
            mover.slot = gone.slot

    def move_slot(self, source: int, target: int, columns: int) -> None:
        """Move the first `columns` columns of slot `source`'s buffers into slot `target`."""

    def committed_length(self, row: int) -> int:
        return self.row_state(row).length

    def row_state(self, row: int) -> SlottedRow:
        if row not in self.rows:
            raise KeyError(f"backend '{self.backend.name}': row {row} is not in this batch (it was removed, "
                           f"or never added); rows now: {sorted(self.rows)}")
        return self.rows[row]

    def advance(self, row: int, path: list[int], bonus: int,
                moves: tuple[list[int], list[int], list[int]]) -> list[int]:
        """Commit `row`'s root and accepted `path` and make `bonus` pending; when the path is a branch
        other than the first chain, the columns whose keys must move go into `moves` (slots, sources,
        targets). Returns the kept columns' tree positions, root first (0, then each node + 1)."""
        state = self.rows[row]
        packed = [0] + [int(i) + 1 for i in path]
        keep = [state.length + i for i in packed]
        target = list(range(state.length, state.length + len(keep)))
        if keep != target:
            moves[0].extend([state.slot] * len(keep))
            moves[1].extend(keep)
            moves[2].extend(target)
        state.length, state.pending, state.written = state.length + len(keep), int(bonus), 0
        return packed

    def redeem(self, accepted: Mapping[int, Commit]) -> None:
        """Raise `ValueError` unless `accepted` commits exactly the rows of the latest `score`, each
        with the scores it returned for that row; then nothing is committable until the next `score`."""
        name = self.backend.name
        missing = sorted(set(self._issued) - set(accepted))
        if missing:
            raise ValueError(f"backend '{name}': rows {missing} were scored but are not in commit(); commit "
                             "every row of the latest score() in one call (an empty path keeps the root "
                             "alone)")
        for row, (scored, _, _) in accepted.items():
            if scored is None or self._issued.get(row) is not scored:
                raise ValueError(
                    f"backend '{name}': commit() was given scores for row {row} other than those of the "
                    "latest score() (a newer score() replaced them, they were committed already, the row "
                    "was not scored, or they come from another backend); commit exactly what the latest "
                    "score() returned")
        self._issued = {}
