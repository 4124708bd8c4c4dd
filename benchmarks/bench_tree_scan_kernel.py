"""pytest-benchmark: one Mamba2 layer's tree scan, the Triton kernel against its PyTorch reference, on CUDA.

Mamba2-2.7B layer dimensions (80 heads x 64, d_state 128, 1 group), full binary trees of depth 2-6 (3 to
63 nodes under the root), float32, with a committed state. Skipped without a CUDA device (the CPU runs
the kernel only under TRITON_INTERPRET=1, which times the interpreter, not the kernel).

    pytest benchmarks/bench_tree_scan_kernel.py --benchmark-group-by=param:depth
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

H, P, N, G = 80, 64, 128, 1


def inputs(depth: int) -> dict:
    from specframe_kernels.random_inputs import random_scan_inputs
    from specframe_ssm.cost import full_binary_tree

    # `depth` levels under the root: the STree paper's depth counts the root too
    return random_scan_inputs(full_binary_tree(depth + 1), H, P=P, G=G, N=N, seed=depth, device="cuda")


@pytest.mark.parametrize("depth", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_tree_scan(benchmark, impl, depth):
    from specframe_kernels import tree_scan_ref
    from specframe_kernels.tree_scan_triton import tree_scan_triton

    scan = tree_scan_triton if impl == "triton" else tree_scan_ref
    args = inputs(depth)
    expected = tree_scan_ref(**args)
    torch.testing.assert_close(scan(**args), expected, atol=1e-4, rtol=1e-4)

    def call():
        scan(**args)
        torch.cuda.synchronize()

    benchmark(call)
