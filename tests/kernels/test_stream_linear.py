"""`specframe_kernels.stream_linear` (`SPECFRAME_CPU_LINEAR=stream`): the AVX-512 kernel for tree-sized
products computes what `torch.nn.functional.linear` computes, gives each row the bits it gets alone, and
`load_target` uses it only where asked and where it runs. Skipped on CPUs without AVX-512."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import specframe
from specframe.runtime import load
from specframe.terms.errors import SpecframeWarning
from specframe.runtime.packed_linear import PackedLinear, linear_kernel, onednn_available, pack_linear_layers
from specframe.testing import tiny_target
from specframe_kernels import stream_linear

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not (onednn_available() and stream_linear.available()),
                                 reason="needs an AVX-512 CPU, a C++ compiler and oneDNN")]


@settings(max_examples=40, deadline=None)
@example(rows=4, features_in=200, features_out=60, bias=True, seed=200)  # 1.2e-5 apart: summation order
@given(rows=st.integers(1, stream_linear.MAX_ROWS), features_in=st.integers(1, 200),
       features_out=st.integers(1, 100), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_it_computes_what_linear_computes(rows, features_in, features_out, bias, seed):
    """Any shape: inputs and outputs that fill no whole chunk (64) or block (32), bias or none."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(features_out, features_in, generator=generator)
    b = torch.randn(features_out, generator=generator) if bias else None
    x = torch.randn(rows, features_in, generator=generator)
    got = stream_linear.linear(x, stream_linear.pack(weight), b)
    # Float32 sums of `features_in` products in another order differ by rounding that grows with the length
    # (1.2e-5 seen at 200); a wrong kernel is off by whole units.
    torch.testing.assert_close(got, stream_linear.linear_reference(x, weight, b), rtol=1e-5,
                               atol=1e-6 * features_in)


@pytest.mark.parametrize("features_in, features_out", [(576, 1536), (1536, 576), (577, 200)])
def test_each_row_gets_the_bits_it_gets_alone(features_in, features_out):
    """What makes a tree forward's linears reproduce plain steps: row r of a product of m rows equals the
    product of row r alone, for every m up to `MAX_ROWS`. (oneDNN's float32 kernels do not: on the AMD EPYC
    of the linear-rows measurement, 89 % of the 1536-input layer's outputs for one row differ in their last
    bits from the same row multiplied among others; this test fails on them.)"""
    torch.manual_seed(0)
    weight, bias = torch.randn(features_out, features_in), torch.randn(features_out)
    packed = stream_linear.pack(weight)
    x = torch.randn(stream_linear.MAX_ROWS, features_in)
    alone = torch.cat([stream_linear.linear(x[r:r + 1], packed, bias) for r in range(stream_linear.MAX_ROWS)])
    for rows in range(2, stream_linear.MAX_ROWS + 1):
        assert torch.equal(stream_linear.linear(x[:rows], packed, bias), alone[:rows]), rows
    assert torch.equal(stream_linear.linear(x[None, :5], packed, bias), alone[None, :5])


def test_it_refuses_what_it_cannot_multiply():
    weight = torch.randn(40, 70)
    packed = stream_linear.pack(weight)
    with pytest.raises(RuntimeError, match="1 to 12 rows, got 13"):
        stream_linear.linear(torch.randn(13, 70), packed)
    with pytest.raises(ValueError, match="x has 71 features, the weight 70 inputs"):
        stream_linear.linear(torch.randn(2, 71), packed)
    with pytest.raises(RuntimeError, match="bad bias"):
        stream_linear.linear(torch.randn(2, 70), packed, torch.randn(41))
    with pytest.raises(RuntimeError, match="float32"):
        stream_linear.pack(weight.double())


