"""Registry: duplicates, unknown names, component specs, and entry-point discovery of an installed package."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import specframe
from specframe import ComponentSpec, ConfigurationError, DuplicateComponentError, UnknownComponentError
from specframe.registry import PluginRegistry


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
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "pld")
    registry = PluginRegistry()
    assert "pld" in registry.names("drafter")
    assert registry.names("backend") == []


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
