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
from hypothesis import given, settings, strategies as st  # noqa: E402

pytest.importorskip("triton")
from specframe_kernels import tree_scan, tree_scan_ref  # noqa: E402

from specframe import TokenTree  # noqa: E402

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


def inputs(parents, H, G, P, N, seed, with_state=True, skip="head"):
    gen = torch.Generator().manual_seed(seed)
    T = len(parents) + 1
    mask = torch.from_numpy(TokenTree(np.zeros(len(parents), np.int64), np.array(parents)).ancestor_mask)
    D = {"head": torch.randn(H, generator=gen), "channel": torch.randn(H, P, generator=gen), None: None}[skip]
    return dict(x=torch.randn(T, H, P, generator=gen), dt=torch.rand(T, H, generator=gen),
                A=-torch.rand(H, generator=gen) * 4, B=torch.randn(T, G, N, generator=gen),
                C=torch.randn(T, G, N, generator=gen), D=D, mask=mask,
                h0=torch.randn(H, P, N, generator=gen) if with_state else None)


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


@in_this_process
def test_dispatch_runs_the_kernel_when_asked():
    args = inputs([-1, 0, 1], 2, 1, 16, 16, seed=5)
    torch.testing.assert_close(tree_scan(**args, impl="triton"), tree_scan_ref(**args), atol=1e-5, rtol=1e-5)


@in_this_process
def test_backend_with_the_kernel_matches_the_torch_scan():
    from ssm_models import tiny_ssm_target

    from specframe_ssm import SSMTreeBackend

    target = tiny_ssm_target("bamba")
    tree = TokenTree(np.array([1, 2, 3, 4, 5, 6]), np.array([-1, 0, 0, 1, -1, 4]))
    scores = {}
    for scan in ("torch", "triton"):
        backend = SSMTreeBackend(target, scan=scan)
        backend.prefill([7, 8, 9, 10])
        scores[scan] = backend.score(tree).logits
    torch.testing.assert_close(scores["triton"], scores["torch"], atol=1e-5, rtol=1e-5)
