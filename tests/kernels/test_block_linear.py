"""`specframe_kernels.block_linear`, the default float32 CPU linear for weights dequantized from 4- or 8-bit
blocks (a GGUF model): it recovers the blocks exactly, multiplies with the very weights the model holds,
gives each row the bits it gets alone, refuses what it cannot multiply, and `load_target` uses it where it
runs and the weights are such blocks. Skipped on CPUs without AVX-512."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specframe
from specframe.runtime import load
from specframe.runtime.packed_linear import (BLOCK_ROWS, PackedLinear, linear_kernel, onednn_available,
                                             pack_linear_layers)
from specframe.terms.errors import SpecframeWarning
from specframe.testing import tiny_target
from specframe_kernels import block_linear, stream_linear

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not (onednn_available() and block_linear.available()),
                                 reason="needs an AVX-512 CPU, a C++ compiler and oneDNN")]


# What GGUF's dequantizers compute, block by block (32 inputs), rounding after each float32 operation.
def q4_1(weight: torch.Tensor) -> torch.Tensor:
    """Q4_1: scale and offset in float16, codes 0-15; weight = scale * code + offset."""
    blocks = weight.reshape(weight.shape[0], -1, 32)
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    scale, offset = ((high - low) / 15).half().float(), low.half().float()
    codes = ((blocks - offset) / torch.where(scale == 0, 1.0, scale)).round().clamp(0, 15)
    return (scale * codes + offset).reshape(weight.shape)


def q8_0(weight: torch.Tensor) -> torch.Tensor:
    """Q8_0: a float16 scale, codes -127 to 127; weight = scale * code."""
    blocks = weight.reshape(weight.shape[0], -1, 32)
    scale = (blocks.abs().amax(-1, keepdim=True) / 127).half().float()
    codes = (blocks / torch.where(scale == 0, 1.0, scale)).round().clamp(-127, 127)
    return (scale * codes).reshape(weight.shape)


def q4_0(weight: torch.Tensor) -> torch.Tensor:
    """Q4_0: a float16 scale, codes 0-15 around 8; weight = scale * (code - 8)."""
    blocks = weight.reshape(weight.shape[0], -1, 32)
    top = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
    scale = (top / -8).half().float()
    codes = (blocks / torch.where(scale == 0, 1.0, scale) + 8).round().clamp(0, 15)
    return (scale * (codes - 8)).reshape(weight.shape)


@pytest.mark.parametrize("quantize, bits", [(q4_1, 4), (q8_0, 8), (q4_0, 8)])
def test_it_recovers_gguf_blocks_bit_for_bit(quantize, bits):
    weight = quantize(torch.randn(70, 96, generator=torch.Generator().manual_seed(bits)))
    weight[3, :32] = 0.25  # a constant block: scale 0
    blocks = block_linear.recover(weight)
    assert blocks is not None and blocks.bits == bits
    assert torch.equal(block_linear.dequantize(blocks), weight)
    # The kernel multiplies by these very weights: rows of the identity give them back.
    assert torch.equal(block_linear.linear(torch.eye(96), blocks), weight.t())
    assert blocks.nbytes < weight.numel() * (1.0 if bits == 4 else 1.7)


def test_it_leaves_float_weights_alone():
    generator = torch.Generator().manual_seed(0)
    assert block_linear.recover(torch.randn(40, 64, generator=generator)) is None  # trained in float
    assert block_linear.recover(q4_1(torch.randn(40, 64, generator=generator))[:, :48]) is None  # 48 inputs
    assert block_linear.recover(q4_1(torch.randn(4, 64, generator=generator)).double()) is None
    nearly = q4_1(torch.randn(40, 64, generator=generator))
    nearly[7, 5] = torch.nextafter(nearly[7, 5], torch.tensor(9.0))  # one weight one ulp off its block
    assert block_linear.recover(nearly) is None


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), blocks_in=st.integers(1, 6), features_out=st.integers(1, 100),
       bias=st.booleans(), four_bit=st.booleans(), seed=st.integers(0, 2**16))
def test_it_computes_what_linear_computes(rows, blocks_in, features_out, bias, four_bit, seed):
    """Any shape of whole blocks: outputs that fill no whole tile (16), rows across passes (16), bias."""
    generator = torch.Generator().manual_seed(seed)
    weight = (q4_1 if four_bit else q8_0)(torch.randn(features_out, 32 * blocks_in, generator=generator))
    b = torch.randn(features_out, generator=generator) if bias else None
    x = torch.randn(rows, 32 * blocks_in, generator=generator)
    got = block_linear.linear(x, block_linear.recover(weight), b)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, b), rtol=1e-5,
                               atol=1e-6 * 32 * blocks_in)


@pytest.mark.parametrize("features_in, features_out", [(576, 1536), (1536, 576), (64, 49)])
def test_each_row_gets_the_bits_it_gets_alone(features_in, features_out):
    """What keeps tree forwards lossless: row r of a product of m rows equals row r alone, for every m up
    to 40 (several passes of `MAX_ROWS`), and equals `stream_linear`'s product of the float32 matrix (one
    fused multiply-add per input, ascending), where that runs."""
    torch.manual_seed(0)
    weight, bias = q4_1(torch.randn(features_out, features_in)), torch.randn(features_out)
    blocks = block_linear.recover(weight)
    x = torch.randn(40, features_in)
    alone = torch.cat([block_linear.linear(x[r:r + 1], blocks, bias) for r in range(40)])
    for rows in range(2, 41):
        assert torch.equal(block_linear.linear(x[:rows], blocks, bias), alone[:rows]), rows
    if stream_linear.available():
        streamed = stream_linear.linear(x[:12], stream_linear.pack(weight), bias)
        assert torch.equal(streamed, alone[:12])


def test_it_refuses_what_it_cannot_multiply():
    blocks = block_linear.recover(q8_0(torch.randn(40, 64)))
    with pytest.raises(ValueError, match="x has 65 features, the weight 64 inputs"):
        block_linear.linear(torch.randn(2, 65), blocks)
    with pytest.raises(RuntimeError, match="bad bias"):
        block_linear.linear(torch.randn(2, 64), blocks, torch.randn(41))
    with pytest.raises(RuntimeError, match="float32"):
        block_linear.linear(torch.randn(2, 64).double(), blocks)


def quantized_linear(features_in: int, features_out: int, seed: int) -> torch.nn.Linear:
    layer = torch.nn.Linear(features_in, features_out)
    with torch.no_grad():
        layer.weight.copy_(q4_1(torch.randn(features_out, features_in,
                                            generator=torch.Generator().manual_seed(seed))))
    return layer


def test_a_blocked_layer_takes_trees_here_and_prompts_to_onednn():
    plain = quantized_linear(96, 48, seed=1)
    layer = PackedLinear(plain, blocks=True)
    with torch.inference_mode():
        x = torch.randn(BLOCK_ROWS, 96)
        tree = layer(x)
        assert layer.block_weight() is not None and layer._packed is None
        assert torch.equal(tree, block_linear.linear(x, layer.block_weight(), plain.bias))
        big = torch.randn(BLOCK_ROWS + 1, 96)
        torch.testing.assert_close(layer(big), plain(big), rtol=1e-5, atol=1e-5)
        assert layer._packed is not None
        assert layer(torch.randn(0, 96)).shape == (0, 48)
    with torch.no_grad():
        plain.weight.add_(1e-3)  # changed in place: no longer blocks, so oneDNN multiplies it
    x = torch.randn(3, 96)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), plain(x), rtol=1e-5, atol=1e-5)
        assert layer.block_weight() is None
    x.requires_grad_(True)
    layer(x).sum().backward()  # a gradient to record: torch's own linear
    assert x.grad is not None


def quantized_tiny_target(seed: int, **kwargs):
    """A tiny random Llama whose linear weights are Q4_1 blocks, as a GGUF model's are."""
    target = tiny_target(seed=seed, hidden_size=64, **kwargs)
    with torch.no_grad():
        for module in target.model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(q4_1(module.weight))
    return target


