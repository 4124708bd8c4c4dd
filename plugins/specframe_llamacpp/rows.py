"""`llamacpp`'s state, written once as rows (`LlamaCppBackend.batch()`): requests (rows) in one llama.cpp
context, each a llama.cpp sequence, every active row's tree scored in one `llama_decode` (in micro-batches
of at most `ubatch` rows, in order), each row's logits those it gets alone, bit for bit. A single request
is a batch of one row (`StateBackend.prefill`, `score`, `commit`).

Sequence ids. llama.cpp numbers a context's sequences 0..S-1 (S = `llama_max_parallel_sequences()`, 256 in
llama-cpp-python 0.3.36). A row owns one id, its slot (`SlottedRows`: active rows hold 0..N-1, and a
removed row's slot is taken by the last one, renamed with a metadata copy), which holds its committed
cells. A step lends each row the ids its tree's extra root-to-leaf paths need (`layout`: one id per path,
the row's own id the first path's), numbered from N up, and takes them back at the commit; the context's
last id (S-1 at most) marks discarded cells. So a step's trees may have S-1 paths in all, one per active
row plus each tree's extra ones: chains never run out (up to S-1 rows); 4 rows of 63-leaf trees fit; a
step needing more is refused before any work (`ConfigurationError`), as a tree of more than `max_leaves`
paths is.
A batch starts in a context of `max_leaves` + 1 ids, all one row needs (a context's compute grows with
its ids, so that a single request does not pay for a batch's), and moves its rows into one of all S ids
the first time a row or a step needs more (`ContextPool`), as it moves them into a larger one.

Cell order. llama.cpp's attention sums a query's visible cells in the order the cache stores them, and
plain decoding stores a row's cells in position order. A freed cell would take a later token, possibly
before accepted cells, so a batch never frees a cell: a commit keeps each row's accepted cells in the row's
sequence and marks the rest with the discarded-cells id, which no query reads (flash attention skips
masked cells, so they change no sum). The occupied cells are then always the first ones, a step's cells
come after every row's earlier ones, and no accepted cell ever moves. When a step's rows would not fit
after the occupied cells, the cache is packed: each row's committed cells are read out
(`LlamaEngine.save`), the cache emptied and the rows written back one after the other; when even the
committed cells and the step would not fit, a context twice as large (or as large as needed) is made
first, and the rows moved into it. The context starts at the backend's `context` option, the positions one
request may use, so memory grows with what the rows hold, and a row is refused, as alone, when its own
positions pass `context`.

Prompts. A row added to a batch that holds no row (its first, or the next of requests decoded one at a
time) empties the context and reads its prompt straight into it, as llama.cpp reads one; a row added
beside others has it read in an empty context of the backend's (`ContextPool.read`) and its cells copied
in, so a row's prompt cells are the bits it would read alone whatever the batch holds.

Padding (the backend's `min_rows`): a step of fewer rows in all is padded with throwaway nodes after the
last row's tree (`TokenTree.padded`), which no real node attends to, so the rows' logits are unchanged.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import numpy as np
import torch

from specframe import ConfigurationError, TargetScores, TokenTree
from specframe.kit.backend import SlottedRow, SlottedRows
from specframe_llamacpp import engine
from specframe_llamacpp.layout import TreeLayout, kept_sequence, tree_layout


class LlamaRows(SlottedRows):
    """Rows of the `llamacpp` backend as sequences of one llama.cpp context (see the module docstring)."""

    one_forward = True

    def __init__(self, backend):
        super().__init__(backend)
        self.pool = backend.contexts
        self.sequences = self.pool.sequences
        self._held = [self.pool.take(self.pool.first)]  # handed back to the pool when the batch is dropped
        weakref.finalize(self, lambda pool=self.pool, held=self._held: pool.give(held[0]))
        self._used = 0  # cells occupied: the first ones of the cache (none is ever freed but by packing)
        self._trees: dict[int, tuple[TreeLayout, list[int]]] = {}  # latest score: layout, sequence ids

    @property
    def engine(self) -> engine.LlamaEngine:
        """The llama.cpp context the rows live in (a larger one once they outgrow it)."""
        return self._held[0]

    # --- rows ------------------------------------------------------------------------------------

    def add(self, ids: list[int]) -> int:
        """Start a row (see the module docstring for how its prompt is read); an uncommitted score is
        discarded, so add rows between a commit and the next score, as the decode loop does."""
        self._discard()
        if len(self.rows) + 1 >= self.sequences:
            raise ConfigurationError(
                f"backend 'llamacpp': a batch holds at most {self.sequences - 2} rows (llama.cpp's "
                f"{self.sequences} sequences, one for discarded cells): decode with a smaller batch_size")
        engine.one_thread(torch.get_num_threads())
        self.backend.check_room(len(ids), "the prompt")
        self._ids(len(self.rows) + 1)
        prefix, slot = np.asarray(ids[:-1], dtype=np.int32), len(self.rows)
        if not self.rows and self.engine.context == self.pool.context:  # alone: read into slot 0, emptied
            self.engine.clear()
            self._used = 0
            self.engine.decode(prefix, np.arange(len(prefix), dtype=np.int32))
        elif len(prefix):
            state = self.pool.read(prefix)
            self._room(len(prefix))
            self.engine.load(slot, state, "a prompt's cells")
        self._used += len(prefix)
        return self.admit(SlottedRow(slot=slot, length=len(prefix), pending=int(ids[-1])))

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
        self._discard()  # a new score discards the previous uncommitted one
        order = sorted(trees, key=lambda row: self.row_state(row).slot)
        layouts = {row: tree_layout(trees[row]) for row in order}
        self._ids(self._check(layouts))
        runs = self._padded(order, trees, layouts)
        total = sum(layout.rows for layout in layouts.values())
        self._room(total)
        tokens, positions, seq_ids = self._inputs(order, runs, layouts)
        outputs = sum(len(trees[row]) + 1 for row in order)  # the padding's logits are not read
        logits = self.engine.decode(tokens, positions, seq_ids, outputs=outputs, rows=self.backend.ubatch)
        self._used += total
        scores, first = {}, 0
        for row in order:
            rows = len(trees[row]) + 1
            scores[row] = TargetScores(logits=torch.from_numpy(logits[first:first + rows]), tree=trees[row],
                                       state=layouts[row])  # (rows, V)
            first += rows
        self._issued = dict(scores)
        return scores

    def forward_rows(self, sizes: Mapping[int, int]) -> list[int]:
        """One forward of every row's root and nodes, padded to `min_rows` (llama.cpp's micro-batches of
        `ubatch` rows are part of what a tree of that many rows costs alone)."""
        return [max(sum(n + 1 for n in sizes.values()), self.backend.min_rows)] if sizes else []

    def _padded(self, order: list[int], trees: Mapping[int, TokenTree],
                layouts: dict[int, TreeLayout]) -> Mapping[int, TokenTree]:
        """The trees as scored: the last row's padded with throwaway nodes until the step has `min_rows`
        rows, as far as that row's positions allow (see the module docstring); its layout updated."""
        if not order:
            return trees
        last = order[-1]
        room = self.backend.context - self.rows[last].length - layouts[last].rows
        pad = min(self.backend.min_rows - sum(layout.rows for layout in layouts.values()), room)
        if pad <= 0:
            return trees
        runs = dict(trees)
        runs[last] = trees[last].padded(pad, self.rows[last].pending)
        layouts[last] = tree_layout(runs[last])
        return runs

    def _check(self, layouts: Mapping[int, TreeLayout]) -> int:
        """Refuse, before any work, a tree of more paths than `max_leaves`, a step of more paths than a
        context's sequences, or a row whose positions would pass `context`; the sequence ids the step
        needs besides the spare."""
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
        return needed

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
        if live + cells > self.engine.cells:
            self._pack(max(2 * self.engine.cells, live + cells), self.engine.sequences)
        else:
            self._pack(None, self.engine.sequences)

    def _ids(self, needed: int) -> None:
        """Make `needed` sequence ids available besides the spare: move the rows into a context with every
        id llama.cpp has when this one has fewer (see `ContextPool`)."""
        if needed > self.engine.sequences - 1:
            self._pack(self.engine.cells, self.pool.sequences)

    def _pack(self, cells: int | None, sequences: int) -> None:
        """Write the rows' committed cells to the front of this context, emptied (`cells` None), or of a new
        one of `cells` cells and `sequences` ids."""
        saved = [(state.slot, self.engine.save(state.slot))
                 for state in sorted(self.rows.values(), key=lambda state: state.slot)]
        if cells is None:
            self.engine.clear()
        else:
            self.pool.give(self.engine)
            self._held[0] = self.pool.make(cells, sequences)
        for slot, state in saved:
            self.engine.load(slot, state, "a row's committed cells")
        self._used = sum(state.length for state in self.rows.values())
