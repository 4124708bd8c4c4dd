"""Registry: duplicates, unknown names, component specs, and entry-point discovery of an installed package."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import specframe
from specframe import ComponentSpec, ConfigurationError, DuplicateComponentError, UnknownComponentError
from specframe.terms.kinds import DEFAULT_COMPONENTS, PLAIN_DRAFTER, ComponentKind
from specframe.plugging.registry import DEFAULT_PLUGINS, PluginRegistry


class _FirstPld(specframe.Drafter):
    name = "pld"

    def propose(self, context):
        return specframe.DraftProposal.empty()


class _Plugin:
    @staticmethod
    @specframe.hookimpl
    def register_drafters(register):
        register(_FirstPld)


def test_duplicate_names_are_refused_naming_both_classes():
    registry = PluginRegistry()
    registry.load()
    with pytest.raises(DuplicateComponentError) as info:
        registry.register_plugin(_Plugin, name="dupe")
    message = str(info.value)
    assert "specframe_pld.PromptLookupDrafter" in message and "_FirstPld" in message


def test_unknown_name_lists_known_ones():
    registry = PluginRegistry()
    with pytest.raises(UnknownComponentError) as info:
        registry.get("drafter", "nope")
    assert "pld" in str(info.value) and "none" in str(info.value)


def test_load_plugins_filter(monkeypatch):
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "rest")
    registry = PluginRegistry()
    assert "rest" in registry.names("drafter")
    assert "s4c" not in registry.names("drafter") and "ssm-tree" not in registry.names("backend")


@pytest.mark.parametrize("wanted", ["", "rest", "nosuch"])
def test_the_defaults_load_whatever_specframe_load_plugins_says(monkeypatch, wanted):
    """The core names pld, chain, greedy, kv (and `none`, bench's baseline) itself, so their plugins load."""
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", wanted)
    registry = PluginRegistry()
    for kind, name in DEFAULT_COMPONENTS.items():
        assert registry.get(kind, name).name == name
        assert registry.registers[kind].owner(name) in DEFAULT_PLUGINS  # ordinary entry-point plugins
    assert registry.get(ComponentKind.DRAFTER, PLAIN_DRAFTER)
    assert set(registry.distributions) >= set(DEFAULT_PLUGINS)
    assert all(registry.distributions[p].startswith("specframe==") for p in DEFAULT_PLUGINS)
    assert ("rest" in registry.names("drafter")) == (wanted == "rest")


def test_a_third_party_plugin_cannot_shadow_a_default(monkeypatch):
    """Listed before the first-party plugins, a plugin registering `pld` is still the one refused."""
    from importlib.metadata import entry_points
    from types import SimpleNamespace

    shadow = SimpleNamespace(name="aaa-shadow", dist=None, load=lambda: _Plugin)
    monkeypatch.setattr("specframe.plugging.registry.entry_points",
                        lambda group: [shadow, *entry_points(group=group)])
    registry = PluginRegistry()
    assert registry.get("drafter", "pld").__module__ == "specframe_pld"
    assert "registered twice" in registry.failures["aaa-shadow"]


def test_component_kinds_are_str_enums():
    assert ComponentKind.TREE_BUILDER == "tree builder" and f"{ComponentKind.BACKEND}s" == "backends"
    assert str(ComponentKind.DRAFTER) == "drafter" and specframe.ComponentKind is ComponentKind
    registry = specframe.get_registry()
    assert registry.get("drafter", "pld") is registry.get(ComponentKind.DRAFTER, "pld")
    with pytest.raises(UnknownComponentError, match="unknown tree builder 'nope'. Known tree builders"):
        registry.get(ComponentKind.TREE_BUILDER, "nope")


def test_import_specframe_loads_no_plugin():
    code = "import sys, specframe; print(any(m.startswith('specframe_') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_component_spec_parsing():
    assert ComponentSpec.parse("pld") == ComponentSpec("pld", {})
    spec = ComponentSpec.parse("rest(c=16, datastore='/tmp/x', live=True, preset=medusa)")
    assert spec.options == {"c": 16, "datastore": "/tmp/x", "live": True, "preset": "medusa"}
    with pytest.raises(ConfigurationError):
        ComponentSpec.parse("rest(16)")


def test_entry_point_discovery_of_an_installed_package(tmp_path):
    """Install a real third-party package with pip into a fresh directory; a new process finds it."""
    src = tmp_path / "src"
    (src / "sf_thirdparty").mkdir(parents=True)
    (src / "sf_thirdparty" / "__init__.py").write_text(textwrap.dedent("""
        import specframe

        class EchoDrafter(specframe.Drafter):
            name = "echo-last"

            def propose(self, context):
                return specframe.DraftProposal.from_sequences([[int(context.tokens[-1])]])

        @specframe.hookimpl
        def register_drafters(register):
            register(EchoDrafter)
    """))
    (src / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "sf-thirdparty"
        version = "1.2.3"
        [project.entry-points.specframe]
        thirdparty = "sf_thirdparty"
    """))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-m", "specframe.cli", "plugins"], env=env, capture_output=True,
                         text=True, check=True)
    described = json.loads(out.stdout)
    entry = next(p for p in described["plugins"] if p["name"] == "thirdparty")
    assert entry["version"] == "sf-thirdparty==1.2.3"
    assert entry["components"] == {"drafters": ["echo-last"]}


def _plugin_registering(**hooks):
    """A plugin object whose hooks register the given classes: `register_drafters=[cls, ...]`."""
    def implementation(classes):
        @specframe.hookimpl
        def hook(register):
            for cls in classes:
                register(cls)
        return staticmethod(hook)

    return type("Plugin", (), {name: implementation(classes) for name, classes in hooks.items()})


def _drafter(name: str, module: str) -> type:
    return type(f"{module.title()}Drafter", (specframe.Drafter,),
                {"name": name, "__module__": module, "propose": lambda self, context: None})


def _installed(monkeypatch, *plugins):
    """Make `plugins`, (entry point, distribution, plugin object) triples, look installed after the
    real ones."""
    from importlib.metadata import entry_points
    from types import SimpleNamespace

    fakes = [SimpleNamespace(name=ep, dist=SimpleNamespace(name=dist, version="0.1"), load=lambda p=p: p)
             for ep, dist, p in plugins]
    monkeypatch.setattr("specframe.plugging.registry.entry_points",
                        lambda group: [*entry_points(group=group), *fakes])


def test_a_clash_is_reported_where_the_contested_name_is_used(monkeypatch):
    """Two installed plugins register drafter 'twin': asking for it names both plugins (entry point and
    distribution) and both classes, and the refused plugin's other components say why they are missing."""
    tree = type("SecondTree", (specframe.TreeBuilder,), {"name": "second-tree", "build": lambda *a: None})
    first = _plugin_registering(register_drafters=[_drafter("twin", "first_mod")])
    second = _plugin_registering(register_drafters=[_drafter("twin", "second_mod")],
                                 register_tree_builders=[tree])
    _installed(monkeypatch, ("first", "first-dist", first), ("second", "second-dist", second))
    registry = PluginRegistry()
    with pytest.raises(DuplicateComponentError) as clash:
        registry.get("drafter", "twin")
    for part in ("first_mod.First_ModDrafter", "second_mod.Second_ModDrafter",
                 "plugin 'first' (first-dist==0.1)", "plugin 'second' (second-dist==0.1)"):
        assert part in str(clash.value)
    with pytest.raises(UnknownComponentError) as missing:
        registry.get("tree builder", "second-tree")
    message = str(missing.value)
    assert message.startswith("tree builder 'second-tree' is not available: plugin 'second' "
                              "(second-dist==0.1) provides it but was not loaded")
    assert "'twin' is registered twice" in message
    assert "unknown" not in message and registry.get("drafter", "pld")  # everything else works


def test_a_misspelled_hook_is_a_failure_not_a_silent_empty_plugin(monkeypatch):
    typo = _plugin_registering(register_drafterz=[_drafter("typo", "typo_mod")])
    _installed(monkeypatch, ("typo", "typo-dist", typo))
    registry = PluginRegistry()
    assert "'register_drafterz', which is no specframe hook: did you mean 'register_drafters'?" \
        in registry.describe()["failed"]["typo"]
    assert "typo" not in [p["name"] for p in registry.describe()["plugins"]]
    fresh = PluginRegistry()
    with pytest.raises(ConfigurationError, match="did you mean 'register_drafters'"):
        fresh.register_plugin(typo, name="typo")
    assert not fresh.pm.has_plugin("typo")
