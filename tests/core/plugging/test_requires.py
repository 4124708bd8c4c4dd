"""Components that need others: the registry question "which backends serve this target", a backend's
refusal composed from every backend's answer, declared `requires` checked at assembly, and the accessor
`specframe.kit.components.required` that hands out only what a component declared."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import specframe
from specframe import ComponentKind, ConfigurationError, UnsupportedModelError
from specframe.kit.components import required
from specframe.plugging.pipeline import backend_refusal, check_specs, check_serves
from specframe.plugging.registry import PluginRegistry

# Not a model the `kv` backend knows (it refuses any model type it was not verified on).
TOY = SimpleNamespace(name="toy-model", config=SimpleNamespace(model_type="toy"))


class _Backend(specframe.StateBackend):
    committed_length = 0

    def prefill(self, ids):
        pass

    def score(self, tree):
        pass

    def commit(self, scored, path, bonus):
        pass


class _Serves(_Backend):
    name = "serves-toys"


class _Refuses(_Backend):
    name = "refuses-toys"

    @classmethod
    def unsupported_reason(cls, target):
        return f"it reads no {target.config.model_type} models"


class _Broken(_Backend):
    name = "broken-check"

    @classmethod
    def unsupported_reason(cls, target):
        raise RuntimeError("no config")


class _NeedsMissing(specframe.Drafter):
    name = "needs-missing"
    requires = ((ComponentKind.DRAFTER, "nosuch"),)

    def propose(self, context):
        return specframe.DraftProposal.empty()


class _NeedsKv(_NeedsMissing):
    name = "needs-kv"
    requires = (("backend", "kv"),)  # a plain string names the kind too


def _registry(monkeypatch, *backends: type, drafters: tuple[type, ...] = ()) -> PluginRegistry:
    """A registry of the core's defaults (kv among them) and the given components."""
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "")

    class Plugin:
        @staticmethod
        @specframe.hookimpl
        def register_state_backends(register):
            for cls in backends:
                register(cls)

        @staticmethod
        @specframe.hookimpl
        def register_drafters(register):
            for cls in drafters:
                register(cls)

    registry = PluginRegistry()
    registry.load()
    registry.register_plugin(Plugin, name="toys")
    return registry


def test_the_registry_asks_every_backend_once(monkeypatch):
    registry = _registry(monkeypatch, _Refuses, _Serves, _Broken)
    answers = registry.backends_for(TOY)
    assert list(answers) == ["kv", "refuses-toys", "serves-toys", "broken-check"]  # registration order
    assert answers["serves-toys"] is None
    assert answers["refuses-toys"] == "it reads no toy models"
    assert "'toy'" in answers["kv"]
    assert "RuntimeError: no config" in answers["broken-check"]  # one broken check hides no other answer


def test_a_refusal_recommends_the_backends_that_serve_the_model(monkeypatch):
    registry = _registry(monkeypatch, _Refuses, _Serves)
    refusal = backend_refusal(TOY, "refuses-toys", registry)
    assert refusal == ("backend 'refuses-toys' cannot serve model 'toy-model': it reads no toy models; "
                       "use the 'serves-toys' backend")
    assert backend_refusal(TOY, "serves-toys", registry) is None
    with pytest.raises(UnsupportedModelError, match="use the 'serves-toys' backend"):
        check_serves(TOY, "kv", registry)


def test_a_refusal_says_when_no_installed_backend_serves_the_model(monkeypatch):
    registry = _registry(monkeypatch, _Refuses)
    refusal = backend_refusal(TOY, "kv", registry)
    assert refusal.startswith("backend 'kv' cannot serve model 'toy-model': its model type 'toy'")
    assert refusal.endswith("; the 'refuses-toys' backend refuses it too (it reads no toy models), so no "
                            "installed backend serves it yet")
    assert "use the" not in refusal


def test_a_component_whose_requirement_is_missing_is_refused_at_assembly(monkeypatch):
    registry = _registry(monkeypatch, drafters=(_NeedsMissing, _NeedsKv))
    check_specs("needs-kv", registry=registry)  # kv is there
    for drafter in ("needs-missing", _NeedsMissing):  # by name or as a class
        with pytest.raises(ConfigurationError) as info:
            check_specs(drafter, registry=registry)
        message = str(info.value)
        assert message.startswith("drafter 'needs-missing'") and "needs drafter 'nosuch'" in message
        assert "`requires`" in message and "the plugin that provides drafter 'nosuch'" in message


def test_the_accessor_hands_out_only_declared_components(monkeypatch):
    registry = _registry(monkeypatch, drafters=(_NeedsKv,))
    assert required(_NeedsKv, "backend", "kv", registry) is registry.get("backend", "kv")
    with pytest.raises(ConfigurationError, match=r"does not declare .*add \('drafter', 'pld'\) to "):
        required(_NeedsKv, ComponentKind.DRAFTER, "pld", registry)
    with pytest.raises(ConfigurationError, match="needs drafter 'nosuch'"):  # declared, not installed
        required(_NeedsMissing, "drafter", "nosuch", registry)


def test_a_malformed_declaration_is_refused_at_registration(monkeypatch):
    class Malformed(_NeedsMissing):
        name = "malformed"
        requires = ("kv",)

    with pytest.raises(TypeError, match=r"Malformed.requires must be a tuple of \(kind, name\) pairs"):
        _registry(monkeypatch, drafters=(Malformed,))


def test_first_party_needs_are_declared(monkeypatch):
    """suffix-heads drafts with s4c's heads and draft-model crops as kv does: both say so, and
    suffix-heads without the s4c plugin is refused naming it."""
    registry = specframe.get_registry()
    assert ("drafter", "s4c") in registry.get("drafter", "suffix-heads").requires
    assert ("backend", "kv") in registry.get("drafter", "draft-model").requires
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "suffix")
    with pytest.raises(ConfigurationError, match="drafter 'suffix-heads' .*needs drafter 's4c'"):
        check_specs("suffix-heads", registry=PluginRegistry())
