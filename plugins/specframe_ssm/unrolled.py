"""`ssm-unrolled`: the STree paper's baseline. The tree is unrolled into its root-to-leaf paths, which run
as one batch of plain sequences on a batched copy of the committed state with the unmodified model.

Shared prefixes are recomputed once per path and the committed state (SSM states, attention KV) is
copied per path; that redundancy is what the packed tree scan removes. Because no intermediate SSM
state survives a batched scan, `commit` re-feeds the root and the accepted path as one chain.
It only uses the model's own forward, so it also serves as a test oracle for `ssm-tree`. It is written for
one sequence (`prefill`, `score`, `commit`): a batch is one copy per row, scored one after the other
(`RowByRow`, the contract's default).

Mamba2-type mixers clamp their time steps to `time_step_limit` in transformers' multi-token forward but
not in its one-token step. Plain greedy decoding feeds the prompt in one forward and every new token
alone, so of the tokens this backend feeds only the prompt's last is clamped: `decoding_time_steps`.
"""

from __future__ import annotations

import contextlib
import copy
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from specframe import TargetScores, TokenTree
from specframe.kit.inference import inference_mode
from specframe_ssm.backend import SSMBackendBase, chain_allowed

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the backend loads none
    import torch

UNLIMITED = (0.0, float("inf"))  # clamps nothing: a softplus is never negative


def repeat_batch(tensor, batch: int):
    return tensor.repeat(batch, *[1] * (tensor.dim() - 1))


def batched_copy(cache, batch: int):
    """A deep copy of `cache` with every state repeated `batch` times along the batch dimension."""
    out = copy.deepcopy(cache)
    for layer in out.layers:  # a layer may hold both (Falcon-H1's parallel attention and Mamba2)
        if hasattr(layer, "conv_states") and layer.has_previous_state[0]:
            layer.conv_states[0] = repeat_batch(layer.conv_states[0], batch)  # (B, Cd, K)
            if layer.recurrent_states[0] is not None:  # (B, H, P, N); LFM2's short convs have none
                layer.recurrent_states[0] = repeat_batch(layer.recurrent_states[0], batch)
        if getattr(layer, "is_initialized", False) and getattr(layer, "keys", None) is not None \
                and layer.keys.numel():
            layer.keys = repeat_batch(layer.keys, batch)  # (B, H_kv, S, d)
            layer.values = repeat_batch(layer.values, batch)
    return out


@contextlib.contextmanager
def decoding_time_steps(mixers: list[torch.nn.Module], clamp_first: bool):
    """Within the block, the Mamba2-type `mixers` clamp time steps as plain decoding does: only the first
    token of each sequence, and only when `clamp_first` (it is the prompt's last), as if fed with the
    prompt; every other token unclamped, as if fed alone.

    Their `time_step_limit` is lifted, and with `clamp_first` a hook on `in_proj` rewrites the first
    token's dt inputs where the limit binds, to those whose softplus is the clamped time step."""
    limits = {m: tuple(m.time_step_limit) for m in mixers if tuple(m.time_step_limit) != UNLIMITED}
    hooks = []
    try:
        for mixer, limit in limits.items():
            mixer.time_step_limit = UNLIMITED
            if clamp_first:
                hooks.append(mixer.in_proj.register_forward_hook(partial(_clamp_first_dt, mixer, limit)))
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for mixer, limit in limits.items():
            mixer.time_step_limit = limit


def _clamp_first_dt(mixer, limit: tuple[float, float], module, args, projected: torch.Tensor) -> torch.Tensor:
    """`in_proj`'s output (B, W, F) with the dt inputs (its last H columns) of token 0 replaced, where
    `limit` binds, by those whose softplus after `dt_bias` is the clamped time step."""
    import torch

    heads = mixer.num_heads
    scale = 1.0
    if hasattr(mixer, "mup_vector"):  # Falcon-H1 scales in_proj's output before reading dt from it
        scale = mixer.mup_vector.reshape(-1)[-heads:].float()  # (H,)
    raw = projected[:, 0, -heads:].float() * scale + mixer.dt_bias.float()  # (B, H)
    dt = torch.nn.functional.softplus(raw)
    clamped = dt.clamp(min=limit[0], max=limit[1])
    inverse = clamped + torch.log(-torch.expm1(-clamped))  # softplus(inverse) == clamped
    wanted = (inverse - mixer.dt_bias.float()) / scale  # (B, H)
    out = projected.clone()
    out[:, 0, -heads:] = torch.where(clamped != dt, wanted.to(out.dtype), projected[:, 0, -heads:])
    return out


