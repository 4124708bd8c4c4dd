"""The same checks as on the CPU, on a CUDA device: the compiled Triton tree scan against its PyTorch
reference, the `kv` and `ssm-tree` backends through the conformance suite, and greedy decoding against
plain greedy decoding, with phase timing on and off.

Every test is marked `gpu`; tests/conftest.py skips them where torch sees no CUDA device. Run them with
`pytest -m gpu`. Comparisons run in full float32 (no TF32) so that they mean what they do on the CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from ssm_models import make_repetitive, scores_by_scan, tiny_ssm_target

from specframe import SpeculativeDecoder, Target
from specframe.testing import BackendConformance
from specframe.testing.targets import reference_greedy, repetitive_prompt, tiny_target

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def ieee_float32():
    """Full float32 matmuls and convolutions (cuDNN convolutions default to TF32) while a test runs. The
    flags every torch since 2.4 has: setting only some of the newer per-operator ones makes torch refuse
    to read these."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    yield
    matmul.allow_tf32, cudnn.allow_tf32 = before


def on_cuda(target: Target) -> Target:
    target.model.to(CUDA)
    return target


def triton_interpreted() -> bool:
    """True when Triton kernels in this process run in Triton's CPU interpreter:
    tests/kernels/test_ssm_kernels.py
    sets TRITON_INTERPRET=1 when it is collected, and Triton reads it when a kernel is defined."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    module = sys.modules.get("specframe_kernels.tree_scan_triton")
    return module is not None and type(module._tree_scan_kernel).__name__ == "InterpretedFunction"


@pytest.fixture
def compiled_triton():
    """Skip a test that must run compiled kernels in a process where Triton interprets them; the test
    `test_gpu_tests_in_a_fresh_process` runs it instead."""
    if triton_interpreted():
        pytest.skip("Triton runs in its interpreter in this process; test_gpu_tests_in_a_fresh_process "
                    "runs this test")


def test_gpu_tests_in_a_fresh_process():
    if not triton_interpreted():
        pytest.skip("the GPU tests run in this process")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-m", "gpu",
               "-k", "not fresh_process"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


# --- the Triton tree scan ----------------------------------------------------------------------------


def scan_inputs(parents: list[int], H: int, G: int, P: int, N: int, seed: int, **options) -> dict:
    """Random tree-scan inputs on CUDA (`specframe_kernels.random_inputs`)."""
    from specframe_kernels.random_inputs import random_scan_inputs

    return random_scan_inputs(parents, H, G, P, N, seed, device=CUDA, **options)


@pytest.fixture
def kernels(compiled_triton):
    pytest.importorskip("triton")
    from specframe_kernels import tree_scan, tree_scan_ref
    from specframe_kernels.tree_scan_triton import tree_scan_triton

    return tree_scan, tree_scan_ref, tree_scan_triton


@pytest.mark.parametrize(("H", "G", "P", "N"), [(4, 1, 16, 16), (6, 3, 20, 12), (2, 2, 70, 33)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("skip", ["head", "channel", None])
def test_kernel_matches_reference_on_a_binary_tree(kernels, H, G, P, N, with_state, skip):
    _, tree_scan_ref, tree_scan_triton = kernels
    parents = [-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]  # 18 nodes: two row blocks
    args = scan_inputs(parents, H, G, P, N, seed=H + P, with_state=with_state, skip=skip)
    torch.testing.assert_close(tree_scan_triton(**args), tree_scan_ref(**args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(12))
def test_kernel_matches_reference_on_random_trees(kernels, seed):
    _, tree_scan_ref, tree_scan_triton = kernels
    rng = np.random.default_rng(seed)
    size = int(rng.integers(0, 48))  # up to three row blocks
    parents = [int(rng.integers(0, i + 1)) - 1 for i in range(size)]  # a forest under the root
    args = scan_inputs(parents, 4, 2, 16, 16, seed)
    torch.testing.assert_close(tree_scan_triton(**args), tree_scan_ref(**args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_matches_reference_on_half_precision_inputs(kernels, dtype):
    _, tree_scan_ref, tree_scan_triton = kernels
    args = scan_inputs([-1, 0, 0, 1, 2, -1, 5], 4, 2, 16, 16, seed=7, dtype=dtype)
    y = tree_scan_triton(**args)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, tree_scan_ref(**args), atol=1e-5, rtol=1e-5)


def test_dispatch_picks_the_kernel_for_cuda_tensors(kernels):
    tree_scan, tree_scan_ref, tree_scan_triton = kernels
    args = scan_inputs([-1, 0, 1], 2, 1, 16, 16, seed=5)
    torch.testing.assert_close(tree_scan(**args), tree_scan_triton(**args), atol=0, rtol=0)  # the same kernel
    torch.testing.assert_close(tree_scan(**args, impl="torch"), tree_scan_ref(**args))


def test_backend_with_the_kernel_matches_the_torch_scan(kernels):
    scores = scores_by_scan(on_cuda(tiny_ssm_target("bamba")))
    assert scores["triton"].device.type == "cuda"
    torch.testing.assert_close(scores["triton"], scores["torch"], atol=1e-5, rtol=1e-5)


# --- backends through the conformance suite ------------------------------------------------------------


class TestKVOnCUDA(BackendConformance):
    component = "kv"

    @pytest.fixture
    def target(self):
        return on_cuda(tiny_target(seed=0))


@pytest.mark.usefixtures("compiled_triton")
class TestSSMTreeOnCUDA(BackendConformance):
    component = "ssm-tree"  # scan "auto": the Triton kernel when Triton is installed, else the reference

    @pytest.fixture
    def target(self):
        return on_cuda(make_repetitive(tiny_ssm_target("bamba", seed=2)))


@pytest.mark.usefixtures("compiled_triton")
class TestSSMTreeOnMamba2OnCUDA(BackendConformance):
    component = "ssm-tree"

    @pytest.fixture
    def target(self):
        return on_cuda(tiny_ssm_target("mamba2"))


# --- decoding ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    return on_cuda(tiny_llama(seed=3))


@pytest.fixture(scope="module")
def prompt():
    return repetitive_prompt(96, 48, seed=2)


@pytest.mark.parametrize("phase_timing", [True, False])
def test_greedy_decoding_equals_plain_greedy(llama, prompt, phase_timing):
    expected = reference_greedy(llama, prompt, 40)
    decoder = SpeculativeDecoder.from_names(llama, "pld", budget=8, phase_timing=phase_timing)
    for _ in range(2):  # the second request reuses the decoder
        result = decoder.generate(prompt, max_new_tokens=40)
        assert result.tokens == expected
        metrics = result.metrics
        assert metrics.phase_timing is phase_timing and metrics.to_dict()["phase_timing"] is phase_timing
        assert metrics.wall_s > metrics.prefill_s > 0 and metrics.tokens_per_s > 0
    assert metrics.accepted_draft_tokens > 0  # the check has teeth: drafts were accepted


def test_adaptive_budget_calibrates_on_cuda_and_stays_lossless(llama, prompt, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))  # the calibration is stored there
    decoder = SpeculativeDecoder.from_names(llama, "pld", budget="auto", phase_timing=False)
    decoder.progress = False
    assert decoder.generate(prompt, max_new_tokens=40).tokens == reference_greedy(llama, prompt, 40)


def test_peak_memory_is_the_request_s(llama, prompt):
    ballast = 256 << 20
    torch.empty(ballast, dtype=torch.uint8, device=CUDA)  # raises the device's peak, then is freed
    result = SpeculativeDecoder.from_names(llama, "pld", budget=8).generate(prompt, max_new_tokens=16)
    assert 0 < result.metrics.peak_memory_bytes < ballast
