"""The tree forward and commit of a Mamba-1 selective-scan mixer (Mamba, FalconMamba, Jamba), swapped in
for the mixer's own forward while a tree is scored, as `specframe_ssm.mixer` does for Mamba2.

Mamba-1 decays every channel d and state n at its own rate, exp(dt_t[d] A[d, n]), so the masked-matrix
form of the Mamba2 tree scan would need a (channels x states x T x T) tensor. Instead the scan walks the
tree one depth at a time: all nodes of a depth update their parents' states together,

    h_i = exp(dt_i A) h_parent(i) + dt_i x_i B_i^T,   y_i = h_i C_i + D x_i,   y_i <- y_i silu(z_i)

which costs depth steps of T x channels x states work, and the per-node states live only inside the
layer's forward. The commit replays the accepted path from the saved dt, x and B (or uses the closed
form). The math: docs/explanation/ssm-tree-scan.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from specframe_ssm.tree_ops import commit_conv, over_rows, tree_conv


@dataclass
class SavedSelectiveNodes:
    """Per-node activations of one Mamba-1 mixer on the scored trees (R rows), kept for the commit."""

    x_raw: torch.Tensor  # (R, T, Di) pre-conv inputs
    x: torch.Tensor  # (R, T, Di) after the conv
    dt: torch.Tensor  # (R, T, Di) after softplus
    B: torch.Tensor  # (R, T, N)


def mixer_A(mixer) -> torch.Tensor:
    return -torch.exp(mixer.A_log.float())  # (Di, N)


def tree_selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                        D: torch.Tensor, parents: torch.Tensor, mask: torch.Tensor,
                        h0: torch.Tensor | None) -> torch.Tensor:
    """y (T, Di) of the selective scan on a packed tree, float32, before the gate.

    x, dt: (T, Di); A: (Di, N); B, C: (T, N); D: (Di,); parents: (T,) packed parents, -1 for nodes attached
    to the committed state h0 (Di, N) (None: zeros); mask: (T, T) ancestor-or-self. Packed order puts
    parents first.
    """
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    T = x.shape[0]
    depth = mask.sum(1).cpu() - 1  # (T,) ancestors of each node
    h = torch.empty(T, *A.shape, device=x.device)  # (T, Di, N)
    start = torch.zeros_like(A) if h0 is None else h0.float()
    parents = parents.to(x.device)
    for level in range(int(depth.max()) + 1):
        idx = (depth == level).nonzero()[:, 0].to(x.device)
        par = parents[idx]
        prev = start.expand(len(idx), *A.shape) if level == 0 else h[par]
        h[idx] = torch.exp(dt[idx, :, None] * A) * prev + (dt[idx] * x[idx])[:, :, None] * B[idx][:, None, :]
    return torch.einsum("tdn,tn->td", h, C) + D.float() * x


def selective_inputs(mixer, hidden: torch.Tensor, run) -> tuple:
    """(x_raw, x, gate, dt, B, C) of a Mamba-1 mixer for the packed trees `hidden` (R, T, D)."""
    projected = mixer.in_proj(hidden)  # (R, T, 2 Di)
    x_raw, gate = projected.chunk(2, dim=-1)
    conv_state, _ = run.states[mixer.layer_idx]
    weight, act = mixer.conv1d.weight[:, 0, :], ACT2FN[mixer.activation]
    x = over_rows(lambda xs, conv, index: tree_conv(xs, conv, weight, mixer.conv1d.bias, index, act),
                  x_raw, conv_state, run.conv_index)  # (R, T, Di)
    sizes = [mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size]
    time_step, B, C = mixer.x_proj(x).split(sizes, dim=-1)
    if hasattr(mixer, "dt_layernorm"):  # FalconMamba, Jamba: norms on dt, B and C
        time_step, B, C = mixer.dt_layernorm(time_step), mixer.b_layernorm(B), mixer.c_layernorm(C)
    dt = F.softplus((time_step @ mixer.dt_proj.weight.t()).float() + mixer.dt_proj.bias.float())  # (R, T, Di)
    return x_raw, x, gate, dt, B, C


def tree_selective_forward(mixer, run, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Mixer output (R, T, D) for the packed trees in `hidden_states` (R, T, D); saves what commit needs.
    The scan walks each tree's depths with data-dependent indices, so rows take turns in it."""
    dtype = hidden_states.dtype
    x_raw, x, gate, dt, B, C = selective_inputs(mixer, hidden_states, run)
    _, h0 = run.states[mixer.layer_idx]
    A = mixer_A(mixer)
    y = over_rows(lambda *row: tree_selective_scan(row[0], row[1], A, row[2], row[3], mixer.D, *row[4:]),
                  x, dt, B, C, run.parents, run.mask, h0, loop=True)  # (R, T, Di)
    run.saved[mixer.layer_idx] = SavedSelectiveNodes(x_raw, x, dt, B)
    y = y * F.silu(gate.float())
    return mixer.out_proj(y.to(dtype))  # (R, T, D)


def commit_selective_replay(h0: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                            B: torch.Tensor) -> torch.Tensor:
    """State (Di, N) after the m path nodes in order: h <- exp(dt A) h + dt x B^T, step by step."""
    h = h0.float()
    for j in range(x.shape[0]):
        h = torch.exp(dt[j, :, None] * A) * h + (dt[j] * x[j].float())[:, None] * B[j].float()[None, :]
    return h


def commit_selective_closed(h0: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                            B: torch.Tensor) -> torch.Tensor:
    """The same state in closed form: exp(sum a) h0 + sum_j exp(sum of a after j) dt_j x_j B_j^T."""
    a = dt.float()[:, :, None] * A  # (m, Di, N)
    after = torch.flip(torch.cumsum(torch.flip(a, [0]), 0), [0]) - a  # decay after node j
    update = torch.exp(after) * (dt.float() * x.float())[:, :, None] * B.float()[:, None, :]
    return torch.exp(a.sum(0)) * h0.float() + update.sum(0)


COMMIT_RULES = {"replay": commit_selective_replay, "closed": commit_selective_closed}


def commit_selective(mixer, state, nodes: SavedSelectiveNodes, index: torch.Tensor, rule: str):
    """(conv (Di, K), SSM state (Di, N)) after the packed nodes `index` (root first)."""
    conv, h0 = state
    A = mixer_A(mixer)
    if h0 is None:
        h0 = torch.zeros_like(A)
    new_h = COMMIT_RULES[rule](h0, nodes.x.index_select(0, index), nodes.dt.index_select(0, index), A,
                              nodes.B.index_select(0, index))
    return commit_conv(conv, nodes.x_raw.index_select(0, index)), new_h
