"""`llamacpp`'s batch (`LlamaCppBackend.batch()`): several requests (rows) in one llama.cpp context, each a
llama.cpp sequence, every active row's tree scored in one `llama_decode` (in micro-batches of at most
`ubatch` rows, in order), each row's logits those the single-sequence backend gives it alone, bit for bit.

Sequence ids. llama.cpp numbers a context's sequences 0..S-1 (S = `llama_max_parallel_sequences()`, 256 in
llama-cpp-python 0.3.36). A row owns one id, its slot (`SlottedRows`: active rows hold 0..N-1, and a
removed row's slot is taken by the last one, renamed with a metadata copy), which holds its committed
cells. A step lends each row the ids its tree's extra root-to-leaf paths need (`layout`: one id per path,
the row's own id the first path's), numbered from N up, and takes them back at the commit; the last id, S-1,
marks discarded cells. So a step's trees may have S-1 paths in all, one per active row plus each tree's
extra ones: chains never run out (up to S-1 rows); 4 rows of 63-leaf trees fit; a step needing more is
refused before any work (`ConfigurationError`), as a tree of more than `max_leaves` paths is.

Cell order. llama.cpp's attention sums a query's visible cells in the order the cache stores them, and a
row alone stores its cells in position order (`layout.kept_in_place`). In a shared cache a freed cell
would take a later token of any row, possibly before that row's accepted cells, so the batch never frees
a cell: a commit keeps each row's accepted cells in the row's sequence and marks the rest with the
discarded-cells id, which no query reads (flash attention skips masked cells, so they change no sum). The
occupied cells are then always the first ones, a step's cells come after every row's earlier ones, and no
accepted cell ever moves. When a step's rows would not fit after the occupied cells, the cache is packed:
each row's committed cells are read out (`LlamaEngine.save`), the cache emptied and the rows written back
one after the other; when even the committed cells and the step would not fit, a context twice as large
(or as large as needed) is made first, and the rows moved into it. The context starts at the backend's
`context` option, the positions one request may use, so memory grows with what the rows hold, and a row
is refused, as alone, when its own positions pass `context`.

A row's prompt is read by the backend's own single-sequence context (`LlamaCppBackend.prefill`, whose
state that replaces) and its cells copied into the batch's, so they are the bits a row alone reads.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from specframe import ConfigurationError, TargetScores, TokenTree
from specframe.kit.backend import SlottedRow, SlottedRows
from specframe_llamacpp import engine
from specframe_llamacpp.layout import TreeLayout, kept_sequence, tree_layout


class LlamaRows(SlottedRows):
    """Rows of the `llamacpp` backend as sequences of one llama.cpp context (see the module docstring)."""

    one_forward = True

    def __init__(self, backend):
        super().__init__(backend)
        self.sequences = int(engine.llama().llama_max_parallel_sequences())
        self.engine = self._engine(backend.context)
        self._used = 0  # cells occupied: the first ones of the cache (none is ever freed but by packing)
        self._trees: dict[int, tuple[TreeLayout, list[int]]] = {}  # latest score: layout, sequence ids

    def _engine(self, cells: int) -> engine.LlamaEngine:
        """A context of `cells` cells for all S sequences, the last of them marking discarded cells."""
        return engine.LlamaEngine(self.backend.path, context=cells, paths=self.sequences - 1, threads=1)

    # --- rows ------------------------------------------------------------------------------------

    def add(self, ids: list[int]) -> int:
        """Start a row (see the module docstring for how its prompt is read); an uncommitted score is
        discarded, so add rows between a commit and the next score, as the decode loop does."""
        self._discard()
        if len(self.rows) + 1 >= self.sequences:
            raise ConfigurationError(
                f"backend 'llamacpp': a batch holds at most {self.sequences - 2} rows (llama.cpp's "
                f"{self.sequences} sequences, one for discarded cells): decode with a smaller batch_size")
        self.backend.prefill(ids)  # the prompt read as alone (and checked against `context`)
        state = self.backend.engine.save(0)
        length = len(ids) - 1
        self._room(length)
        slot = len(self.rows)
        self.engine.load(slot, state, "a prompt's cells")
        self._used += length
        return self.admit(SlottedRow(slot=slot, length=length, pending=int(ids[-1])))

    def remove(self, row: int) -> None:
        gone = self.row_state(row)
        if row in self._trees:
            _, ids = self._trees.pop(row)
            self.engine.settle(ids, gone.length, None, gone.length)
        self.engine.retire(gone.slot)  # its cells are discarded, not freed
        super().remove(row)

    def move_slot(self, source: int, target: int, columns: int) -> None:
        self.engine.retire(source, into=target)
        for _, ids in self._trees.values():
            if ids[0] == source:
                ids[0] = target

    # --- scoring ---------------------------------------------------------------------------------

    def score(self, trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        import torch

        self._discard()  # a new score discards the previous uncommitted one
        order = sorted(trees, key=lambda row: self.row_state(row).slot)
        layouts = {row: tree_layout(trees[row]) for row in order}
        self._check(layouts)
        total = sum(layout.rows for layout in layouts.values())
        self._room(total)
        tokens, positions, seq_ids = self._inputs(order, trees, layouts)
        logits = self.engine.decode(tokens, positions, seq_ids, outputs=total, rows=self.backend.ubatch)
        self._used += total
        scores, first = {}, 0
        for row in order:
            rows = layouts[row].rows
            scores[row] = TargetScores(logits=torch.from_numpy(logits[first:first + rows]), tree=trees[row],
                                       state=layouts[row])  # (rows, V)
            first += rows
        self._issued = dict(scores)
        return scores

    def forward_rows(self, sizes: Mapping[int, int]) -> list[int]:
        """One forward of every row's root and nodes (llama.cpp's micro-batches of `ubatch` rows are part
        of what a tree of that many rows costs alone); no padding."""
        return [sum(n + 1 for n in sizes.values())] if sizes else []

    def _check(self, layouts: Mapping[int, TreeLayout]) -> None:
        """Refuse, before any work, a tree of more paths than `max_leaves`, a step of more paths than the
        context's sequences, or a row whose positions would pass `context`."""
        backend = self.backend
        for row, layout in layouts.items():
            if layout.paths > backend.max_leaves:
                raise ConfigurationError(
                    f"backend 'llamacpp': a tree of {layout.paths} root-to-leaf paths, and the backend was "
                    f"made for {backend.max_leaves}: pass --backend 'llamacpp(max_leaves={layout.paths})' "
                    "or a smaller budget")
            backend.check_room(self.rows[row].length + layout.rows, f"row {row}'s step")
        needed = len(self.rows) + sum(layout.paths - 1 for layout in layouts.values())
        if needed > self.sequences - 1:
            raise ConfigurationError(
                f"backend 'llamacpp': this step's {len(layouts)} trees need {needed} llama.cpp sequences "
                f"(one per row and one per extra root-to-leaf path) and a context holds "
                f"{self.sequences - 1}: decode with a smaller batch_size, or smaller trees (a smaller "
                "budget, or --backend 'llamacpp(max_leaves=N)' with a smaller N)")

    def _inputs(self, order: list[int], trees: Mapping[int, TokenTree],
                layouts: Mapping[int, TreeLayout]) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
        """The step's rows, row after row (root, then nodes): tokens, positions, sequence ids; lends each
        row the ids of its extra paths, each first made to hold the row's committed cells."""
        tokens, positions, seq_ids = [], [], []
        lent = len(self.rows)  # ids 0..N-1 are the rows' own
        for row in order:
            state, layout = self.rows[row], layouts[row]
            ids = [state.slot, *range(lent, lent + layout.paths - 1)]
            lent += layout.paths - 1
            self.engine.copy(state.slot, ids[1:])
            self._trees[row] = (layout, ids)
            tokens.append([state.pending, *trees[row].tokens.tolist()])
            positions.append(state.length + layout.offsets)
            seq_ids += [[ids[path] for path in paths] for paths in layout.seq_ids]
        return (np.concatenate(tokens).astype(np.int32), np.concatenate(positions).astype(np.int32),
                seq_ids)

    # --- committing ------------------------------------------------------------------------------

    def commit(self, accepted: Mapping[int, tuple[TargetScores, list[int], int]]) -> None:
        self.redeem(accepted)
        for row, (_, path, bonus) in accepted.items():
            layout, ids = self._trees.pop(row)
            start = self.rows[row].length
            self.engine.settle(ids, start, ids[kept_sequence(layout, path)], start + 1 + len(path))
            self.advance(row, path, bonus, ([], [], []))  # accepted cells stay where they are

    def _discard(self) -> None:
        """Drop the trees of an uncommitted score: their cells are discarded, the lent ids taken back."""
        for row, (_, ids) in self._trees.items():
            start = self.rows[row].length
            self.engine.settle(ids, start, None, start)
        self._trees, self._issued = {}, {}

    # --- cells -----------------------------------------------------------------------------------

    def _room(self, cells: int) -> None:
        """Make `cells` free cells after the occupied ones: pack the rows' committed cells to the front,
        in a larger context where those and `cells` would not fit in this one."""
        if self._used + cells <= self.engine.cells:
            return
        live = sum(state.length for state in self.rows.values())
        saved = [(state.slot, self.engine.save(state.slot))
                 for state in sorted(self.rows.values(), key=lambda state: state.slot)]
        if live + cells > self.engine.cells:
            self.engine = self._engine(max(2 * self.engine.cells, live + cells))
        else:
            self.engine.clear()
        for slot, state in saved:
            self.engine.load(slot, state, "a row's committed cells")
        self._used = live
