"""`ssm-tree`'s state (`SSMTreeBackend.batch()`): several sequences (rows) scored in one forward, each as
alone; a single request is one row (the contract's `StateBackend.prefill`, `score`, `commit`).

- `add(ids)` reads the prompt alone (a batch-1 forward of `ids[:-1]` with the unmodified model, so a row's
  prompt state is the bits it would have alone), then keeps that row's recurrent state per layer (conv
  window and SSM / delta-rule state) and copies its attention keys and values, if the model has attention
  layers, into a slot of one shared `RaggedCache` (as `kv`'s rows do: a row's slot holds its committed
  keys in columns [0, length); keys and values each with their own head size, so the latent attention of
  Kimi Linear fits as well).
- `score(trees)` pads every scored row's tree to the widest with a chain of throwaway nodes after its
  last node (`TokenTree.padded`; with one row, up to `min_rows`: no real node has them among its
  ancestors) and runs one forward of shape (R, T). The recurrent layers run their tree forwards
  (`specframe_ssm.mixer.FAMILIES`) over all rows at once: projections on (R, T, D), then the tree conv,
  the tree scan or the tree delta rule of each row from its own committed state and with its own parents
  (`specframe_ssm.tree_ops.over_rows`: one vmapped computation, or the single-tree code itself for one
  row; the Mamba-1 scan and the Triton kernel take the rows in turn). Attention layers get positions
  `length + depth` and a 4D mask (R, 1, T, longest + T) showing each query its own row's committed
  columns, its tree ancestors and itself; the forward writes each row's T new keys at
  [length, length + T) of its slot. Rows whose committed length differs only see different numbers of
  masked columns. Nothing committed is written.
- `commit(accepted)` absorbs each row's own accepted path into that row's recurrent state
  (`TreeFamily.commit`, replay or closed form, option `commit`) and moves the root and accepted keys to
  [length, length + 1 + len(path)) of its slot.

Exactness: a row's logits in a batch are those it gets alone up to float rounding (the batched linears,
the vmapped scan and attention over a longer masked key range sum in another order; under 1e-5 on the
tiny float32 test models, tests/plugins/ssm/test_ssm_rows.py), the same kind of difference as between a
tree's rows and plain steps. A row alone is checked against the unmodified model on every path of its
tree and after every commit (tests/plugins/ssm/test_ssm_backends.py), and greedy output equal to plain
greedy decoding end to end, per row, alone and in batches.

Padding (`min_rows`): a forward of fewer than `min_rows` rows in all has each row's T raised until R * T
reaches it, as `kv`'s rows pad; `forward_rows` reports that one forward of R * T rows to the planner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from specframe import TargetScores, TokenTree
from specframe.kit.backend import RaggedCache, SlottedRow, SlottedRows, additive_mask
from specframe.kit.inference import inference_mode
from specframe_ssm import cache as cache_ops
from specframe_ssm.mixer import FAMILIES, TreeRun, tree_forward_mode
from specframe_ssm.tree_ops import one_row, row_of, tree_rows


@dataclass
class _Row(SlottedRow):
    """Where a row stands (`SlottedRow`: its slot in the shared attention cache, committed length, pending
    root), and its recurrent state."""

    prompt_root: bool = True  # whether the pending token is the prompt's last (`TreeRun.clamped_rows`)
    states: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)


class SSMRows(SlottedRows):
    """Rows of the `ssm-tree` backend scored in one forward per step (see the module docstring)."""

    one_forward = True

    def __init__(self, backend):
        super().__init__(backend)
        from transformers import PretrainedConfig

        self.model, self.device, self.layout = backend.model, backend.target.device, backend.layout
        # The forward's cache: recurrent layers read their state from the `TreeRun`, never from it; each
        # attention layer is a ragged layer holding every row's keys in its slot.
        self.cache = backend._new_cache()
        attention = self.layout.attention
        self.kv = None
        if attention:
            self.kv = RaggedCache(PretrainedConfig(num_hidden_layers=len(attention),
                                                   layer_types=["full_attention"] * len(attention)))
            for idx, layer in zip(attention, self.kv.layers):
                self.cache.layers[idx] = layer

    # --- rows ------------------------------------------------------------------------------------

    @inference_mode
    def add(self, ids: list[int]) -> int:
        prompt = self._read(ids)
        state = _Row(slot=len(self.rows), length=len(ids) - 1, pending=int(ids[-1]), prompt_root=True,
                     states={i: cache_ops.ssm_state(prompt, m) for i, m in self.layout.mixers.items()})
        if self.kv is not None:
            attention = SimpleNamespace(layers=[prompt.layers[i] for i in self.layout.attention])
            self.kv.store(state.slot, attention)
        return self.admit(state)

    def _read(self, ids: list[int]):
        """The cache after one forward of the prompt `ids[:-1]` alone (batch 1) with the unmodified model,
        so a row's prompt state is the same bits whatever else is in the batch."""
        cache = self.backend._new_cache()
        if len(ids) > 1:
            self.backend._feed(cache, 0, ids[:-1], logits_to_keep=1)
        return cache

    @inference_mode
    def move_slot(self, source: int, target: int, columns: int) -> None:
        if self.kv is not None:
            self.kv.move(source, target, columns)

    # --- scoring ---------------------------------------------------------------------------------

    def forward_rows(self, sizes: Mapping[int, int]) -> list[int]:
        """One forward of R rows, each padded to the largest tree and its root (and small forwards to
        `min_rows`): R * T query rows, which the batch planner prices."""
        return [len(sizes) * self._width(sizes)]

    def _width(self, sizes: Mapping[int, int]) -> int:
        """Columns of the forward: the largest tree and its root, or the `min_rows` padding."""
        return max(max(n + 1 for n in sizes.values()), -(-self.backend.min_rows // len(sizes)))

    @inference_mode
    def score(self, trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        self._issued = {}  # a new score discards the previous uncommitted one
        order = sorted(trees, key=lambda row: self.row_state(row).slot)  # consecutive slots read as views
        states = [self.rows[row] for row in order]
        width = self._width({row: len(trees[row]) for row in order})
        padded = [trees[row].padded(width - 1 - len(trees[row]), state.pending)
                  for row, state in zip(order, states)]
        ancestors, conv_index, parents = tree_rows(padded, self.backend.conv_width, self.device)
        run = TreeRun(mask=ancestors, conv_index=conv_index, states=self._stacked_states(states),
                      scan_impl=self.backend.scan, parents=parents,
                      clamped_rows=tuple(int(state.prompt_root) for state in states))
        ids = torch.from_numpy(np.stack([np.concatenate([[state.pending], tree.tokens])
                                         for state, tree in zip(states, padded)])).to(self.device)  # (R, T)
        lengths = np.array([state.length for state in states])
        positions = torch.from_numpy(lengths[:, None] + np.stack([tree.position_offsets for tree in padded]))
        mask = None
        if self.kv is not None:
            mask = self._mask(lengths, ancestors, width)
            self.kv.select([state.slot for state in states], lengths.tolist(), width, self.device)
        want_hidden = self.backend.want_hidden
        with tree_forward_mode(self.layout.mixers, run, self.layout.kinds):
            out = self.backend._forward(ids, positions.to(self.device), self.cache, mask,
                                        output_hidden_states=want_hidden)
        for i, (row, state) in enumerate(zip(order, states)):
            state.written = width
            n = len(trees[row]) + 1
            hidden = out.hidden_states[-1][i, :n] if want_hidden else None
            self._issued[row] = TargetScores(logits=out.logits[i, :n].float(), hidden=hidden, tree=trees[row],
                                             state=(run, i))
        return dict(self._issued)

    def _stacked_states(self, states: list[_Row]) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
        """Each recurrent layer's (conv (R, Cd, K), state (R, ...) or None) for the rows `states`. A row
        with no state yet (a one-token prompt) gets zeros beside rows that have one: the tree forwards and
        commits treat None as the zero state, and adding a zero changes no bit."""
        if len(states) == 1:  # one row: its own tensors, viewed with a leading row
            return {idx: one_row(states[0].states[idx]) for idx in self.layout.mixers}
        out = {}
        for idx in self.layout.mixers:
            convs = [state.states[idx][0] for state in states]
            hs = [state.states[idx][1] for state in states]
            present = [h for h in hs if h is not None]
            if not present:
                out[idx] = torch.stack(convs), None
                continue
            dtype = present[0].dtype
            for h in present:
                dtype = torch.promote_types(dtype, h.dtype)  # a state committed fresh is float32
            like = present[0]
            out[idx] = torch.stack(convs), torch.stack([
                (torch.zeros(like.shape, dtype=dtype, device=like.device) if h is None else h.to(dtype))
                for h in hs])
        return out

    def _mask(self, lengths: np.ndarray, ancestors: torch.Tensor, width: int) -> torch.Tensor:
        """(R, 1, T, longest + T) additive mask: each row's committed columns [0, length), then its tree's
        ancestors-or-self at [length, length + T); every other column (another row's longer prefix,
        stale keys past a row's own) masked."""
        longest = int(lengths.max())
        allowed = torch.zeros(len(lengths), width, longest + width, dtype=torch.bool, device=self.device)
        for i, length in enumerate(lengths.tolist()):
            allowed[i, :, :length] = True
            allowed[i, :, length:length + width] = ancestors[i]
        return additive_mask(allowed, self.model.dtype)

    # --- committing ------------------------------------------------------------------------------

    @inference_mode
    def commit(self, accepted: Mapping[int, tuple[TargetScores, list[int], int]]) -> None:
        self.redeem(accepted)
        moves = ([], [], [])  # slots, sources, targets of the attention keys a branch moves
        for row, (scored, path, bonus) in accepted.items():
            state = self.rows[row]
            run, i = scored.state
            packed = self.advance(row, path, bonus, moves)  # root first, then the accepted nodes
            state.prompt_root = False
            index = torch.tensor(packed, device=self.device)
            for idx, layer in self.layout.mixers.items():
                commit = FAMILIES[self.layout.kinds[idx]].commit
                conv, h = commit(layer, row_of(run.states[idx], i), row_of(run.saved[idx], i), index,
                                 self.backend.commit_rule)
                state.states[idx] = _as_committed(state.states[idx], conv, h)
        if moves[0] and self.kv is not None:
            self.kv.gather(*moves, self.device)


def _as_committed(old: tuple[torch.Tensor, torch.Tensor | None], conv: torch.Tensor,
                  h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The new (conv, state) in the dtypes transformers' cache would hold them: that of the state it
    replaces, or as computed for a row's first state."""
    conv = conv.to(old[0].dtype)
    if h is not None and old[1] is not None:
        h = h.to(old[1].dtype)
    return conv, h
