"""`ssm-tree`: STree's tree-scan state backend for Mamba2 and gated DeltaNet models, and their hybrids.

`score` runs the unmodified model with every recurrent layer swapped for its tree forward (tree conv
along parent chains, then the tree scan, or the tree delta rule, from the committed state); attention
layers get the 4D ancestor mask and
positions `prefix + depth` and append the tree's keys/values after the committed ones. Nothing committed
is written. `commit` writes the accepted path into the conv and SSM states (activation replay or the
closed form, option `commit`) and compacts the attention KV.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

from specframe import (
    BackendCapabilities, ConfigurationError, CostModel, StateBackend, TargetScores, TokenTree,
    UnsupportedModelError,
)
from specframe.kit.inference import inference_mode

if TYPE_CHECKING:  # imported where they are used, so that registering the backends loads no torch
    import torch

    from specframe_ssm.mixer import TreeRun

# The keys of COMMIT_RULES (tests/plugins/ssm/test_ssm_cost.py checks).
CommitRule = Literal["replay", "closed"]
ScanImpl = Literal["auto", "torch", "triton"]  # specframe_kernels.tree_scan impl: auto = Triton on CUDA
SCANS = get_args(ScanImpl)


class SSMBackendBase(StateBackend):
    """What both SSM backends share: model checks, prefill, and the model call with explicit positions."""

    capabilities = BackendCapabilities(supports_trees=True, provides_hidden_states=True,
                                       fresh_state_per_copy=True)  # prefill makes a new cache
    min_rows = 1  # rows every forward is padded to (root included); 1: no padding

    def __init__(self, target, *, want_hidden: bool = False, calibration=None):
        from specframe_ssm.layout import inspect_layout

        super().__init__(target, want_hidden=want_hidden, calibration=calibration)
        reason = self.unsupported_reason(target)
        if reason:
            raise UnsupportedModelError(f"backend '{self.name}' cannot serve model '{target.name}': {reason}")
        self.model = target.model
        self.layout = inspect_layout(self.model)
        self.cache = None
        self._committed = 0
        self._pending: int | None = None
        self._prompt_root = False  # whether the pending token is the prompt's last

    @classmethod
    def unsupported_reason(cls, target) -> str | None:
        """Why the SSM backends cannot run the model (`specframe_ssm.layout.unsupported_reason`); the
        registry adds which installed backend serves it instead, if any (an attention-only model: 'kv')."""
        from specframe_ssm.layout import unsupported_reason

        return unsupported_reason(target.model)

    def cost_model(self) -> CostModel:
        """The cost measured for this backend on this machine (`specframe calibrate`), handed to it when
        it was built (`calibration.cost`), else the reference CPU fit of this backend for the target's
        kind, scaled by its layers and width and padded as this backend pads small trees
        (`specframe_ssm.cost`)."""
        from specframe_ssm.cost import default_cost_model

        return self.calibration.cost or default_cost_model(self.name, self.model, self.min_rows)

    def cost_options(self) -> dict:
        """The attention cache kind, so calibrations stored before attention layers appended in place
        (`specframe.kit.backend.buffered_cache`) are measured again."""
        return {"attention_cache": "buffer"}

    @property
    def committed_length(self) -> int:
        return self._committed

    def _new_cache(self):
        """transformers' cache for the model, its attention layers appending in place
        (`specframe.kit.backend.buffered_cache`; recurrent layers as transformers builds them)."""
        from specframe.kit.backend import buffered_cache

        return buffered_cache(self.model.config)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None = None,
                 **extra):
        """Run the model on ids (B, T) at absolute positions (B, T), reading and extending `cache`."""
        kwargs = {self.layout.cache_kwarg: cache, "use_cache": True, **extra}
        if self.layout.takes_positions:
            kwargs["position_ids"] = positions  # Bamba would otherwise restart positions at 0
        if mask is not None:
            kwargs["attention_mask"] = mask
        return self.model(input_ids=ids, **kwargs)

    @inference_mode
    def prefill(self, ids: list[int]) -> None:
        self.cache = self._new_cache()
        self._committed, self._pending = 0, int(ids[-1])
        self._prompt_root = True  # the pending token is the prompt's last (see `TreeRun.clamped_rows`)
        if len(ids) > 1:
            self._append_chain(ids[:-1], logits_to_keep=1)

    def _append_chain(self, tokens: list[int], **extra):
        """Feed `tokens` as a plain sequence after the committed state with the unmodified model."""
        import torch

        device, prefix = self.target.device, self._committed
        ids = torch.tensor([tokens], device=device)  # (1, m)
        positions = prefix + torch.arange(len(tokens), device=device)[None]  # (1, m)
        mask = None
        if self.layout.hybrid:
            from specframe.kit.backend import additive_mask

            mask = additive_mask(chain_allowed(prefix, len(tokens), 1, device), self.model.dtype)
        out = self._forward(ids, positions, self.cache, mask, **extra)
        self._committed = prefix + len(tokens)
        return out


def chain_allowed(prefix: int, length: int, batch: int, device) -> torch.Tensor:
    """(B, m, P + m) bool: every row sees the prefix and the causal part of its own sequence."""
    import torch

    allowed = torch.ones(batch, length, prefix + length, dtype=torch.bool, device=device)
    allowed[:, :, prefix:] = torch.tril(allowed[0, :, prefix:])
    return allowed


class SSMTreeBackend(SSMBackendBase):
    """Packed-tree verification on Mamba2, gated DeltaNet and hybrid models (STree). Options: `commit` =
    "replay" or "closed" (how the recurrent state absorbs the accepted path), `scan` = "auto", "torch" or
    "triton" (the Mamba2 tree scan), `min_rows` (rows every forward is padded to, a plain step included,
    as the `kv` backend pads; by default on a CPU 4 where the calibration handed to it measured that no
    slower for the model, else 1, and 1 elsewhere: `specframe.kit.backend.forward_min_rows`; 1 turns
    padding off).

    The padding is a chain of throwaway nodes after the tree's last node: no tree node has it among its
    ancestors, so neither attention nor the tree scan carries it into a real row, and `commit` reads only
    the accepted path's rows."""

    name = "ssm-tree"

    def __init__(self, target, *, want_hidden: bool = False, calibration=None, commit: CommitRule = "replay",
                 scan: ScanImpl = "auto", min_rows: int | None = None):
        from specframe.kit.backend import forward_min_rows, pads_by_measurement
        from specframe.kit.models import linear_kernel
        from specframe_ssm.mixer import COMMIT_RULES

        if commit not in COMMIT_RULES:
            raise ConfigurationError(f"backend 'ssm-tree': commit must be one of {sorted(COMMIT_RULES)}, "
                                     f"got {commit!r}")
        if scan not in SCANS:
            raise ConfigurationError(f"backend 'ssm-tree': scan must be one of {list(SCANS)}, got {scan!r}")
        super().__init__(target, want_hidden=want_hidden, calibration=calibration)
        self.commit_rule, self.scan = commit, scan
        linear = linear_kernel(target.model)
        self._measured_padding = pads_by_measurement(min_rows, target.device, linear)
        # The scan's work grows with the rows: without a calibration, not padded (it doubled a plain step
        # of a Bamba-style model at hidden size 1024, one thread).
        self.min_rows = forward_min_rows(min_rows, target.device, self.name, linear,
                                         calibrated=self.calibration.min_rows)
        widths = {m.conv_kernel_size for m in self.layout.mixers.values()}
        if len(widths) != 1:
            raise UnsupportedModelError(
                f"backend 'ssm-tree': the mixers use different conv widths {sorted(widths)}")
        self.conv_width = widths.pop()

    def cost_options(self) -> dict:
        """The commit rule and the scan change what a step costs: each is calibrated apart."""
        return {**super().cost_options(), "commit": self.commit_rule, "scan": self.scan,
                "min_rows": "auto" if self._measured_padding else self.min_rows}

    def pads_by_measurement(self) -> bool:
        """Whether `min_rows` was left to calibration: not given, on a CPU, with linears that are not
        `stream` (`specframe.kit.backend.pads_by_measurement`)."""
        return self._measured_padding

    @inference_mode
    def score(self, tree: TokenTree) -> TargetScores:
        rows = len(tree) + 1
        out = self._run(tree.padded(self.min_rows - rows, self._pending))
        hidden = None if out.hidden is None else out.hidden[:rows]
        return self.issue(TargetScores(logits=out.logits[:rows], hidden=hidden, tree=tree, state=out.state))

    def _run(self, tree: TokenTree) -> TargetScores:
        """The forward over the packed `tree` after the committed state: every row's logits, and in
        `state` each mixer's per-node activations, all `commit` needs to absorb any path."""
        import torch
        from specframe_ssm import cache as cache_ops
        from specframe_ssm.mixer import TreeRun, tree_forward_mode
        from specframe.kit.backend import additive_mask
        from specframe_ssm.tree_ops import one_row, tree_rows

        cache_ops.crop_kv(self.cache, self.layout.attention, self._committed)  # drop an earlier scoring
        device, prefix = self.target.device, self._committed
        ids = torch.from_numpy(np.concatenate([[self._pending], tree.tokens]))[None].to(device)  # (1, T)
        positions = torch.from_numpy(prefix + tree.position_offsets)[None].to(device)  # (1, T)
        ancestors, conv_index, parents = tree_rows([tree], self.conv_width, device)
        states = {i: one_row(cache_ops.ssm_state(self.cache, m)) for i, m in self.layout.mixers.items()}
        run = TreeRun(mask=ancestors, conv_index=conv_index, states=states, scan_impl=self.scan,
                      parents=parents, clamped_rows=(int(self._prompt_root),))
        mask = None
        if self.layout.hybrid:
            allowed = torch.ones(1, len(tree) + 1, prefix + len(tree) + 1, dtype=torch.bool, device=device)
            allowed[:, :, prefix:] = ancestors
            mask = additive_mask(allowed, self.model.dtype)  # (1, 1, T, P + T)
        with tree_forward_mode(self.layout.mixers, run, self.layout.kinds):
            out = self._forward(ids, positions, self.cache, mask, output_hidden_states=self.want_hidden)
        hidden = out.hidden_states[-1][0] if self.want_hidden else None  # (T, D)
        return TargetScores(logits=out.logits[0].float(), hidden=hidden, tree=tree, state=run)

    def batch(self):
        """Every row's tree in one forward (`specframe_ssm.rows.SSMRows`), or the rows one after the other
        (`RowByRow`) where the batch cannot hold the model's attention state (`rows_refusal`)."""
        from specframe_ssm.rows import SSMRows, rows_refusal

        return super().batch() if rows_refusal(self.model) else SSMRows(self)

    @inference_mode
    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        import torch
        from specframe_ssm import cache as cache_ops
        from specframe_ssm.mixer import FAMILIES
        from specframe_ssm.tree_ops import row_of

        self.redeem(scored)
        run: TreeRun = scored.state
        packed = [0] + [int(i) + 1 for i in path]  # root first, then the accepted nodes
        index = torch.tensor(packed, device=self.target.device)
        for idx, layer in self.layout.mixers.items():
            commit = FAMILIES[self.layout.kinds[idx]].commit
            new_conv, new_state = commit(layer, row_of(run.states[idx], 0), row_of(run.saved[idx], 0), index,
                                         self.commit_rule)
            cache_ops.write_ssm_state(self.cache, layer, new_conv, new_state)
        start = self._committed
        cache_ops.compact_kv(self.cache, self.layout.attention, start, [start + i for i in packed])
        self._committed = start + len(packed)
        self._pending, self._prompt_root = int(bonus), False

