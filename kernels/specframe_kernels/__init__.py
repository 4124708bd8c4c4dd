"""specframe's compute kernels: Triton kernels, each with the PyTorch reference it is tested against.

`tree_scan` picks the implementation: the Triton kernel for CUDA tensors when Triton is installed
(the `triton` extra), the PyTorch reference otherwise. Triton is imported only when it is used.
"""

from __future__ import annotations

import importlib.util

import torch

from specframe_kernels.tree_scan_ref import tree_scan_ref

__all__ = ["tree_scan", "tree_scan_ref", "triton_available"]


def triton_available() -> bool:
    """True when the `triton` package can be imported (it is an optional extra)."""
    return importlib.util.find_spec("triton") is not None


def tree_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
              D: torch.Tensor | None, mask: torch.Tensor, h0: torch.Tensor | None,
              impl: str = "auto") -> torch.Tensor:
    """Mamba2 tree scan over one packed tree (see `tree_scan_ref` for shapes and math).

    impl: "auto" (Triton on CUDA when available, else torch), "torch" or "triton".
    """
    if impl not in ("auto", "torch", "triton"):
        raise ValueError(f"tree_scan: impl must be 'auto', 'torch' or 'triton', got {impl!r}")
    use_triton = impl == "triton" or (impl == "auto" and x.is_cuda and triton_available())
    if use_triton:
        from specframe_kernels.tree_scan_triton import tree_scan_triton

        return tree_scan_triton(x, dt, A, B, C, D, mask, h0)
    return tree_scan_ref(x, dt, A, B, C, D, mask, h0)
