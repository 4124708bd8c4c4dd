"""The tree forward of one Mamba2 mixer, swapped in for the mixer's own forward while a tree is scored.

transformers' mixers concatenate new tokens to the conv state in packed order and run a linear scan,
which is wrong for a tree, and they write the cache. During `score` each mixer instead runs
`tree_mixer_forward`: it reads the committed state, never writes it, and saves the per-node activations
that `commit` needs. The swap is an instance attribute set and removed by `tree_forward_mode`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from specframe_kernels import tree_scan
from specframe_ssm.tree_ops import discretize, tree_conv


@dataclass
class SavedNodes:
    """Per-node activations of one SSM layer on the scored tree, kept for the commit."""

    xbc: torch.Tensor  # (T, Cd) pre-conv inputs
    x: torch.Tensor  # (T, H, P)
    B: torch.Tensor  # (T, G, N)
    dt: torch.Tensor  # (T, H) after softplus and clamp


@dataclass
class TreeRun:
    """Everything the patched mixers need for one scored tree, and what they leave behind."""

    mask: torch.Tensor  # (T, T) bool ancestor-or-self, packed order
    conv_index: torch.Tensor  # (T, K) rows into [conv state^T ; xBC]
    states: dict[int, tuple[torch.Tensor, torch.Tensor | None]]  # layer -> (conv (Cd, K), h0 (H, P, N))
    scan_impl: str = "auto"
    saved: dict[int, SavedNodes] = field(default_factory=dict)


def mixer_A(mixer) -> torch.Tensor:
    return -torch.exp(mixer.A_log.float())  # (H,)


def tree_mixer_forward(mixer, run: TreeRun, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Mamba2 mixer output (1, T, D) for the packed tree in `hidden_states` (1, T, D)."""
    if hidden_states.shape[0] != 1:
        raise ValueError("ssm-tree scores one tree at a time (batch 1)")
    dtype = hidden_states.dtype
    T = hidden_states.shape[1]
    H, P, G, N = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
    d_inner = mixer.intermediate_size
    projected = mixer.in_proj(hidden_states[0])  # (T, d_inner + Cd + H)
    gate, xbc_raw, dt_raw = projected.split([d_inner, mixer.conv_dim, H], dim=-1)
    conv_state, h0 = run.states[mixer.layer_idx]
    act = getattr(mixer, "act", torch.nn.functional.silu)
    xbc = tree_conv(xbc_raw, conv_state, mixer.conv1d.weight[:, 0, :], mixer.conv1d.bias,
                    run.conv_index, act)  # (T, Cd)
    x, B, C = xbc.split([d_inner, G * N, G * N], dim=-1)
    x, B, C = x.reshape(T, H, P), B.reshape(T, G, N), C.reshape(T, G, N)
    dt = discretize(dt_raw, mixer.dt_bias, mixer.time_step_limit)  # (T, H)
    y = tree_scan(x, dt, mixer_A(mixer), B, C, mixer.D, run.mask, h0, impl=run.scan_impl)  # (T, H, P) fp32
    run.saved[mixer.layer_idx] = SavedNodes(xbc=xbc_raw, x=x, B=B, dt=dt)
    y = mixer.norm(y.reshape(1, T, H * P), gate[None])  # (1, T, d_inner)
    return mixer.out_proj(y.to(dtype))  # (1, T, D)


@contextlib.contextmanager
def tree_forward_mode(mixers: dict[int, torch.nn.Module], run: TreeRun):
    """Within the block every mixer in `mixers` runs `tree_mixer_forward` with `run`; restored after."""
    previous = {idx: m.__dict__.get("forward") for idx, m in mixers.items()}  # accelerate may hook forward
    try:
        for m in mixers.values():
            m.forward = lambda *a, _m=m, **kw: tree_mixer_forward(_m, run, *a, **kw)
        yield run
    finally:
        for idx, m in mixers.items():
            if previous[idx] is None:
                del m.forward
            else:
                m.forward = previous[idx]
