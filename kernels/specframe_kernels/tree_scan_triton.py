"""Triton kernel for the Mamba2 tree scan: the whole packed tree is one chunk (STree's structure).

Each program computes a (BLOCK_M nodes x BLOCK_P channels) tile of one head's output:

    y_i = exp(A_tree_i) C_i h0^T + sum_{j <= i} exp(seg_ij) dt_j (C_i . B_j) x_j + D x_i

seg_ij is the log-decay from node j to node i: the segment sum A_tree_i - A_tree_j over the path below
j when j is an ancestor of i, -inf otherwise (so exp(seg_ij) is 0 off the ancestors). The wrapper computes
it in float32 with the reference's `ancestor_log_decay` and the kernel loads (BLOCK_M x BLOCK_K) tiles of
it. Forming A_tree_i - A_tree_j inside the kernel from the two running sums would cancel
catastrophically once large time steps make those sums large; exp(A_tree_i), the decay of the committed
state, has no such difference and is taken from the running sums directly. Ancestors come before their
descendants (topological order), so the loop over source nodes j stops at the tile's last row. Inputs
are cast to float32 and the dots accumulate in float32 with IEEE precision. The reference is
`tree_scan_ref.tree_scan_ref`; set `TRITON_INTERPRET=1` before importing this module to run the kernel
on CPU tensors. The wrapper never enters `torch.cuda.device(...)`, so CPU tensors work.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specframe_kernels.tree_scan_ref import ancestor_log_decay


@triton.jit
def _tree_scan_kernel(x_ptr, dt_ptr, a_tree_ptr, seg_ptr, b_ptr, c_ptr, d_ptr, h0_ptr, y_ptr,
                      T, H, G, P, N, heads_per_group,
                      HAS_H0: tl.constexpr, HAS_D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_h = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_p = tl.program_id(2)
    g = pid_h // heads_per_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    m_ok = offs_m < T
    p_ok = offs_p < P
    n_ok = offs_n < N

    c = tl.load(c_ptr + offs_m[:, None] * (G * N) + g * N + offs_n[None, :],
                mask=m_ok[:, None] & n_ok[None, :], other=0.0)  # (BM, BN)
    acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    if HAS_H0:
        a_tree_m = tl.load(a_tree_ptr + offs_m * H + pid_h, mask=m_ok, other=0.0)  # (BM,)
        h0 = tl.load(h0_ptr + pid_h * (P * N) + offs_p[None, :] * N + offs_n[:, None],
                     mask=n_ok[:, None] & p_ok[None, :], other=0.0)  # (BN, BP)
        acc += tl.dot(c, h0, input_precision="ieee") * tl.exp(a_tree_m)[:, None]

    seg_h = seg_ptr + pid_h * T * T  # this head's (T, T) log-decays
    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    for k0 in range(0, hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < T
        b = tl.load(b_ptr + offs_k[:, None] * (G * N) + g * N + offs_n[None, :],
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)  # (BK, BN)
        cb = tl.dot(c, tl.trans(b), input_precision="ieee")  # (BM, BK)
        dt_k = tl.load(dt_ptr + offs_k * H + pid_h, mask=k_ok, other=0.0)  # (BK,)
        seg = tl.load(seg_h + offs_m[:, None] * T + offs_k[None, :],
                      mask=m_ok[:, None] & k_ok[None, :], other=float("-inf"))  # (BM, BK)
        w = cb * tl.exp(seg) * dt_k[None, :]  # (BM, BK), 0 off the ancestors and past the tree
        xk = tl.load(x_ptr + offs_k[:, None] * (H * P) + pid_h * P + offs_p[None, :],
                     mask=k_ok[:, None] & p_ok[None, :], other=0.0)  # (BK, BP)
        acc += tl.dot(w, xk, input_precision="ieee")

    if HAS_D:
        d = tl.load(d_ptr + pid_h * P + offs_p, mask=p_ok, other=0.0)  # (BP,)
        xm = tl.load(x_ptr + offs_m[:, None] * (H * P) + pid_h * P + offs_p[None, :],
                     mask=m_ok[:, None] & p_ok[None, :], other=0.0)  # (BM, BP)
        acc += xm * d[None, :]
    tl.store(y_ptr + offs_m[:, None] * (H * P) + pid_h * P + offs_p[None, :], acc,
             mask=m_ok[:, None] & p_ok[None, :])


def tree_scan_triton(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                     D: torch.Tensor | None, mask: torch.Tensor, h0: torch.Tensor | None,
                     block_m: int = 16) -> torch.Tensor:
    """Same contract as `tree_scan_ref`: x (T, H, P), dt (T, H), A (H,), B/C (T, G, N), D (H,) or (H, P)
    or None, mask (T, T) bool, h0 (H, P, N) or None. Returns y (T, H, P) float32.

    Besides the output it allocates the (H, T, T) float32 log-decays, as the reference does."""
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    if H % G:
        raise ValueError(f"tree_scan_triton: {H} heads do not split into {G} groups")
    x, dt, B, C = (t.float().contiguous() for t in (x, dt, B, C))
    a = dt * A.float()  # (T, H) log-decay of each node
    a_tree = (mask.float() @ a).contiguous()  # (T, H) decay from the committed state to each node
    seg = ancestor_log_decay(a.t(), mask).contiguous()  # (H, T, T), -inf off the ancestors
    d = None if D is None else (D.float()[:, None].expand(H, P) if D.dim() == 1 else D.float()).contiguous()
    h0c = None if h0 is None else h0.float().contiguous()  # (H, P, N)
    y = torch.empty((T, H, P), dtype=torch.float32, device=x.device)
    block_p = max(16, min(64, triton.next_power_of_2(P)))
    block_n = max(16, triton.next_power_of_2(N))
    grid = (H, triton.cdiv(T, block_m), triton.cdiv(P, block_p))
    _tree_scan_kernel[grid](
        x, dt, a_tree, seg, B, C, d if d is not None else x, h0c if h0c is not None else x, y,
        T, H, G, P, N, H // G,
        HAS_H0=h0c is not None, HAS_D=d is not None, BLOCK_M=block_m, BLOCK_K=block_m,
        BLOCK_P=block_p, BLOCK_N=block_n)
    return y
