"""`kv`'s state (`KVCacheBackend.batch()`): several sequences (rows) scored in one forward, each as alone; a
single request is one row.

All rows share one cache (`specframe.kit.backend.RaggedCache`): per layer a buffer of (slots, kv_heads,
columns, head_dim) where a row's slot holds its committed keys and values in columns [0, length). Active
rows fill slots 0..N-1: removing a row moves the last slot's row into the freed one (one copy of that
row), so a step that scores every row reads the buffers as views, without gathering the rows.

- `add(ids)` reads the prompt alone (a batch-1 forward of `ids[:-1]`), so a row's prompt keys are the
  bits it would have alone, then copies them into a free slot. A row with the same prompt as the row
  added just before it (the samples of best-of-n) copies that prompt's keys instead of reading it again.
  With `want_hidden` the same forward gives the prompt's features, which the row's first scores carry
  (`TargetScores.prompt_hidden`).
- `score(trees)` runs one forward of shape (R, T) over the R rows given (rows left out idle and are not
  computed): T is 1 + the largest of their trees, each row's input its pending root, its tree's tokens and
  throwaway padding, at positions `length + depth`. A 4D additive mask (R, 1, T, K) shows each query its
  own row's committed prefix, its tree ancestors and itself; padding queries see only themselves (no row
  is wholly masked, so no NaN) and nobody sees them; columns past a row's own are masked. The forward
  writes each row's T new keys at [length, length + T) of its slot; they stay there until `commit`
  keeps the accepted ones.
- `commit(accepted)` moves each row's root and accepted nodes to [length, length + 1 + len(path)) with
  one indexed copy per layer for all rows, and makes each bonus token pending.

How rows stay exact across batch shapes. A row's logits must not depend on which other rows, or how
many, share its forward. In bfloat16 on the CPU (`specframe_exact` attention and row-invariant packed
linears, see `specframe.kit.backend.exact_rows`) every batch row's attention is computed from its own
queries, keys and mask slice with float64 sums, and the linears give each of a product's rows the bits it
gets alone for up to `exact_rows(model)` rows: the rows of all sequences of a forward together. So the
rows are split into several forwards, each of whole rows, at most that many rows each (a row whose tree
alone is larger is scored by itself in chunks of forwards, in order, each reading the chunks before it from
the cache), and each row's logits are then those it gets in a batch of one, bit for bit
(tests/plugins/kv/test_kv_rows.py checks it). In float32 (`specframe_sdpa`, torch's kernels) nothing is
split: a row's logits in a batch differ from those alone in the last bits (about 1e-6 on the tiny test
models), as a tree's rows differ from plain steps.

Padding (`KVCacheBackend.min_rows`): a CPU multiplies 1 or 2 rows more slowly than 4, so a forward of
fewer than `min_rows` rows in all is padded, each row's T raised until R * T reaches `min_rows` (never past
the exact-rows limit); a batch of `min_rows` rows or more is not padded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from specframe import TargetScores, TokenTree
from specframe.kit.backend import RaggedCache, SlottedRow, SlottedRows, additive_mask, buffered_cache
from specframe.kit.inference import inference_mode


@dataclass
class KVRow(SlottedRow):
    """A row of `KVRows`: where it stands, and its prompt's features until its first scores carry them."""

    prompt_hidden: torch.Tensor | None = None  # (P - 1, F), kept when the backend wants hidden states


