"""Which models the `kv` backend admits: every family in `VERIFIED_MODEL_TYPES` is proven here on a tiny
random model (tree logits equal plain forwards, commits leave the plain run's state); any other family,
a recurrent one above all (RWKV, xLSTM), is refused, and no refusal sends the user to a backend that
refuses the model too."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from specframe import SpeculativeDecoder, Target, UnsupportedModelError, get_registry
from first_party import first_party_registry, own_words
from specframe.plugging.pipeline import backend_refusal
from specframe.testing.checks import check_backend_scores
from specframe_kv import VERIFIED_MODEL_TYPES, KVCacheBackend

VOCAB = 64
_SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2, pad_token_id=None,
              bos_token_id=None, eos_token_id=None)
RECOMMENDS = re.compile(r"(?:use|or) the '([\w-]+)' backend")


def tiny_model(model_type: str, **overrides) -> Target:
    config = AutoConfig.for_model(model_type, **{**_SMALL, **overrides})
    if model_type == "mistral":
        config.sliding_window = overrides.get("sliding_window")  # on by default: refused (see below)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
    return Target(model, None, f"tiny-{model_type}")


def tiny_recurrent(kind: str) -> Target:
    """Tiny RWKV and xLSTM models: attention-free, with states outside any KV cache and no layer types."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        if kind == "rwkv":
            model = transformers.RwkvForCausalLM(transformers.RwkvConfig(
                vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                intermediate_size=64, context_length=128))
        else:
            model = transformers.xLSTMForCausalLM(transformers.xLSTMConfig(
                vocab_size=VOCAB, hidden_size=32, embedding_dim=32, num_hidden_layers=2, num_blocks=2,
                num_heads=2, chunk_size=8, max_inference_chunksize=16))
    return Target(model.eval(), None, f"tiny-{kind}")


def refusal(target: Target, backend: str) -> str | None:
    """`backend`'s refusal of `target` as the registry composes it, among specframe's own backends."""
    return backend_refusal(target, backend, first_party_registry())


def check_recommendations(target: Target) -> None:
    """Every backend's refusal, as the registry composes it, recommends only backends that accept the
    model."""
    for name in ("kv", "ssm-tree", "ssm-unrolled"):
        reason = refusal(target, name) or ""
        for other in RECOMMENDS.findall(own_words(reason)):
            assert get_registry().get("backend", other).unsupported_reason(target) is None, \
                f"{name} sends {target.name} to {other}: {reason}"


@pytest.mark.parametrize("model_type", VERIFIED_MODEL_TYPES)
def test_every_verified_family_is_served_exactly(model_type):
    target = tiny_model(model_type)
    assert KVCacheBackend.unsupported_reason(target) is None
    check_backend_scores(KVCacheBackend, target, list(range(3, 20)), np.random.default_rng(0), trees=3)


@pytest.mark.parametrize("kind", ["rwkv", "xlstm"])
def test_recurrent_models_without_layer_types_are_refused_and_sent_nowhere(kind):
    """RWKV and xLSTM keep state outside a KV cache: kv would serve RWKV with wrong tokens and crash on
    xLSTM, so kv refuses both and ssm-tree does not send them to it."""
    target = tiny_recurrent(kind)
    reason = refusal(target, "kv")
    assert f"model type '{kind}'" in reason and "llama" in reason
    assert "no installed backend serves it" in reason
    assert not RECOMMENDS.search(own_words(reason)), reason
    tree_reason = refusal(target, "ssm-tree")
    assert "'kv' backend refuses it too" in tree_reason, tree_reason
    assert "no installed backend serves it yet" in tree_reason, tree_reason
    check_recommendations(target)
    for backend in ("kv", "ssm-tree"):
        with pytest.raises(UnsupportedModelError, match=f"tiny-{kind}"):
            SpeculativeDecoder.from_names(target, "pld", backend=backend)


def test_an_unverified_attention_family_is_refused_by_name():
    target = tiny_model("llama")
    target.model.config.model_type = "future_attention"
    assert "'future_attention'" in KVCacheBackend.unsupported_reason(target)
    reason = refusal(target, "kv")  # the registry adds: no backend serves it
    assert "'future_attention'" in reason and "no installed backend serves it yet" in reason
    check_recommendations(target)


def test_a_sliding_window_without_layer_types_is_refused():
    target = tiny_model("mistral", sliding_window=16)
    assert "sliding window of 16 tokens" in KVCacheBackend.unsupported_reason(target)


def test_an_attention_only_model_is_sent_to_kv_by_ssm_tree():
    assert "use the 'kv' backend" in refusal(tiny_model("qwen3"), "ssm-tree")
