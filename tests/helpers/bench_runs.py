"""What the bench tests share: a registry with a verifier broken on purpose, and `specframe bench` run in
this process, with the model's loading forbidden or replaced by a given target."""

from __future__ import annotations

import sys

import pytest

import specframe

BROKEN_METHOD = "pld(min_ngram=1)+chain+accept-everything@4"  # fixed budget: `auto` may choose not to draft


class AcceptEverything(specframe.Verifier):
    """A broken verifier that claims to be lossless but accepts every draft token."""

    name = "accept-everything"
    capabilities = specframe.VerifierCapabilities(lossless=True)

    def verify(self, tree, scores, sampling):
        path, node = [], -1
        while tree.children[node + 1]:
            node = tree.children[node + 1][0]
            path.append(node)
        return specframe.VerifyResult(path=path, bonus=int(scores.logits[node + 1].argmax()))


class BrokenPlugin:
    @specframe.hookimpl
    def register_verifiers(register):
        register(AcceptEverything)


def broken_registry() -> specframe.PluginRegistry:
    """A registry with the installed plugins and `accept-everything`, which a lossless check must catch."""
    registry = specframe.PluginRegistry()
    registry.register_plugin(BrokenPlugin, name="broken")
    return registry


def bench_before_loading(monkeypatch, out, *args: str):
    """`specframe bench --out OUT ARGS` through typer's test runner, where loading a model fails the test
    (bad options must be refused before it); returns typer's result."""
    from typer.testing import CliRunner

    import specframe.runtime.load
    from specframe.cli import app

    def no_loading(*_, **__):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(specframe.runtime.load, "load_target", no_loading)
    return CliRunner().invoke(app, ["bench", "--out", str(out), *args])


def bench_main(monkeypatch, capsys, target, *args: str) -> tuple[int, str]:
    """Run the real `specframe bench` entry point in this process on `target`: (exit code, stderr)."""
    import specframe.runtime.load
    from specframe.cli import main

    monkeypatch.setattr(specframe.runtime.load, "load_target", lambda *_, **__: target)
    monkeypatch.setattr(sys, "argv", ["specframe", "bench", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err
