"""The README and the component reference name every first-party component and preset the registry holds,
so that a newly registered drafter, tree builder, verifier, backend or preset cannot go unmentioned."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from specframe.plugging.registry import PluginRegistry

ROOT = Path(__file__).resolve().parents[3]
PAGES = {"README.md": ROOT / "README.md",
         "docs/reference/components.md": ROOT / "docs" / "reference" / "components.md"}


def first_party(registry: PluginRegistry, plugin: str) -> bool:
    """Whether the plugin registered as `plugin` is a package under `plugins/` (not the example plugin,
    nor one installed from elsewhere)."""
    module = registry.pm.get_plugin(plugin)
    try:
        return Path(inspect.getfile(module)).resolve().is_relative_to(ROOT / "plugins")
    except TypeError:  # a plugin object with no file
        return False


def registered() -> list[tuple[str, str]]:
    """(kind, name) of every first-party component (drafter, tree builder, verifier, state backend) and
    preset."""
    registry = PluginRegistry()
    registers = [(str(kind.value), register) for kind, register in registry.registers.items()]
    registers.append(("preset", registry.presets))
    return sorted((kind, name) for kind, register in registers for name in register.names()
                  if first_party(registry, register.owner(name)))


def named(name: str, text: str) -> bool:
    """Whether `text` names `name` as code: `name`, or `name(...)` with options."""
    return re.search(rf"`{re.escape(name)}(?:\([^`]*\))?`", text) is not None


def test_the_check_finds_the_shipped_components_and_presets():
    found = registered()
    for expected in [("drafter", "suffix-heads"), ("tree builder", "trie"), ("verifier", "typical"),
                     ("backend", "llamacpp"), ("preset", "suffix-s4c"), ("preset", "suffix-self")]:
        assert expected in found, (expected, found)
    assert not any(n in ("bigram", "breadth-first", "recompute") for _, n in found)  # the example plugin


def test_a_name_missing_from_a_page_is_caught():
    assert named("suffix", "a preset (`pld`, `suffix`)") and named("pld", "`pld(matches=3)`")
    assert not named("suffix", "`suffix-heads` and `suffix-rest`")


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_registered_component_and_preset_is_named(page):
    text = PAGES[page].read_text()
    missing = [f"{kind} {name}" for kind, name in registered() if not named(name, text)]
    assert not missing, f"{page} does not name {missing}: add them to its components and presets"
