"""Bad input gets a clear error that says how to fix it."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import tiny_llama

import specframe
from specframe import (
    CapabilityError, ConfigurationError, DrafterError, ModelLoadError, PromptError, SamplingParams,
    SpeculativeDecoder, UnknownComponentError, UnsupportedModelError,
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


class FailingDrafter(specframe.Drafter):
    """Drafts nothing, then fails (as a drafter reading a damaged store does) once 6 tokens are out."""

    name = "failing"

    def propose(self, context):
        if len(context.tokens) - context.prompt_len >= 6:
            raise IndexError("index 5000 is out of bounds for axis 0 with size 4")
        return specframe.DraftProposal.empty()


def test_a_drafter_failing_mid_request_keeps_what_was_decoded():
    from specframe.testing import checks
    from specframe.testing.targets import reference_greedy

    target, prompt = tiny_llama(), [5, 9, 14, 5, 9]
    decoder = checks.make_decoder(target, FailingDrafter, "chain", "greedy", "kv", budget=2)
    with pytest.raises(DrafterError, match=r"drafter 'failing' failed after 6 new tokens \(IndexError: index "
                       r"5000.*kept.*--drafter none") as raised:
        decoder.generate(prompt, max_new_tokens=20)
    partial = raised.value.partial
    assert partial.finish_reason == "error" and partial.tokens == reference_greedy(target, prompt, 6)
    assert isinstance(raised.value.__cause__, IndexError)
    with pytest.raises(DrafterError) as batch:
        decoder.generate_batch([prompt, prompt[:3], prompt[1:]], 20, batch_size=2)
    rows = batch.value.partial
    assert [len(row.tokens) for row in rows[:2]] == [6, 6] and rows[2] is None


def test_generate_prints_what_was_decoded_before_the_error_line(monkeypatch, capsys):
    from specframe.cli import main
    from specframe.decode.loop import SpeculativeDecoder
    from specframe.terms.result import GenerationResult

    def fail(self, *args, **kwargs):
        raise DrafterError("drafter 'rest' failed after 2 new tokens",
                           GenerationResult([7, 8], "so far", "error"))

    monkeypatch.setattr("specframe.runtime.load.load_target", lambda *args, **kwargs: tiny_llama())
    monkeypatch.setattr("specframe.cli.encode_prompt", lambda target, prompt, chat: [5, 9, 14])
    monkeypatch.setattr(SpeculativeDecoder, "generate", fail)
    monkeypatch.setattr(sys, "argv", ["specframe", "generate", "hi", "--model", "tiny"])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    assert exit_.value.code == 2 and out.out == "so far\n"
    assert out.err.startswith("error: drafter 'rest' failed after 2 new tokens"), out.err
