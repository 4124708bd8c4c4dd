"""Presets and command-line options that plugins register (`specframe.contract.extensions`), from a plugin
object
registered in the test: resolved by `specframe bench --methods`, skipped or refused when unusable, listed
by `generate --help` and applied to the environment or to the plugin's component."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import specframe
from specframe import CliOption, ComponentKind, ConfigurationError, Preset
from specframe.bench.methods import parse_method, resolve_methods, usable_presets
from specframe.bench.runner import build_runners
from specframe.terms.errors import SpecframeWarning
from specframe.contract.extensions import applied, option_defaults
from specframe.plugging.registry import PluginRegistry
from specframe.terms.sampling import SamplingParams
from specframe.testing import tiny_target

ENV = "SPECFRAME_TEST_NOTE"
SEEN: list[tuple[int, str | None]] = []  # (width, $SPECFRAME_TEST_NOTE) of every WidthDrafter built


class WidthDrafter(specframe.Drafter):
    name = "third-width"

    def __init__(self, target, *, width: int = 1):
        super().__init__(target)
        self.width = width
        SEEN.append((width, os.environ.get(ENV)))

    def propose(self, context):
        return specframe.DraftProposal.from_sequences([context.tokens[-self.width:]])


class ThirdParty:
    """A third-party plugin: a drafter, two presets and two options, one applied each way."""

    @staticmethod
    @specframe.hookimpl
    def register_drafters(register):
        register(WidthDrafter)

    @staticmethod
    @specframe.hookimpl
    def register_presets(register):
        register(Preset("third", "third-width(width=2)+chain+greedy@5"))
        register(Preset("third-never", "third-width", unusable=lambda target: f"{target.name} is too small"))

    @staticmethod
    @specframe.hookimpl
    def register_cli_options(register):
        register(CliOption("--third-width", help="Width of the third-party drafter.", type=int,
                           component="third-width", option="width"))
        register(CliOption("--third-note", help="A note for the third-party drafter.", envvar=ENV))


@pytest.fixture
def registry(monkeypatch):
    """A fresh process registry holding the installed plugins and `ThirdParty`."""
    registry = PluginRegistry()
    registry.register_plugin(ThirdParty, name="third-party")
    monkeypatch.setattr("specframe.plugging.registry._registry", registry)
    monkeypatch.delenv(ENV, raising=False)
    SEEN.clear()
    return registry


def test_a_third_party_preset_resolves_like_a_first_party_one(registry):
    method = parse_method("third", registry)
    assert [c.name for c in method.components] == ["third-width", "chain", "greedy", "kv"]
    assert method.drafter.options == {"width": 2} and method.budget == 5 and method.preset.name == "third"
    assert parse_method("third@9", registry).budget == 9  # the method's own budget wins
    assert {"third", "third-never", "pld", "rest"} <= set(usable_presets(registry))
    labels = [m.label for m in resolve_methods(["all"], registry)]
    assert "third" in labels and "pld" in labels
    assert registry.describe()["presets"]["third"] == "third-width(width=2)+chain+greedy@5"


def test_an_unusable_preset_is_skipped_from_all_and_refused_when_named(registry):
    target = tiny_target()
    sampling = SamplingParams()
    with pytest.warns(SpecframeWarning, match=r"skipping preset 'third-never': .*tiny-llama-0 is too small"):
        runners = build_runners(target, [m for m in resolve_methods(["all"], registry, 4)
                                         if m.label in ("third", "third-never")], [], sampling, registry)
    assert [r.label for r in runners] == ["baseline", "third"]
    with pytest.raises(ConfigurationError, match=r"preset 'third-never' cannot run on model 'tiny-llama-0'"):
        build_runners(target, resolve_methods(["third-never"], registry), [], sampling, registry)


def test_records_are_checked_when_a_plugin_registers_them():
    with pytest.raises(ConfigurationError, match="must say how its value applies"):
        CliOption("--x", help="x")
    with pytest.raises(ConfigurationError, match="must look like '--name'"):
        CliOption("x", help="x", envvar="X")
    with pytest.raises(ConfigurationError, match="commands must be among generate, bench"):
        CliOption("--x", help="x", envvar="X", commands=("train",))
    with pytest.raises(ConfigurationError, match="no '\\+'"):
        Preset("a+b", "pld")

    class Clashing:
        @staticmethod
        @specframe.hookimpl
        def register_presets(register):
            register(Preset("pld", "pld+trie"))

    registry = PluginRegistry()
    registry.load()
    with pytest.raises(specframe.DuplicateComponentError, match="preset name 'pld' is registered twice"):
        registry.register_plugin(Clashing, name="clashing")
    assert registry.preset("pld").spec == "pld+chain+greedy"  # the plugin was removed whole


def test_option_values_apply_to_the_environment_and_the_component_while_applied(registry):
    width, note = (dict(registry.cli_options.items())[f] for f in ("--third-width", "--third-note"))
    target = tiny_target()
    with applied({width: 3, note: "hello"}):
        assert os.environ[ENV] == "hello"
        assert option_defaults(ComponentKind.DRAFTER, "third-width") == {"width": 3}
        specframe.assemble(target, "third-width")
        specframe.assemble(target, "third-width(width=4)")  # the spec's own option wins
    assert ENV not in os.environ and option_defaults("drafter", "third-width") == {}
    specframe.assemble(target, "third-width")
    assert SEEN == [(3, "hello"), (4, "hello"), (1, None)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random 2-layer Llama over SmolLM2's vocabulary, saved with SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    from specframe.runtime.load import resolve_model_dir

    directory = tmp_path_factory.mktemp("model")
    tiny_target(seed=3, vocab_size=49152, hidden_size=32).model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m")).save_pretrained(directory)
    return directory


def test_generate_takes_a_third_party_option_and_applies_it(registry, model_dir):
    from specframe.cli import build_app

    app = build_app(registry)
    runner = CliRunner()
    help_text = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "200"}).output
    assert "--third-width" in help_text and "--third-note" in help_text and "--datastore" in help_text
    result = runner.invoke(app, ["generate", "one two one two", "--model", str(model_dir), "--drafter",
                                 "third-width", "--third-width", "2", "--third-note", "hi",
                                 "--max-new-tokens", "3", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["new_tokens"] == 3
    assert SEEN == [(2, "hi")] and ENV not in os.environ
