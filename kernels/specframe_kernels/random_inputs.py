"""Random inputs for the tree scan, shared by the kernel tests and benchmarks (CPU and GPU)."""

from __future__ import annotations

import torch


def random_scan_inputs(parents: list[int], H: int, G: int, P: int, N: int, seed: int, *,
                       with_state: bool = True, skip: str | None = "head",
                       dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> dict:
    """Arguments of `tree_scan_ref` for the forest `parents` under the root (node i's parent is
    `parents[i]`, -1 = the root), drawn from one seeded generator: H heads of P channels, G groups of state
    size N; `skip` picks a per-head or per-channel skip D (or none); `with_state` adds a committed h0.
    Float tensors are cast to `dtype`; everything is put on `device`."""
    gen = torch.Generator().manual_seed(seed)
    T = len(parents) + 1
    mask = torch.zeros(T, T, dtype=torch.bool)  # packed i + 1 is node i; [i, j]: j is i or above it
    mask[:, 0] = True
    for i, parent in enumerate(parents, start=1):
        mask[i] = mask[parent + 1]
        mask[i, i] = True
    D = {"head": torch.randn(H, generator=gen), "channel": torch.randn(H, P, generator=gen), None: None}[skip]
    args = dict(x=torch.randn(T, H, P, generator=gen), dt=torch.rand(T, H, generator=gen),
                A=-torch.rand(H, generator=gen) * 4, B=torch.randn(T, G, N, generator=gen),
                C=torch.randn(T, G, N, generator=gen), D=D, mask=mask,
                h0=torch.randn(H, P, N, generator=gen) if with_state else None)
    return {k: None if v is None else v.to(device, v.dtype if k == "mask" else dtype)
            for k, v in args.items()}
