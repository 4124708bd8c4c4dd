"""Component options and plugin loading fail at assembly with a message, never mid-decode or wholesale:
option names and types are checked against the constructor, unquoted paths parse, a broken plugin is
reported by name while the others stay usable, and SPECFRAME_LOAD_PLUGINS is named when it hides one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

import pytest
from ssm_models import tiny_ssm_target

import specframe
from specframe import ConfigurationError, UnknownComponentError
from specframe.terms.errors import UnsupportedModelError
from specframe.plugging.options import describe, matches
from specframe.plugging.pipeline import check_specs
from specframe.plugging.registry import PluginRegistry
from specframe.plugging.specs import ComponentSpec
from specframe.testing.targets import tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target(0)


@pytest.mark.parametrize("drafter,tree,message", [
    ("pld(max_ngram=abc)", "chain", r"option max_ngram='abc' must be int"),
    ("pld(matches=1.5)", "chain", r"option matches=1.5 must be int"),
    ("draft-model(layers=1)", "dynamic(topk=abc)", r"tree builder 'dynamic': option topk='abc' must be int"),
    ("pld(nope=1)", "chain", r"drafter 'pld' has no option 'nope'; its options are: max_ngram: int"),
    ("pld", "static(widths=[3, 'x'])", r"option widths=\[3, 'x'\] must be"),
])
def test_wrong_option_names_and_types_are_refused_at_assembly(target, drafter, tree, message):
    with pytest.raises(ConfigurationError, match=message):
        specframe.assemble(target, drafter, tree)


def test_right_options_of_every_shape_pass(target):
    specframe.assemble(target, "pld(max_ngram=3, matches=2)", "static(widths=(3, 2))")
    specframe.assemble(target, "draft-model(layers=1, topk=2)", "static(paths=[[0], [1]])")
    specframe.assemble(target, "pld", "chain", "typical(threshold=1, alpha=0.5)")  # an int where a float is


def test_unquoted_paths_parse_and_unparseable_options_show_the_quoted_form():
    spec = ComponentSpec.parse("draft-model(model=/models/small-lm, layers=2)")
    assert spec.options == {"model": "/models/small-lm", "layers": 2}
    with pytest.raises(ConfigurationError, match=r"model='/path/to/model'"):
        ComponentSpec.parse("draft-model(=3)")


@pytest.mark.parametrize("component,message", [
    ({"backend": "ssm-tree(commit='fast')"}, r"option commit='fast' must be one of 'replay', 'closed'"),
    ({"backend": "ssm-tree(scan=1)"}, r"option scan=1 must be one of 'auto', 'torch', 'triton'"),
    ({"drafter": "s4c(draw='nucleus')"}, r"option draw='nucleus' must be one of 'auto', 'top-k', 'sample'"),
])
def test_choice_options_are_refused_before_any_model_loads(component, message):
    """Options typed as a `Literal` list their choices, and `check_specs` (no target) refuses others."""
    with pytest.raises(ConfigurationError, match=message):
        check_specs(**component)
    check_specs(backend="ssm-tree(commit='closed', scan='torch')", drafter="draft-model(draw='sample')")


def test_a_literal_hint_matches_its_choices_only_and_by_type():
    hint = Literal["auto", 1]
    assert matches("auto", hint) and matches(1, hint)
    assert not matches("Auto", hint) and not matches(True, hint) and not matches(1.0, hint)
    assert matches(None, Literal["a"] | None) and describe(hint) == "one of 'auto', 1"


class FakeEntryPoint(SimpleNamespace):
    def load(self):
        if isinstance(self.plugin, Exception):
            raise self.plugin
        return self.plugin


class DuplicatePld:
    """A plugin that registers a second drafter named 'pld'."""

    @staticmethod
    @specframe.hookimpl
    def register_drafters(register):
        class Pld(specframe.Drafter):
            name = "pld"

            def propose(self, context):
                return specframe.DraftProposal.empty()

        register(Pld)


def test_a_broken_or_clashing_plugin_is_reported_and_the_others_stay_usable(monkeypatch):
    from importlib.metadata import entry_points

    real = list(entry_points(group="specframe"))
    fakes = [FakeEntryPoint(name="broken", dist=None, plugin=ImportError("No module named 'missing_dep'")),
             FakeEntryPoint(name="clash", dist=None, plugin=DuplicatePld)]
    monkeypatch.setattr("specframe.plugging.registry.entry_points", lambda group: [*real, *fakes])
    registry = PluginRegistry()
    assert registry.get("drafter", "pld").__module__.startswith("specframe_pld")  # the first-party one
    assert {"broken", "clash"} == set(registry.failures)
    assert "missing_dep" in registry.failures["broken"] and "registered twice" in registry.failures["clash"]
    assert registry.describe()["failed"].keys() == {"broken", "clash"}
    monkeypatch.setattr("specframe.plugging.registry._registry", registry)
    with pytest.raises(UnknownComponentError, match=r"plugin 'broken' failed to load \(ImportError"):
        registry.get("drafter", "from-broken")


def test_unknown_names_say_when_specframe_load_plugins_hides_them(monkeypatch):
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "nosuch")
    registry = PluginRegistry()
    monkeypatch.setattr("specframe.plugging.registry._registry", registry)
    hint = r"Known drafters: none, pld. Note: SPECFRAME_LOAD_PLUGINS='nosuch' limits which plugins"
    with pytest.raises(UnknownComponentError, match=hint):  # the defaults' plugins load regardless
        registry.get("drafter", "rest")


def test_a_recurrent_draft_model_is_refused_when_the_drafter_is_built():
    from specframe_draft.drafter import check_croppable

    check_croppable(tiny_target(1))  # attention only: fine
    with pytest.raises(UnsupportedModelError, match=r"cannot be a draft model: .*cropping a KV cache"):
        check_croppable(tiny_ssm_target("bamba"))


def test_score_kinds_and_chain_only_backends_are_checked_at_assembly(target):
    from specframe import BackendCapabilities, CapabilityError, SamplingParams
    from specframe.plugging.pipeline import check_compatible
    from specframe.testing.drafts import TinyModelDrafter

    registry = specframe.get_registry()
    beam, chain, trie = (registry.get("tree builder", n) for n in ("beam", "chain", "trie"))
    greedy, kv = registry.get("verifier", "greedy"), registry.get("backend", "kv")
    with pytest.raises(CapabilityError, match=r"'beam' ranks nodes by log-prob scores, but drafter "
                                              r"'test-tiny-model' scores by frequency"):
        check_compatible(target, TinyModelDrafter, beam, greedy, kv, SamplingParams())
    check_compatible(target, registry.get("drafter", "draft-model"), beam, greedy, kv, SamplingParams())

    class ChainOnly(kv):
        name = "chain-only"
        capabilities = BackendCapabilities(supports_trees=False)

    pld = registry.get("drafter", "pld")
    with pytest.raises(CapabilityError, match=r"'chain-only' scores chains only.*"
                                              r"a tree builder that makes chains, such as 'chain'"):
        check_compatible(target, pld, trie, greedy, ChainOnly, SamplingParams())
    check_compatible(target, pld, chain, greedy, ChainOnly, SamplingParams())


@pytest.mark.parametrize("component,message", [
    ({"drafter": "suffix(max_depth=1000000000000)"}, r"'suffix': option max_depth=1000000000000 is out of "
                                                     r"range: integer must be from 1 to 4096"),
    ({"drafter": "suffix(max_cached=4294967296)"}, r"option max_cached=4294967296 is out of range"),
    ({"drafter": "pld(max_ngram=1000000000)"}, r"'pld': option max_ngram=1000000000 is out of range"),
    ({"drafter": "s4c(topk=100000)"}, r"'s4c': option topk=100000 is out of range"),
    ({"drafter": "s4c(widths=(1, 100000))"}, r"option widths=\(1, 100000\) is out of range: each integer"),
    ({"drafter": "draft-model(layers=1, num_tokens=100000)"}, r"option num_tokens=100000 is out of range"),
    ({"drafter": "rest(k=10000000000)"}, r"'rest': option k=10000000000 is out of range: .* 2147483647"),
    ({"tree": "beam(width=1099511627776)"}, r"'beam': option width=1099511627776 is out of range"),
    ({"tree": "dynamic(depth=100000)"}, r"'dynamic': option depth=100000 is out of range"),
    ({"tree": "static(widths=(4097,))"}, r"'static': option widths=\(4097,\) is out of range"),
])
def test_integer_options_beyond_what_a_component_takes_are_refused_before_any_model_loads(component,
                                                                                          message):
    """An integer option is bounded by its component's `option_limits`, else by a C int."""
    with pytest.raises(ConfigurationError, match=message):
        check_specs(**component)