def test_load_target_multiplies_blocks_by_default_where_it_can(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    directory = tmp_path / "tiny"
    quantized_tiny_target(seed=4, vocab_size=49152).model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(load.resolve_model_dir("smollm2-135m")).save_pretrained(directory)
    monkeypatch.delenv("SPECFRAME_CPU_LINEAR", raising=False)
    target = specframe.load_target(str(directory), device="cpu")
    assert linear_kernel(target.model) == "blocks"
    assert target.model.config._attn_implementation == "specframe_exact"  # rows exact end to end
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "onednn")
    assert linear_kernel(specframe.load_target(str(directory), device="cpu").model) == "onednn"
    monkeypatch.setattr(block_linear, "available", lambda: False)
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto falls back quietly
        assert linear_kernel(specframe.load_target(str(directory), device="cpu").model) == "onednn"
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "blocks")
    with pytest.warns(SpecframeWarning, match="needs an x86-64 CPU with AVX-512"):
        assert linear_kernel(specframe.load_target(str(directory), device="cpu").model) == "onednn"


def test_a_float_model_keeps_onednn(tmp_path):
    target = tiny_target(seed=5, hidden_size=64)
    pack_linear_layers(target.model, blocks=True)
    assert linear_kernel(target.model) == "onednn"


def test_greedy_speculation_on_a_blocked_model_equals_plain_greedy():
    from specframe.runtime.attention import EXACT, use_attention

    target = quantized_tiny_target(seed=6, vocab_size=64, tokenizer=False)
    pack_linear_layers(target.model, blocks=True)
    assert linear_kernel(target.model) == "blocks" and use_attention(target.model, EXACT)
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    plain = specframe.SpeculativeDecoder.from_names(target, "none", budget=1).generate(prompt, 24)
    for tree in ("chain", "trie"):
        spec = specframe.SpeculativeDecoder.from_names(target, "pld", tree, budget=20).generate(prompt, 24)
        assert spec.tokens == plain.tokens, tree


