"""The tree forward of one Mamba2 mixer, swapped in for the mixer's own forward while a tree is scored.

transformers' mixers concatenate new tokens to the conv state in packed order and run a linear scan,
which is wrong for a tree, and they write the cache. During `score` each recurrent layer instead runs
its family's tree forward (`FAMILIES`: `tree_mixer_forward` here for Mamba2, `tree_delta_forward` for
gated DeltaNet, `tree_selective_forward` for Mamba-1, `tree_short_conv_forward` for LFM2): it reads the
committed state, never writes it, and saves the per-node activations that `commit` needs. The swap is
an instance attribute set and removed by `tree_forward_mode`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from collections.abc import Callable

from specframe_kernels import tree_scan, triton_available
from specframe_ssm.gated_deltanet import commit_delta, tree_delta_forward
from specframe_ssm.layout import DELTA_RULE, MAMBA1, MAMBA2, SHORT_CONV
from specframe_ssm.selective_scan import commit_selective, tree_selective_forward
from specframe_ssm.short_conv import commit_short_conv, tree_short_conv_forward
from specframe_ssm.tree_ops import (
    commit_conv, commit_ssm_closed, commit_ssm_replay, discretize, over_rows, tree_conv,
)

COMMIT_RULES = {"replay": commit_ssm_replay, "closed": commit_ssm_closed}


@dataclass
class SavedNodes:
    """Per-node activations of one SSM layer on the scored trees (R rows), kept for the commit."""

    xbc: torch.Tensor  # (R, T, Cd) pre-conv inputs
    x: torch.Tensor  # (R, T, H, P)
    B: torch.Tensor  # (R, T, G, N)
    dt: torch.Tensor  # (R, T, H) after softplus and clamp


@dataclass
class TreeRun:
    """Everything the patched mixers need for one forward over R packed trees (R = 1 for one sequence;
    in a batch each row padded to the widest with throwaway nodes no real node descends from), and what
    they leave behind."""

    mask: torch.Tensor  # (R, T, T) bool ancestor-or-self, packed order
    conv_index: torch.Tensor  # (R, T, K) rows into [conv state^T ; xBC]
    # layer -> (conv (R, Cd, K), state (R, ...) or None: zeros, or no recurrent state)
    states: dict[int, tuple[torch.Tensor, torch.Tensor | None]]
    scan_impl: str = "auto"
    parents: torch.Tensor | None = None  # (R, T) packed parents, -1 for the root (the Mamba-1 scan walks)
    # Per row, the rows whose Mamba2 time steps are clamped to the mixer's `time_step_limit`: 1 when the
    # root is the prompt's last token (plain decoding feeds it with the prompt, in one clamped forward),
    # else 0 (it feeds every new token alone, in its unclamped one-token step).
    clamped_rows: tuple[int, ...] = (0,)
    saved: dict[int, object] = field(default_factory=dict)  # layer -> its family's saved nodes (R rows)


def mixer_A(mixer) -> torch.Tensor:
    return -torch.exp(mixer.A_log.float())  # (H,)


def discretize_rows(dt_raw: torch.Tensor, dt_bias: torch.Tensor, limit, run: TreeRun) -> torch.Tensor:
    """(R, T, H) time steps of every row, each clamped as `run.clamped_rows` says for it."""
    return torch.stack([discretize(dt_raw[r], dt_bias, limit, clamped)
                        for r, clamped in enumerate(run.clamped_rows)])


def scan_rows(x, dt, A, B, C, D, mask, h0, impl: str) -> torch.Tensor:
    """`tree_scan` of every row: (R, T, H, P). The Triton kernel scans one tree per call, so rows take
    turns there; the PyTorch scan runs all rows in one batched computation."""
    triton = impl == "triton" or (impl == "auto" and x.is_cuda and triton_available())
    return over_rows(lambda *row: tree_scan(row[0], row[1], A, row[2], row[3], D, row[4], row[5], impl=impl),
                     x, dt, B, C, mask, h0, loop=triton)


def tree_mixer_forward(mixer, run: TreeRun, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Mamba2 mixer output (R, T, D) for the packed trees in `hidden_states` (R, T, D)."""
    dtype = hidden_states.dtype
    R, T = hidden_states.shape[:2]
    H, P, G, N = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
    d_inner = mixer.intermediate_size
    hidden = hidden_states * getattr(mixer, "ssm_in_multiplier", 1.0)  # Falcon-H1's muP scalings
    projected = mixer.in_proj(hidden)  # (R, T, d_inner + Cd + H)
    if hasattr(mixer, "mup_vector"):
        projected = projected * mixer.mup_vector.reshape(-1)
    gate, xbc_raw, dt_raw = projected.split([d_inner, mixer.conv_dim, H], dim=-1)
    conv_state, h0 = run.states[mixer.layer_idx]
    act = getattr(mixer, "act", torch.nn.functional.silu)
    weight = mixer.conv1d.weight[:, 0, :]
    xbc = over_rows(lambda xs, conv, index: tree_conv(xs, conv, weight, mixer.conv1d.bias, index, act),
                    xbc_raw, conv_state, run.conv_index)  # (R, T, Cd)
    x, B, C = xbc.split([d_inner, G * N, G * N], dim=-1)
    x, B, C = x.reshape(R, T, H, P), B.reshape(R, T, G, N), C.reshape(R, T, G, N)
    dt = discretize_rows(dt_raw, mixer.dt_bias, mixer.time_step_limit, run)  # (R, T, H)
    y = scan_rows(x, dt, mixer_A(mixer), B, C, mixer.D, run.mask, h0, run.scan_impl)  # (R, T, H, P) fp32
    run.saved[mixer.layer_idx] = SavedNodes(xbc=xbc_raw, x=x, B=B, dt=dt)
    if getattr(mixer, "mamba_rms_norm", True):
        y = mixer.norm(y.reshape(R, T, H * P), gate)  # (R, T, d_inner)
    else:  # Falcon-H1 without its mixer norm: the gate multiplies the scan output
        y = y.reshape(R, T, H * P) * torch.nn.functional.silu(gate.float())
    return mixer.out_proj(y.to(dtype))  # (R, T, D)


