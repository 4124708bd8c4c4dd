"""`specframe.runtime.packed_linear`: linear layers over oneDNN-packed weights compute what `nn.Linear`
computes,
keep the model's parameters (ties, state dicts, training) as they were, and are what `load_target` gives
on the CPU in float32 unless `SPECFRAME_CPU_LINEAR=torch`."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import specframe
from specframe.runtime import load
from specframe.terms.errors import ConfigurationError
from specframe.runtime.packed_linear import (PackedLinear, linear_kernel, native_bfloat16, onednn_available,
                                     pack_linear_layers)
from specframe.testing import tiny_target

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")]


def _pair(rows_in: int, features_out: int, bias: bool, seed: int) -> tuple[torch.nn.Linear, PackedLinear]:
    torch.manual_seed(seed)
    plain = torch.nn.Linear(rows_in, features_out, bias=bias)
    return plain, PackedLinear(plain)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 20), features_in=st.integers(1, 80), features_out=st.integers(1, 80),
       bias=st.booleans(), batched=st.booleans(), seed=st.integers(0, 2**16))
def test_it_computes_what_linear_computes(rows, features_in, features_out, bias, batched, seed):
    plain, packed = _pair(features_in, features_out, bias, seed)
    x = torch.randn((1, rows, features_in) if batched else (rows, features_in))
    with torch.inference_mode():
        got = packed(x)
        want = plain(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_it_uses_the_packed_weight_only_where_that_is_the_same_function():
    plain, packed = _pair(16, 8, True, 0)
    x = torch.randn(3, 16, requires_grad=True)
    with torch.no_grad():
        packed(x)
    assert packed._packed is not None  # inference: packed
    y = packed(x)  # a gradient to record: torch's linear, whose backward is the usual one
    y.sum().backward()
    reference = x.detach().clone().requires_grad_(True)
    plain(reference).sum().backward()
    torch.testing.assert_close(x.grad, reference.grad)
    assert plain.weight.grad is packed.weight.grad  # the same Parameter: one gradient
    half = PackedLinear(torch.nn.Linear(16, 8).to(torch.bfloat16))
    with torch.no_grad():
        out = half(torch.randn(2, 16, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and half._packed is None


@pytest.mark.skipif(not native_bfloat16(), reason="this CPU has no native bfloat16 products")
def test_bfloat16_is_packed_only_when_asked():
    linear = torch.nn.Linear(64, 32).to(torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = F.linear(x, linear.weight, linear.bias)
        packed = PackedLinear(linear, bfloat16=True)
        out = packed(x)
        assert out.dtype == torch.bfloat16 and packed._packed is not None
        torch.testing.assert_close(out, expected)
        default = PackedLinear(linear)
        default(x)
        assert default._packed is None  # float32 only unless asked


def test_a_weight_changed_in_place_or_replaced_is_packed_again():
    plain, packed = _pair(12, 6, False, 1)
    x = torch.randn(4, 12)
    with torch.no_grad():
        packed(x)
        plain.weight.mul_(2)  # what an optimizer step or load_state_dict does
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
        packed.weight = torch.nn.Parameter(torch.randn(6, 12))
        torch.testing.assert_close(packed(x), F.linear(x, packed.weight), rtol=1e-5, atol=1e-5)


def test_copies_and_pickles_work_and_leave_the_packed_copy_out():
    _, packed = _pair(8, 4, True, 2)
    x = torch.randn(2, 8)
    with torch.no_grad():
        packed(x)
        twin = copy.deepcopy(packed)
        buffer = io.BytesIO()
        torch.save(packed, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        for other in (twin, loaded):
            torch.testing.assert_close(other(x), packed(x))
    assert list(packed.state_dict()) == ["weight", "bias"]


def test_packing_a_model_keeps_its_parameters_ties_and_outputs():
    model = tiny_target(seed=3, vocab_size=64, hidden_size=32).model
    ids = torch.tensor([[5, 9, 2, 7, 7, 1]])
    keys = list(model.state_dict())
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    count = pack_linear_layers(model)
    assert count == sum(isinstance(m, PackedLinear) for m in model.modules()) > 0
    assert linear_kernel(model) == "onednn"
    assert list(model.state_dict()) == keys
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    if model.config.tie_word_embeddings:
        assert output.weight is inputs.weight
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-4, atol=1e-4)
    assert pack_linear_layers(model) == 0  # nothing left to replace


def test_load_target_packs_in_float32_and_native_bfloat16_unless_told_not_to(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    directory = tmp_path / "tiny"
    tiny_target(seed=4, vocab_size=49152, hidden_size=32).model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(load.resolve_model_dir("smollm2-135m")).save_pretrained(directory)
    monkeypatch.delenv("SPECFRAME_CPU_LINEAR", raising=False)
    assert linear_kernel(specframe.load_target(str(directory), device="cpu").model) == "onednn"
    half = specframe.load_target(str(directory), device="cpu", dtype="bfloat16")
    assert linear_kernel(half.model) == ("onednn" if native_bfloat16() else "torch")
    float16 = specframe.load_target(str(directory), device="cpu", dtype="float16")
    assert linear_kernel(float16.model) == "torch"
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "torch")
    assert linear_kernel(specframe.load_target(str(directory), device="cpu").model) == "torch"
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "mkl")
    with pytest.raises(ConfigurationError, match="SPECFRAME_CPU_LINEAR='mkl'.*onednn, torch"):
        specframe.load_target(str(directory), device="cpu")


def test_greedy_speculation_on_a_packed_model_equals_plain_greedy():
    target = tiny_target(seed=6, vocab_size=64, hidden_size=32)
    pack_linear_layers(target.model)
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(24):  # plain greedy, the whole sequence each step: one row at a time, no cache
            ids.append(int(target.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    for tree in ("chain", "trie"):
        spec = specframe.SpeculativeDecoder.from_names(target, "pld", tree).generate(prompt, 24)
        assert list(spec.tokens) == ids[len(prompt):], tree
