"""Tree-aware pieces of one Mamba2 layer that are not the scan itself: the causal conv along each node's
parent chain, and the commit of an accepted path to the conv and SSM states.

Shapes: T packed nodes (root at 0), K conv width, Cd = conv_dim, H heads, P head dim, G groups, N state size.
The committed conv state `conv` (Cd, K) holds the last K pre-conv inputs, newest in column K - 1
(the layout of transformers' `LinearAttentionLayer.conv_states` and of mamba_ssm).

The tree forwards run R trees at once (a batch's rows, each padded to the widest; R = 1 for one
sequence): `over_rows` applies these single-tree functions to every row, and `row_of` picks one row of
what they saved for a commit.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from specframe import TokenTree


def over_rows(fn, *rows, loop: bool = False):
    """`fn(*row)` for every row of `rows` (tensors with a leading dimension R, or None passed as None to
    every row), its outputs (a tensor or a tuple of them) stacked to a leading R again.

    One row calls `fn` itself, so a single sequence computes exactly what the single-tree function does;
    several rows run through `torch.func.vmap` (one batched computation), or one after the other with
    `loop` (for `fn` that vmap cannot batch: data-dependent control flow, a Triton kernel)."""
    count = next(r.shape[0] for r in rows if r is not None)
    if count == 1 or loop:
        outs = [fn(*(None if r is None else r[i] for r in rows)) for i in range(count)]
        if isinstance(outs[0], tuple):
            return tuple(torch.stack(parts) for parts in zip(*outs))
        return torch.stack(outs)
    return torch.func.vmap(fn, in_dims=tuple(None if r is None else 0 for r in rows))(*rows)


def row_of(value, row: int):
    """Row `row` of a batched value: a tensor's `[row]`, each field of a dataclass or item of a tuple
    likewise, None as None."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value[row]
    if isinstance(value, tuple):
        return tuple(row_of(v, row) for v in value)
    return dataclasses.replace(value, **{f.name: row_of(getattr(value, f.name), row)
                                         for f in dataclasses.fields(value)})


def conv_window_index(parents: torch.Tensor, width: int) -> torch.Tensor:
    """(T, K) rows into `ext = [conv^T ; xBC]` ((K + T), Cd) forming each node's conv window.

    Slot K - 1 - r holds the r-th ancestor-or-self of node i (r = 0 is i itself) while the chain lasts;
    past the tree's root, slot K - 1 - r takes committed column K - r + depth_i, i.e. the newest
    committed inputs first. `parents` (T,) are packed parents, -1 for a node attached to the prefix.
    """
    T = parents.shape[0]
    index = torch.empty(T, width, dtype=torch.long)
    node = torch.arange(T)  # current ancestor, -1 once past the tree's root
    missing = torch.zeros(T, dtype=torch.long)  # committed columns consumed so far
    for r in range(width):
        in_tree = node >= 0
        index[:, width - 1 - r] = torch.where(in_tree, width + node, width - 1 - missing)
        missing += (~in_tree).long()
        node = torch.where(in_tree, parents[node.clamp(min=0)], node)
    return index


def tree_conv(xbc: torch.Tensor, conv: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              index: torch.Tensor, act) -> torch.Tensor:
    """Depthwise causal conv of every node over its own ancestor chain.

    xbc: (T, Cd) pre-conv inputs; conv: (Cd, K) committed state; weight: (Cd, K) (torch's conv1d is a
    cross-correlation, so weight[:, K - 1] multiplies the node itself); index from `conv_window_index`.
    Returns act(conv) (T, Cd).
    """
    ext = torch.cat([conv.t().to(xbc.dtype), xbc], dim=0)  # (K + T, Cd)
    weight = weight.to(xbc.dtype)
    out = ext[index[:, 0]] * weight[:, 0]  # (T, Cd)
    for k in range(1, weight.shape[1]):
        out = out + ext[index[:, k]] * weight[:, k]
    if bias is not None:
        out = out + bias
    return act(out)


def tree_rows(trees: list[TokenTree], conv_width: int, device) -> tuple[torch.Tensor, torch.Tensor,
                                                                         torch.Tensor]:
    """(ancestor masks (R, T, T) bool, conv window indices (R, T, K), packed parents (R, T) on the CPU) of
    trees of one packed size T (a batch pads its rows' trees to the widest first)."""
    parents = torch.from_numpy(np.stack([tree.packed_parents for tree in trees]))  # (R, T)
    ancestors = torch.from_numpy(np.stack([tree.ancestor_mask for tree in trees])).to(device)
    conv_index = torch.stack([conv_window_index(row, conv_width) for row in parents]).to(device)
    return ancestors, conv_index, parents


def one_row(state: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layer's (conv, recurrent state or None) as a batch of one row."""
    conv, h = state
    return conv[None], None if h is None else h[None]


def discretize(dt_raw: torch.Tensor, dt_bias: torch.Tensor, limit: tuple[float, float],
               clamped: int | None = None) -> torch.Tensor:
    """(T, H) time steps softplus(dt_raw + dt_bias), the first `clamped` rows (None: all) clamped to
    `limit`.

    transformers clamps in its multi-token scan but not in its one-token step, so a row is clamped
    only where plain decoding, which feeds the prompt in one forward and every new token alone, would.
    """
    dt = torch.nn.functional.softplus(dt_raw.float() + dt_bias.float())  # (T, H)
    rows = dt.shape[0] if clamped is None else clamped
    return torch.cat([torch.clamp(dt[:rows], min=limit[0], max=limit[1]), dt[rows:]])


def commit_conv(conv: torch.Tensor, xbc_path: torch.Tensor) -> torch.Tensor:
    """(Cd, K) new conv state: the last K columns of [conv | inputs of the accepted path]."""
    width = conv.shape[1]
    return torch.cat([conv, xbc_path.t().to(conv.dtype)], dim=1)[:, -width:]  # (Cd, K)


def _group_to_heads(B: torch.Tensor, heads: int) -> torch.Tensor:
    return B.repeat_interleave(heads // B.shape[1], dim=1)  # (m, H, N)


def commit_ssm_replay(h0: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                      B: torch.Tensor) -> torch.Tensor:
    """New SSM state by replaying the recurrence along the path: h <- exp(dt A) h + dt x B^T.

    h0: (H, P, N); x: (m, H, P); dt: (m, H); A: (H,); B: (m, G, N) for the m accepted nodes in order.
    """
    h = h0.float()
    Bh = _group_to_heads(B.float(), h.shape[0])  # (m, H, N)
    for j in range(x.shape[0]):
        decay = torch.exp(dt[j] * A)  # (H,)
        h = decay[:, None, None] * h + (dt[j][:, None] * x[j].float())[:, :, None] * Bh[j][:, None, :]
    return h  # (H, P, N)


def commit_ssm_closed(h0: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                      B: torch.Tensor) -> torch.Tensor:
    """New SSM state in closed form: exp(sum a) h0 + sum_j exp(sum of a after j) dt_j x_j B_j^T."""
    a = dt.float() * A  # (m, H)
    after = torch.flip(torch.cumsum(torch.flip(a, [0]), 0), [0]) - a  # (m, H) sum of a over later nodes
    Bh = _group_to_heads(B.float(), h0.shape[0])  # (m, H, N)
    weights = torch.exp(after) * dt.float()  # (m, H)
    update = torch.einsum("mh,mhp,mhn->hpn", weights, x.float(), Bh)  # (H, P, N)
    return torch.exp(a.sum(0))[:, None, None] * h0.float() + update
