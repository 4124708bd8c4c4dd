"""The gated delta rule on a token tree: every node's output as if its root-to-node path ran alone.

The recurrence (gated DeltaNet, as in transformers' Qwen3-Next and OLMo-hybrid layers), per value head,
with a matrix state S (dk, dv), the key k_t already L2-normalised and the query q_t scaled by 1/sqrt(dk):

    S_t = g_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - g_t S_{t-1}^T k_t),   o_t = S_t^T q_t

with g_t = exp(log-decay_t). Write Gamma_t for the product of g along the path from the committed state
to t, so that g_t S_{t-1} = Gamma_t S_0 + sum_{s < t} (Gamma_t / Gamma_s) k_s u_s^T, and

    (I + A) U = diag(beta) (V - diag(Gamma) K S_0),   A[t, s] = beta_t (Gamma_t / Gamma_s) (k_t . k_s)
    O = diag(Gamma) Q S_0 + (M o (Gamma_t / Gamma_s) o Q K^T) U

for s a proper ancestor of t in A, an ancestor or t itself in M. On a chain these are the delta rule's
chunked (WY) equations; on a tree the causal mask becomes the ancestor mask, and since packed order puts
parents before children, I + A stays unit lower triangular: one triangular solve per head gives every
node's u along its own path, with no per-node state. Gamma is a tree cumulative sum of log-decays, and
each ratio Gamma_t / Gamma_s a sum over the path segment between s and t.
The math and its derivation: docs/explanation/ssm-tree-scan.md.
"""

from __future__ import annotations

import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / ||x|| over the last dim, with transformers' (and FLA's) epsilon inside the square root."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def tree_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                    beta: torch.Tensor, mask: torch.Tensor, h0: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs O (T, H, dv) and delta updates U (T, H, dv) of every node of a packed tree, in float32.

    q, k: (T, H, dk) normalised and scaled as the layer does; v: (T, H, dv); beta: (T, H); log_decay: (T, H)
    (one decay per head, gated DeltaNet) or (T, H, dk) (one per key channel, Kimi delta attention);
    mask: (T, T) bool, mask[t, s] = s is an ancestor of t or t itself (packed order: parents first);
    h0: (H, dk, dv) committed state, or None for the zero state.
    """
    q, k, v, beta = q.float(), k.float(), v.float(), beta.float()
    T = q.shape[0]
    fmask = mask.float()
    log_decay = log_decay.float()
    if log_decay.dim() == 2:
        log_decay = log_decay[:, :, None]  # (T, H, 1): every key channel decays alike
    gamma = torch.einsum("tj,jhc->thc", fmask, log_decay)  # (T, H, c) log decay from the committed state
    # log(Gamma_t / Gamma_s) as a segment sum over the nodes below s on t's path (no cancellation of two
    # long cumulative sums); zero off the ancestor paths.
    segment = torch.einsum("tj,jhc,sj->htsc", fmask, log_decay, 1.0 - fmask)  # (H, T, T, c)
    ratio = torch.where(mask[None, :, :, None], torch.exp(segment), 0.0)
    # (k_t . diag(Gamma_t / Gamma_s) k_s) and (q_t . diag(Gamma_t / Gamma_s) k_s): (H, T, T)
    if ratio.shape[-1] == 1:  # one decay per head: the ratio scales whole dot products
        kh, qh = k.transpose(0, 1), q.transpose(0, 1)  # (H, T, dk)
        kk = ratio[..., 0] * (kh @ kh.transpose(1, 2))
        qk = ratio[..., 0] * (qh @ kh.transpose(1, 2))
    else:
        kk = torch.einsum("thc,shc,htsc->hts", k, k, ratio)
        qk = torch.einsum("thc,shc,htsc->hts", q, k, ratio)
    bh = beta.t()[:, :, None]  # (H, T, 1)
    strict = kk * (1.0 - torch.eye(T, device=q.device))  # proper ancestors only
    system = torch.eye(T, device=q.device) + bh * strict  # (H, T, T) unit lower triangular
    rhs = v.transpose(0, 1)  # (H, T, dv)
    decayed_k = (torch.exp(gamma) * k).transpose(0, 1)  # (H, T, dk)
    decayed_q = (torch.exp(gamma) * q).transpose(0, 1)
    if h0 is not None:
        rhs = rhs - decayed_k @ h0.float()  # (H, T, dv)
    u = torch.linalg.solve_triangular(system, bh * rhs, upper=False, unitriangular=True)  # (H, T, dv)
    out = qk @ u  # (H, T, dv)
    if h0 is not None:
        out = out + decayed_q @ h0.float()
    return out.transpose(0, 1), u.transpose(0, 1)


def commit_delta_replay(h0: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                        beta: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """New state (H, dk, dv) after the m accepted nodes in order, by running the recurrence step by step
    (k: (m, H, dk), v: (m, H, dv), beta: (m, H), log_decay: (m, H) or (m, H, dk)); `u` is not used (same
    signature as closed)."""
    H, dk, dv = k.shape[1], k.shape[2], v.shape[2]
    h = torch.zeros(H, dk, dv, device=k.device) if h0 is None else h0.float()
    for j in range(k.shape[0]):
        h = h * torch.exp(log_decay[j].float()).reshape(H, -1, 1)
        kv_mem = torch.einsum("hkv,hk->hv", h, k[j].float())  # (H, dv)
        delta = (v[j].float() - kv_mem) * beta[j].float()[:, None]
        h = h + k[j].float()[:, :, None] * delta[:, None, :]
    return h


def commit_delta_closed(h0: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                        beta: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """New state in closed form from the updates the tree solve already found:
    Gamma_m S_0 + sum_j (Gamma_m / Gamma_j) k_j u_j^T, with u (m, H, dv) the path's rows of
    `tree_delta_rule`."""
    a = log_decay.float()
    if a.dim() == 2:
        a = a[:, :, None]  # (m, H, 1)
    after = torch.flip(torch.cumsum(torch.flip(a, [0]), 0), [0]) - a  # (m, H, c) log-decay after node j
    update = torch.einsum("mhk,mhk,mhv->hkv", torch.exp(after).expand_as(k), k.float(), u.float())
    if h0 is None:
        return update  # (H, dk, dv)
    return torch.exp(a.sum(0))[:, :, None] * h0.float() + update
