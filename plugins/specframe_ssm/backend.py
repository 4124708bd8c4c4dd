"""`ssm-tree`: STree's tree-scan state backend for Mamba2 and gated DeltaNet models, and their hybrids, and
what it shares with `ssm-unrolled` (`SSMBackendBase`).

`ssm-tree` is written once, in its rows form (`specframe_ssm.rows.SSMRows`, returned by `batch()`):
several sequences whose trees are scored in one forward of the unmodified model with every recurrent
layer swapped for its tree forward (tree conv along parent chains, then the tree scan, or the tree delta
rule, from each row's committed state); attention layers get the 4D ancestor mask and positions
`prefix + depth` and read each row's committed keys from a shared ragged cache. Nothing committed is
written by scoring; a commit writes the accepted path into each row's conv and recurrent states
(activation replay or the closed form, option `commit`) and moves its accepted keys. A single request is
a batch of one row (`StateBackend.prefill`, `score`, `commit`). This module holds what every row shares:
the options, which models the backend serves, its cost model, the rows a forward is padded to and the
model call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from specframe import BackendCapabilities, ConfigurationError, CostModel, StateBackend, UnsupportedModelError

if TYPE_CHECKING:  # imported where it is used, so that registering the backends loads no torch
    import torch

# The keys of COMMIT_RULES (tests/plugins/ssm/test_ssm_cost.py checks).
CommitRule = Literal["replay", "closed"]
ScanImpl = Literal["auto", "torch", "triton"]  # specframe_kernels.tree_scan impl: auto = Triton on CUDA
SCANS = get_args(ScanImpl)


class SSMBackendBase(StateBackend):
    """What both SSM backends share: model checks, the cost model, a fresh cache, the model call with
    explicit positions, and a plain sequence fed after a cache's state (a prompt, or `ssm-unrolled`'s
    commit)."""

    capabilities = BackendCapabilities(supports_trees=True, provides_hidden_states=True,
                                       fresh_state_per_copy=True)  # a sequence starts in a new cache
    min_rows = 1  # rows every forward is padded to (root included); 1: no padding

    def __init__(self, target, *, want_hidden: bool = False, calibration=None):
        from specframe_ssm.layout import inspect_layout

        super().__init__(target, want_hidden=want_hidden, calibration=calibration)
        reason = self.unsupported_reason(target)
        if reason:
            raise UnsupportedModelError(f"backend '{self.name}' cannot serve model '{target.name}': {reason}")
        self.model = target.model
        self.layout = inspect_layout(self.model)

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

    def _feed(self, cache, prefix: int, tokens: list[int], **extra):
        """Feed `tokens` as one plain sequence after the `prefix` tokens `cache` holds (batch 1), with the
        unmodified model, extending `cache`."""
        import torch

        device = self.target.device
        ids = torch.tensor([tokens], device=device)  # (1, m)
        positions = prefix + torch.arange(len(tokens), device=device)[None]  # (1, m)
        mask = None
        if self.layout.hybrid:
            from specframe.kit.backend import additive_mask

            mask = additive_mask(chain_allowed(prefix, len(tokens), 1, device), self.model.dtype)
        return self._forward(ids, positions, cache, mask, **extra)


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

    def batch(self):
        """Every row's tree in one forward (`specframe_ssm.rows.SSMRows`). A single request is this with
        one row (`StateBackend.prefill`)."""
        from specframe_ssm.rows import SSMRows  # imports torch: not at registration

        return SSMRows(self)