def test_a_streamed_layer_takes_trees_here_and_prompts_to_onednn():
    torch.manual_seed(1)
    plain = torch.nn.Linear(96, 48)
    layer = PackedLinear(plain, stream=True)
    with torch.inference_mode():
        small = layer(torch.randn(7, 96))
        assert layer._streamed is not None and layer._packed is None
        big = torch.randn(stream_linear.MAX_ROWS + 1, 96)
        torch.testing.assert_close(layer(big), plain(big), rtol=1e-5, atol=1e-5)
        assert layer._packed is not None
        assert layer(torch.randn(0, 96)).shape == (0, 48)  # no rows: oneDNN, not the kernel (1-12 rows)
    assert small.shape == (7, 48)
    with torch.no_grad():
        plain.weight.mul_(2.0)  # changed in place: the streamed copy is made again
    x = torch.randn(3, 96)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), plain(x), rtol=1e-5, atol=1e-5)
    x.requires_grad_(True)
    layer(x).sum().backward()  # a gradient to record: torch's own linear
    assert x.grad is not None


def test_load_target_streams_only_when_asked_and_able(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    directory = tmp_path / "tiny"
    tiny_target(seed=4, vocab_size=49152, hidden_size=32).model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(load.resolve_model_dir("smollm2-135m")).save_pretrained(directory)
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "stream")
    assert linear_kernel(specframe.load_target(str(directory), device="cpu").model) == "stream"
    half = specframe.load_target(str(directory), device="cpu", dtype="bfloat16")  # bfloat16: not streamed
    assert linear_kernel(half.model) in ("onednn", "torch")
    monkeypatch.setattr(stream_linear, "available", lambda: False)
    with pytest.warns(SpecframeWarning, match="needs an x86-64 CPU with AVX-512"):
        fallback = specframe.load_target(str(directory), device="cpu")
    assert linear_kernel(fallback.model) == "onednn"
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "onednn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert linear_kernel(specframe.load_target(str(directory), device="cpu").model) == "onednn"


def test_greedy_speculation_on_a_streamed_model_equals_plain_greedy():
    target = tiny_target(seed=6, vocab_size=64, hidden_size=32)
    pack_linear_layers(target.model, stream=True)
    assert linear_kernel(target.model) == "stream"
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(24):  # plain greedy, the whole sequence each step (through oneDNN beyond 12 rows)
            ids.append(int(target.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    for tree in ("chain", "trie"):
        spec = specframe.SpeculativeDecoder.from_names(target, "pld", tree).generate(prompt, 24)
        assert list(spec.tokens) == ids[len(prompt):], tree


@pytest.mark.slow
def test_greedy_speculation_on_streamed_smollm2_equals_plain_greedy(monkeypatch):
    """The real model: trees of up to 12 nodes verified through the kernel, token for token."""
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "stream")
    target = specframe.load_target("smollm2-135m", device="cpu")
    assert linear_kernel(target.model) == "stream"
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    plain = specframe.SpeculativeDecoder.from_names(target, "none", budget=1).generate(prompt,
                                                                                       max_new_tokens=48)
    for tree in ("chain", "trie"):
        out = specframe.SpeculativeDecoder.from_names(target, "pld", tree, budget=11).generate(
            prompt, max_new_tokens=48)
        assert out.tokens == plain.tokens, tree
        assert out.metrics.accepted_draft_tokens > 0, tree


def test_backends_pad_nothing_under_the_kernel():
    """One row costs `stream_linear` no more than four, so padding would only add work (`min_rows` 1, not
    left to calibration); under oneDNN calibration decides, and an explicit `min_rows` wins either way."""
    from specframe.plugging.pipeline import assemble

    streamed, packed = tiny_target(seed=7), tiny_target(seed=7)
    pack_linear_layers(streamed.model, stream=True)
    pack_linear_layers(packed.model)
    streamed_kv, packed_kv = (assemble(t, backend="kv").backend for t in (streamed, packed))
    assert streamed_kv.min_rows == 1 and not streamed_kv.pads_by_measurement()
    assert packed_kv.pads_by_measurement()
    assert assemble(streamed, backend="kv(min_rows=4)").backend.min_rows == 4
