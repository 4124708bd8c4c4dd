"""The third-party example plugin (examples/specframe-example-plugin), installed as a real distribution:
discovered through its `specframe` entry point, listed by `specframe plugins`, and lossless."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from pathlib import Path

import pytest

import specframe
from specframe.plugging.registry import PluginRegistry
from specframe.testing import check_lossless, make_decoder, repetitive_prompt

DIST = "specframe-example-plugin"
INSTALL = "pip install -e examples/specframe-example-plugin"

try:
    distribution(DIST)
except PackageNotFoundError:
    if os.environ.get("CI"):  # CI installs it: a missing install there is a failure, not a skip
        raise RuntimeError(f"{DIST} is not installed; CI must run `{INSTALL}` first") from None
    pytest.skip(f"{DIST} is not installed (`{INSTALL}`)", allow_module_level=True)


def test_entry_point_comes_from_the_installed_distribution():
    (ep,) = [ep for ep in entry_points(group="specframe") if ep.name == "example"]
    assert ep.value == "specframe_example"
    assert ep.dist is not None and ep.dist.name == DIST
    # The module loads from where the distribution was installed (site-packages, or the source tree an
    # editable install points at), not through a sys.path entry added by a test.
    origin = Path(ep.load().__file__).resolve()
    roots = [Path(ep.dist.locate_file("")).resolve()]
    url = json.loads(ep.dist.read_text("direct_url.json") or "{}").get("url", "")
    if url.startswith("file://"):
        roots.append(Path(url[len("file://"):]).resolve())
    assert any(root in origin.parents for root in roots), (origin, roots)


def test_a_fresh_registry_finds_every_component_with_the_version():
    registry = PluginRegistry()
    described = {p["name"]: p for p in registry.describe()["plugins"]}
    assert described["example"]["version"] == f"{DIST}==0.1.0"
    assert described["example"]["components"] == {
        "drafters": ["bigram"], "tree builders": ["breadth-first"], "backends": ["recompute"]}


def test_specframe_plugins_command_lists_it():
    """A new process, so nothing of this test session (imports, sys.path) can help it."""
    script = Path(sys.executable).with_name("specframe")
    command = ([str(script)] if script.exists()
               else [sys.executable, "-c", "from specframe.cli import main; main()"])
    out = subprocess.run([*command, "plugins"], capture_output=True, text=True, timeout=300, check=True,
                         cwd="/", env={**os.environ, "PYTHONPATH": ""})
    plugins = {p["name"]: p for p in json.loads(out.stdout)["plugins"]}
    assert plugins["example"]["version"] == f"{DIST}==0.1.0"
    assert "bigram" in plugins["example"]["components"]["drafters"]


def test_loading_can_be_limited_to_the_example_plugin(monkeypatch):
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "example")
    registry = PluginRegistry()  # the example and the plugins providing the core's defaults
    assert registry.names("drafter") == ["bigram", "none", "pld"]
    assert "breadth-first" in registry.names("tree builder") and "chain" in registry.names("tree builder")
    assert registry.names("backend") == ["kv", "recompute"]


def test_decodes_losslessly_on_a_tiny_target(tiny_target):
    prompts = [repetitive_prompt(tiny_target.vocab_size, 40, seed=s) for s in range(3)]
    decoder = make_decoder(tiny_target, "bigram(width=3, depth=4)", "breadth-first", "greedy", "kv")
    check_lossless(decoder, prompts, max_new_tokens=48, label="bigram + breadth-first")


def test_its_backend_by_name_decodes_like_plain_greedy(tiny_target):
    prompts = [repetitive_prompt(tiny_target.vocab_size, 40, seed=s) for s in range(2)]
    decoder = make_decoder(tiny_target, "pld(matches=3)", "trie", "greedy", "recompute")
    check_lossless(decoder, prompts, max_new_tokens=40, label="pld + trie + recompute")


@pytest.mark.slow
def test_decodes_losslessly_on_smollm2_by_name(smollm2):
    """Assembled by name through the process-wide registry, exactly as a user would. A fixed budget: the
    default `auto` would first calibrate SmolLM2's step cost, which is budget="auto"'s to test
    (tests/core/decode/test_adaptive.py), not the plugin's."""
    prompt = ("def fibonacci(n):\n    if n < 2:\n        return n\n"
              "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n")
    plain = specframe.generate(prompt, target=smollm2, drafter="none", budget=1, max_new_tokens=40)
    spec = specframe.generate(prompt, target=smollm2, drafter="bigram(width=2)", tree="breadth-first",
                              budget=8, max_new_tokens=40)
    assert spec.tokens == plain.tokens
    assert spec.metrics.steps < len(spec.tokens)  # some drafts were accepted