class SSMUnrolledBackend(SSMBackendBase):
    """Scores each root-to-leaf path as its own sequence in one batch (no options)."""

    name = "ssm-unrolled"

    def __init__(self, target, *, want_hidden: bool = False, calibration=None):
        super().__init__(target, want_hidden=want_hidden, calibration=calibration)
        self.cache = None  # transformers' cache of the one sequence, built by `prefill`
        self._committed = 0
        self._pending: int | None = None
        self._prompt_root = False  # whether the pending token is the prompt's last

    @classmethod
    def unsupported_reason(cls, target) -> str | None:
        from specframe_ssm.layout import MAMBA1, inspect_layout

        reason = super().unsupported_reason(target)
        if reason is None and MAMBA1 in inspect_layout(target.model).kinds.values():
            return ("its Mamba-1 mixers run a multi-token forward from a zero state in transformers (their "
                    "selective scan takes no initial state), so a path cannot be scored as a sequence after "
                    "the prefix")
        return reason

    @property
    def committed_length(self) -> int:
        return self._committed

    @inference_mode
    def prefill(self, ids: list[int]) -> None:
        self.cache = self._new_cache()
        self._committed, self._pending = 0, int(ids[-1])
        self._prompt_root = True  # the pending token is the prompt's last (see `decoding_time_steps`)
        if len(ids) > 1:
            self._append_chain(ids[:-1], logits_to_keep=1)

    def _append_chain(self, tokens: list[int], **extra):
        """Feed `tokens` as a plain sequence after the committed state with the unmodified model."""
        out = self._feed(self.cache, self._committed, tokens, **extra)
        self._committed += len(tokens)
        return out

    @inference_mode
    def score(self, tree: TokenTree) -> TargetScores:
        import torch
        from specframe.kit.backend import additive_mask

        device, prefix = self.target.device, self._committed
        paths = [[0] + [i + 1 for i in p] for p in tree.paths] or [[0]]  # packed indices, root first
        width = max(len(p) for p in paths)
        packed_tokens = np.concatenate([[self._pending], tree.tokens])  # (T,)
        padded = [p + [p[-1]] * (width - len(p)) for p in paths]  # right padding never reaches real rows
        ids = torch.from_numpy(packed_tokens[np.array(padded)]).to(device)  # (B, W)
        positions = (prefix + torch.arange(width, device=device))[None].expand(len(paths), -1)  # (B, W)
        mask = None
        if self.layout.hybrid:
            mask = additive_mask(chain_allowed(prefix, width, len(paths), device), self.model.dtype)
        with self._decoding_time_steps():
            out = self._forward(ids, positions, batched_copy(self.cache, len(paths)), mask,
                                output_hidden_states=self.want_hidden)
        rows, cols = self._first_occurrence(paths, len(tree) + 1)
        logits = out.logits[rows, cols].float()  # (T, V)
        hidden = out.hidden_states[-1][rows, cols] if self.want_hidden else None  # (T, D)
        return self.issue(TargetScores(logits=logits, hidden=hidden, tree=tree))

    @staticmethod
    def _first_occurrence(paths: list[list[int]], size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) in the path batch where each packed node is computed first."""
        import torch

        where: dict[int, tuple[int, int]] = {}
        for row, path in enumerate(paths):
            for col, node in enumerate(path):
                where.setdefault(node, (row, col))
        rows, cols = zip(*(where[i] for i in range(size)))
        return torch.tensor(rows), torch.tensor(cols)

    @inference_mode
    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        from specframe_ssm import cache as cache_ops

        self.redeem(scored)
        with self._decoding_time_steps():
            self._append_chain([self._pending, *scored.tree.tokens[path].tolist()])
        cache_ops.crop_kv(self.cache, self.layout.attention, self._committed)
        self._pending, self._prompt_root = int(bonus), False

    def _decoding_time_steps(self):
        """`decoding_time_steps` for this model's Mamba2-type mixers, fed the root first."""
        from specframe_ssm.layout import MAMBA2

        mixers = [m for i, m in self.layout.mixers.items() if self.layout.kinds[i] == MAMBA2]
        return decoding_time_steps(mixers, clamp_first=self._prompt_root)