def commit_mamba2(mixer, state, nodes: SavedNodes, index: torch.Tensor, rule: str):
    """(conv (Cd, K), SSM state (H, P, N)) after the packed nodes `index` (root first), from one row's
    state and saved nodes (`specframe_ssm.tree_ops.row_of`)."""
    conv, h0 = state
    if h0 is None:
        h0 = torch.zeros(mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, device=conv.device)
    new_h = COMMIT_RULES[rule](h0, nodes.x.index_select(0, index), nodes.dt.index_select(0, index),
                               mixer_A(mixer), nodes.B.index_select(0, index))  # (H, P, N)
    return commit_conv(conv, nodes.xbc.index_select(0, index)), new_h


@dataclass(frozen=True)
class TreeFamily:
    """How `ssm-tree` runs one kind of recurrent layer: its tree forward, and the commit of a path."""

    forward: Callable  # (layer, run, hidden_states (R, T, D), *args, **kwargs) -> (R, T, D)
    commit: Callable  # (layer, one row's (conv, state), its saved nodes, packed index, rule) -> (conv, state)


FAMILIES = {MAMBA2: TreeFamily(tree_mixer_forward, commit_mamba2),
            DELTA_RULE: TreeFamily(tree_delta_forward, commit_delta),
            MAMBA1: TreeFamily(tree_selective_forward, commit_selective),
            SHORT_CONV: TreeFamily(tree_short_conv_forward, commit_short_conv)}


@contextlib.contextmanager
def tree_forward_mode(mixers: dict[int, torch.nn.Module], run: TreeRun, kinds: dict[int, str]):
    """Within the block every layer in `mixers` runs its family's tree forward (`kinds[idx]` in
    `FAMILIES`) with `run`; restored after."""
    previous = {idx: m.__dict__.get("forward") for idx, m in mixers.items()}  # accelerate may hook forward
    try:
        for idx, m in mixers.items():
            forward = FAMILIES[kinds[idx]].forward
            m.forward = lambda *a, _m=m, _f=forward, **kw: _f(_m, run, *a, **kw)
        yield run
    finally:
        for idx, m in mixers.items():
            if previous[idx] is None:
                del m.forward
            else:
                m.forward = previous[idx]