@pytest.mark.slow
def test_greedy_speculation_on_blocked_smollm2_equals_plain_greedy(monkeypatch):
    """The real model, on its default CPU path: its Q4_1 layers and Q8_0 output layer are found as blocks,
    and trees of up to 24 nodes verified through the kernel decode token for token as plain steps do."""
    monkeypatch.delenv("SPECFRAME_CPU_LINEAR", raising=False)
    target = specframe.load_target("smollm2-135m", device="cpu")
    assert linear_kernel(target.model) == "blocks"
    blocked = [m for m in target.model.modules() if isinstance(m, PackedLinear) and m.block_weight()]
    assert len(blocked) == 30 * 7 + 1  # every projection and the output layer
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    plain = specframe.SpeculativeDecoder.from_names(target, "none", budget=1).generate(prompt,
                                                                                       max_new_tokens=48)
    for tree, budget in (("chain", 8), ("trie", 24)):
        out = specframe.SpeculativeDecoder.from_names(target, "pld", tree, budget=budget).generate(
            prompt, max_new_tokens=48)
        assert out.tokens == plain.tokens, tree


def test_a_blocked_layer_is_exact_by_construction_not_by_probe(monkeypatch):
    """`invariant_rows` probes kernels the CPU chooses; `block_linear` sums each row in one order, as
    `test_each_row_gets_the_bits_it_gets_alone` checks, so its layers skip the probe (seconds per model)."""
    from specframe.runtime import packed_linear

    monkeypatch.setattr(packed_linear, "_probe_rows", lambda *args: pytest.fail("probed"))
    layer = PackedLinear(quantized_linear(64, 40, seed=2), blocks=True)
    assert packed_linear.invariant_rows(layer, 64) == BLOCK_ROWS
    assert packed_linear.invariant_rows(layer, 8) == 8
