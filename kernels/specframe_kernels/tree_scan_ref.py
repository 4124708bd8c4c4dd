"""PyTorch reference of the Mamba2 tree scan (STree, Wu et al.): one SSM layer over a packed token tree.

For T packed nodes in topological order with ancestor mask L (L[i, j] = 1 when j is i or an ancestor
of i), per head h of group g(h), with a = dt * A the per-node log-decay:

    A_tree = L a                                            (cumulative decay from the committed state)
    y_i = exp(A_tree_i) C_i h0^T                            (M_x h0: the committed state)
        + sum_j L_ij exp(A_tree_i - A_tree_j) dt_j (C_i . B_j) x_j   (M_u x: the tree's own inputs)
        + D x_i

`A_tree_i - A_tree_j` is computed as the segment sum over the nodes on the path from j (excluded) down
to i (`ancestor_log_decay`), which has no cancellation. This is the oracle the Triton kernel in
`tree_scan_triton.py` is tested against, and the CPU path of the `ssm-tree` backend.
"""

from __future__ import annotations

import torch


def ancestor_log_decay(a: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log of the decay from each node j to each node i, (H, T, T): -inf where j is not an ancestor of i.

    a: (H, T) per-node log-decay (<= 0); mask: (T, T) bool ancestor-or-self mask. Entry [h, i, j] is the
    sum of a[h] over the nodes on i's chain that are not on j's chain, i.e. A_tree_i - A_tree_j for an
    ancestor j, summed from nonpositive terms only. Subtracting the running sums A_tree_i - A_tree_j
    instead cancels catastrophically when large time steps make those sums large. The Triton kernel's
    wrapper calls this too, so both scans use the same decays.
    """
    Lf = mask.to(a.dtype)  # (T, T)
    seg = (Lf[None] * a[:, None, :]) @ (1.0 - Lf).t()  # (H, T, T)
    return seg.masked_fill(~mask[None], float("-inf"))  # (H, T, T)


def tree_scan_ref(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  D: torch.Tensor | None, mask: torch.Tensor, h0: torch.Tensor | None) -> torch.Tensor:
    """Outputs of one Mamba2 SSM layer at every tree node, computed in float32.

    x: (T, H, P) inputs; dt: (T, H) time steps after softplus and clamp; A: (H,) negative decay rates;
    B, C: (T, G, N); D: (H,) or (H, P) skip, or None; mask: (T, T) bool ancestor-or-self mask;
    h0: (H, P, N) committed SSM state, or None for a zero state. Returns y: (T, H, P) float32.
    """
    T, H, P = x.shape
    G = B.shape[1]
    x, dt, A, B, C = (t.float() for t in (x, dt, A, B, C))
    # Head-major layout: every product below is a batched matmul over heads (or groups).
    xh = x.permute(1, 0, 2)  # (H, T, P)
    Bg, Cg = B.permute(1, 0, 2), C.permute(1, 0, 2)  # (G, T, N)
    a = (dt * A).t()  # (H, T) log-decay of each node
    a_tree = a @ mask.to(x.dtype).t()  # (H, T) decay from the committed state to each node
    decay = torch.exp(ancestor_log_decay(a, mask))  # (H, T, T), 0 off the ancestors
    cb = (Cg @ Bg.transpose(1, 2)).repeat_interleave(H // G, dim=0)  # (H, T, T)
    y = (decay * cb * dt.t()[:, None, :]) @ xh  # (H, T, P)
    if h0 is not None:
        Ch = Cg.repeat_interleave(H // G, dim=0)  # (H, T, N)
        y = y + torch.exp(a_tree)[:, :, None] * (Ch @ h0.float().transpose(1, 2))  # (H, T, P)
    if D is not None:
        y = y + (D.float()[:, None, None] if D.dim() == 1 else D.float()[:, None, :]) * xh  # (H, T, P)
    return y.permute(1, 0, 2)  # (T, H, P)