def test_bounded_options_still_take_their_largest_values(target):
    check_specs("pld(max_ngram=64, min_ngram=64)", "beam(width=4096, depth=4096)")
    check_specs("s4c(topk=4096, widths=(1, 4096), depth=64)", "dynamic(topk=4096, depth=4096)")
    specframe.assemble(target, "suffix(max_depth=4096, max_cached=2147483647)", "static(widths=(64, 64))")


def test_a_static_preset_too_large_to_make_is_refused(target):
    """Each width may be in range while the product is not: the paths are made up front."""
    with pytest.raises(ConfigurationError, match="more than 4096 nodes"):
        specframe.assemble(target, "pld", "static(preset='cartesian', widths=(64, 64, 64))")
    with pytest.raises(ConfigurationError, match="more than 4096 nodes"):
        specframe.assemble(target, "pld", "static(depth=4096, width=4096)")


def test_a_budget_beyond_what_a_step_can_verify_is_refused():
    from specframe.terms.budget import MAX_BUDGET, parse_budget

    assert parse_budget(MAX_BUDGET) == (MAX_BUDGET, False)
    for budget in (10**12, f"auto:{MAX_BUDGET + 1}"):
        with pytest.raises(ConfigurationError, match=f"pass at most {MAX_BUDGET}"):
            parse_budget(budget)
