"""The Triton tree-scan kernel, run by Triton's interpreter on CPU tensors, against its PyTorch reference.

Triton's own helpers are compiled for the interpreter only when `TRITON_INTERPRET=1` is set before
`triton` is first imported. When another test already imported it (torch's dynamo does), the kernel
tests run in a fresh Python process instead. Skipped when the optional `triton` extra is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys

INTERPRETABLE = "triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") == "1"
os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")
from specframe import TokenTree  # noqa: E402
from specframe_kernels import tree_scan, tree_scan_ref  # noqa: E402
from specframe_kernels.random_inputs import random_scan_inputs  # noqa: E402

if INTERPRETABLE:
    from specframe_kernels.tree_scan_triton import tree_scan_triton
in_this_process = pytest.mark.skipif(not INTERPRETABLE, reason="triton was imported without the interpreter; "
                                     "test_kernels_in_a_fresh_process runs these")


@pytest.mark.skipif(INTERPRETABLE, reason="the kernel tests run in this process")
def test_kernels_in_a_fresh_process():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
                           "-k", "not fresh_process"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary


inputs = random_scan_inputs  # the kernels' shared random inputs


@in_this_process
@pytest.mark.parametrize(("H", "G", "P", "N"), [(4, 1, 16, 16), (6, 3, 20, 12), (2, 2, 70, 33)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("skip", ["head", "channel", None])
def test_kernel_matches_reference_on_a_binary_tree(H, G, P, N, with_state, skip):
    parents = [-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]  # 18 nodes: two row blocks
    args = inputs(parents, H, G, P, N, seed=H + P, with_state=with_state, skip=skip)
    torch.testing.assert_close(tree_scan_triton(**args), tree_scan_ref(**args), atol=1e-5, rtol=1e-5)


@in_this_process
@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=0, max_size=40), st.integers(0, 100))
def test_kernel_matches_reference_on_random_trees(seeds, seed):
    parents = [s % (i + 1) - 1 for i, s in enumerate(seeds)]  # a forest under the root
    args = inputs(parents, 4, 2, 16, 16, seed)
    torch.testing.assert_close(tree_scan_triton(**args), tree_scan_ref(**args), atol=1e-5, rtol=1e-5)


def large_step_inputs(seed):
    """Time steps 100x those of `inputs` on a chain of 48 nodes, then a calm binary subtree of 16 nodes.

    With A in [-8, -2] the chain drives the running sums A_tree past -1e4, while below it the decays
    between calm nodes stay O(1): their outputs hang on the exact differences of those large sums.
    """
    gen = torch.Generator().manual_seed(seed)
    parents = list(range(-1, 47)) + [47 if c < 2 else 48 + (c - 2) // 2 for c in range(16)]
    T, H, P, N = len(parents) + 1, 4, 16, 16
    mask = torch.from_numpy(TokenTree(np.zeros(len(parents), np.int64), np.array(parents)).ancestor_mask)
    dt = torch.rand(T, H, generator=gen)
    dt[:49] *= 100.0  # the root and the chain
    return dict(x=torch.randn(T, H, P, generator=gen), dt=dt, A=-2.0 - 6.0 * torch.rand(H, generator=gen),
                B=torch.randn(T, 1, N, generator=gen), C=torch.randn(T, 1, N, generator=gen),
                D=torch.randn(H, generator=gen), mask=mask, h0=torch.randn(H, P, N, generator=gen))


def running_sum_scan(x, dt, A, B, C, D, mask, h0, dtype):
    """The tree scan (D per head, h0 given) with each decay formed as exp(A_tree_i - A_tree_j), in `dtype`.

    In float32 this is the arithmetic the kernel used before it loaded segment sums; in float64 the
    difference of the running sums keeps far more digits than a float32 result has, so it is the exact
    answer to compare with.
    """
    x, dt, A, B, C, h0 = (t.to(dtype) for t in (x, dt, A, B, C, h0))
    H, G = x.shape[1], B.shape[1]
    a_tree = mask.to(dtype) @ (dt * A)  # (T, H)
    diff = (a_tree[:, None] - a_tree[None]).permute(2, 0, 1).clamp(max=0.0)  # (H, T, T)
    decay = torch.exp(diff.masked_fill(~mask[None], float("-inf")))  # (H, T, T)
    cb = torch.einsum("ign,jgn->gij", C, B).repeat_interleave(H // G, dim=0)  # (H, T, T)
    y = torch.einsum("hij,jh,jhp->ihp", decay * cb, dt, x)  # (T, H, P)
    Ch = C.repeat_interleave(H // G, dim=1)  # (T, H, N)
    y = y + torch.exp(a_tree)[..., None] * torch.einsum("ihn,hpn->ihp", Ch, h0)  # (T, H, P)
    return y + D.to(dtype)[None, :, None] * x


@in_this_process
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_keeps_its_precision_with_large_time_steps(seed):
    args = large_step_inputs(seed)
    exact = running_sum_scan(**args, dtype=torch.float64)
    y = tree_scan_triton(**args)
    tol = dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y, tree_scan_ref(**args), **tol)
    torch.testing.assert_close(y.double(), exact, **tol)
    # The check has teeth: decays from differences of float32 running sums miss the same tolerance.
    assert not torch.allclose(running_sum_scan(**args, dtype=torch.float32).double(), exact, **tol)


@in_this_process
def test_dispatch_runs_the_kernel_when_asked():
    args = inputs([-1, 0, 1], 2, 1, 16, 16, seed=5)
    torch.testing.assert_close(tree_scan(**args, impl="triton"), tree_scan_ref(**args), atol=1e-5, rtol=1e-5)


@in_this_process
def test_backend_with_the_kernel_matches_the_torch_scan():
    from ssm_models import scores_by_scan, tiny_ssm_target

    scores = scores_by_scan(tiny_ssm_target("bamba"))
    torch.testing.assert_close(scores["triton"], scores["torch"], atol=1e-5, rtol=1e-5)
