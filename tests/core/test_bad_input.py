"""Bad input gets a clear error that says how to fix it."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import tiny_llama

import specframe
from specframe import (
    CapabilityError, ConfigurationError, ModelLoadError, PromptError, SamplingParams, SpeculativeDecoder,
    UnknownComponentError, UnsupportedModelError,
)


@pytest.fixture(scope="module")
def decoder():
    return SpeculativeDecoder.from_names(tiny_llama(), "pld", "chain", "greedy", "kv")


def test_empty_prompt(decoder):
    with pytest.raises(PromptError, match="empty"):
        decoder.generate([], max_new_tokens=4)
    with pytest.raises(PromptError, match="empty"):
        decoder.generate("   ", max_new_tokens=4)


@pytest.mark.parametrize("n", [0, -3])
def test_max_new_tokens_must_be_positive(decoder, n):
    with pytest.raises(ConfigurationError, match="max_new_tokens"):
        decoder.generate([1, 2, 3], max_new_tokens=n)


def test_prompt_longer_than_context(decoder):
    with pytest.raises(PromptError, match="exceeds the context"):
        decoder.generate([1] * 600, max_new_tokens=4)


def test_token_ids_out_of_range(decoder):
    with pytest.raises(PromptError, match=r"\[0, 96\)"):
        decoder.generate([1, 2, 500], max_new_tokens=4)


def test_unknown_plugin_names():
    target = tiny_llama()
    for kind in ("drafter", "tree", "verifier", "backend"):
        names = {"drafter": "pld", "tree": "chain", "verifier": "greedy", "backend": "kv", kind: "no-such"}
        with pytest.raises(UnknownComponentError, match="Known"):
            SpeculativeDecoder.from_names(target, names["drafter"], names["tree"], names["verifier"],
                                          names["backend"])


def test_budget_zero():
    with pytest.raises(ConfigurationError, match="budget must be a number of tree nodes >= 1"):
        SpeculativeDecoder.from_names(tiny_llama(), "pld", budget=0)


def test_unknown_component_option():
    with pytest.raises(ConfigurationError, match="pld"):
        SpeculativeDecoder.from_names(tiny_llama(), "pld(no_such_option=1)")


def test_greedy_verifier_refuses_sampling():
    with pytest.raises(CapabilityError, match="greedy only"):
        SpeculativeDecoder.from_names(tiny_llama(), "pld", verifier="greedy",
                                      sampling=SamplingParams(temperature=0.7))


def test_kv_backend_refuses_stateful_models():
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    config = Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16,
                          state_size=8, n_groups=1, expand=2)
    target = specframe.Target(Mamba2ForCausalLM(config).eval(), None, "tiny-mamba2")
    with pytest.raises(UnsupportedModelError, match="backend 'kv' cannot serve"):
        SpeculativeDecoder.from_names(target, "pld", backend="kv")


def test_unknown_model_alias():
    with pytest.raises(ModelLoadError,
                       match="is not a local Hugging Face model directory, a .gguf file, a known alias"):
        specframe.load_target("no-such-model")


def test_cli_reports_errors_without_traceback():
    out = subprocess.run([sys.executable, "-m", "specframe.cli", "generate", "hi", "--drafter", "nope",
                          "--model", "no-such-model"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("error:") and "Traceback" not in out.stderr


def test_cli_plugins_is_json():
    out = subprocess.run([sys.executable, "-m", "specframe.cli", "plugins"], capture_output=True, text=True,
                         check=True)
    assert "pld" in json.loads(out.stdout)["components"]["drafters"]