class KVRows(SlottedRows):
    """Rows of the `kv` backend sharing one cache and one forward per step (see the module docstring)."""

    one_forward = True

    def __init__(self, backend):
        super().__init__(backend)
        self.model, self.device = backend.model, backend.target.device
        self.cache = RaggedCache(self.model.config)
        # the latest prompt read, its keys, and its features when wanted
        self._prompt: tuple[list[int], object, torch.Tensor | None] | None = None

    # --- rows ------------------------------------------------------------------------------------

    @inference_mode
    def add(self, ids: list[int]) -> int:
        if self._prompt is None or self._prompt[0] != list(ids):  # best-of-n rows read it once
            self._prompt = (list(ids), *self._read(ids))
        state = KVRow(slot=len(self.rows), length=len(ids) - 1, pending=int(ids[-1]),
                      prompt_hidden=self._prompt[2])
        self.cache.store(state.slot, self._prompt[1])
        return self.admit(state)

    def _read(self, ids: list[int]) -> tuple[object, torch.Tensor | None]:
        """The keys and values of `ids[:-1]` from one forward of that prompt alone (batch 1), so a row's
        prompt keys are the same bits whatever else is in the batch; with `want_hidden`, the (P - 1, F)
        features of those tokens from the same forward."""
        cache = buffered_cache(self.model.config)
        want = self.backend.want_hidden
        if len(ids) < 2:
            return cache, None
        prefix = torch.tensor([ids[:-1]], device=self.device)  # (1, P)
        out = self.model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=want)
        return cache, self._features(out.hidden_states)[0] if want else None

    def _features(self, states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(R, T, F) the hidden states the backend hands out: the final one, or `hidden_layers` joined."""
        layers = self.backend.hidden_layers
        return states[-1] if layers is None else torch.cat([states[i] for i in layers], dim=-1)

    @inference_mode
    def move_slot(self, source: int, target: int, columns: int) -> None:
        self.cache.move(source, target, columns)

    # --- scoring ---------------------------------------------------------------------------------

    @inference_mode
    def score(self, trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        self._issued = {}  # a new score discards the previous uncommitted one
        order = sorted(trees, key=lambda row: self.row_state(row).slot)  # consecutive slots read as views
        scores: dict[int, TargetScores] = {}
        for group in self._groups(order, {row: len(tree) for row, tree in trees.items()}):
            scores.update(self._score_group(group, trees))
        self._issued = {row: scores[row] for row in trees}
        return dict(self._issued)

    def forward_rows(self, sizes: Mapping[int, int]) -> list[int]:
        """The query rows of each forward `score` runs for trees of `sizes[row]` nodes: every row of a
        forward is padded to its largest tree (and small forwards to `min_rows`), which the batch planner
        prices, so nodes that fill a row up to the widest cost nothing."""
        order = sorted(sizes, key=lambda row: self.row_state(row).slot)
        return [len(group) * self._width(group, sizes) for group in self._groups(order, sizes)]

    def _groups(self, order: list[int], sizes: Mapping[int, int]) -> Iterator[list[int]]:
        """`order` cut into runs of whole rows whose forward keeps to `max_rows` rows in all (each row
        padded to the run's largest tree); a row whose tree alone exceeds it runs by itself."""
        limit, group, width = self.backend.max_rows, [], 0
        for row in order:
            need = sizes[row] + 1
            if group and limit and (len(group) + 1) * max(width, need) > limit:
                yield group
                group, width = [], 0
            group.append(row)
            width = max(width, need)
        if group:
            yield group

    def _score_group(self, rows: list[int], trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        """Scores of `rows` from one forward (or, for one row over the limit, several in order)."""
        limit, count = self.backend.max_rows, len(rows)
        width = self._width(rows, {row: len(trees[row]) for row in rows})
        ids, positions, mask = self._inputs(rows, trees, width)
        chunk = max(limit // count, 1) if limit else width
        outs = [self._forward(rows, ids, positions, mask, start, min(start + chunk, width))
                for start in range(0, width, chunk)]
        logits = torch.cat([out[0] for out in outs], dim=1)  # (R, T, V)
        hidden = torch.cat([out[1] for out in outs], dim=1) if self.backend.want_hidden else None  # (R, T, H)
        scores = {}
        for i, row in enumerate(rows):
            self.rows[row].written = width
            n = len(trees[row]) + 1
            scores[row] = TargetScores(logits=logits[i, :n].float(), tree=trees[row],
                                       hidden=None if hidden is None else hidden[i, :n],
                                       prompt_hidden=self.rows[row].prompt_hidden)
            self.rows[row].prompt_hidden = None  # handed out once, with the row's first scores
        return scores

    def _width(self, rows: list[int], sizes: Mapping[int, int]) -> int:
        """Columns of one forward over `rows`: the largest tree and its root, or the `min_rows` padding."""
        limit, count = self.backend.max_rows, len(rows)
        pad_to = -(-self.backend.min_rows // count)  # see the module docstring
        if limit:
            pad_to = min(pad_to, max(limit // count, 1))
        return max(max(sizes[row] + 1 for row in rows), pad_to)

    def _inputs(self, rows: list[int], trees: Mapping[int, TokenTree],
                width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input ids and positions (R, T), and the additive mask (R, 1, T, longest + T) of `rows`."""
        states = [self.rows[row] for row in rows]
        longest = max(state.length for state in states)
        ids = np.empty((len(rows), width), np.int64)
        positions = np.empty((len(rows), width), np.int64)
        allowed = np.zeros((len(rows), width, longest + width), bool)
        for i, (state, tree) in enumerate(zip(states, (trees[row] for row in rows))):
            n, start = len(tree) + 1, state.length
            ids[i], ids[i, 1:n] = state.pending, tree.tokens
            positions[i], positions[i, :n] = start, start + tree.position_offsets
            allowed[i, :n, :start] = True  # the committed prefix
            allowed[i, :n, start:start + n] = tree.ancestor_mask  # ancestors and itself
            padding = np.arange(n, width)
            allowed[i, padding, start + padding] = True  # a throwaway row sees itself alone
        dtype = self.model.dtype
        mask = additive_mask(torch.from_numpy(allowed), dtype)
        return (torch.from_numpy(ids).to(self.device), torch.from_numpy(positions).to(self.device),
                mask.to(self.device))

    def _forward(self, rows: list[int], ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                 start: int, end: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over columns `start:end` of every row's input, written to the rows' slots: logits
        (R, end - start, V) and last hidden states when wanted."""
        states = [self.rows[row] for row in rows]
        self.cache.select([state.slot for state in states], [state.length + start for state in states],
                          end - start, self.device)
        keys = max(state.length for state in states) + end
        out = self.model(input_ids=ids[:, start:end], position_ids=positions[:, start:end],
                         attention_mask=mask[..., start:end, :keys], past_key_values=self.cache,
                         use_cache=True, output_hidden_states=self.backend.want_hidden)
        return out.logits, self._features(out.hidden_states) if self.backend.want_hidden else None

    # --- committing ------------------------------------------------------------------------------

    @inference_mode
    def commit(self, accepted: Mapping[int, tuple[TargetScores, list[int], int]]) -> None:
        self.redeem(accepted)
        moves = ([], [], [])  # slots, sources, targets of the keys a branch moves
        for row, (_, path, bonus) in accepted.items():
            self.advance(row, path, bonus, moves)
        if moves[0]:
            self.cache.gather(*moves, self.device)
