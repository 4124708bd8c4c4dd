"""`specframe generate` run in the test process on the tiny character-level model."""

from __future__ import annotations

import sys

import pytest

from specframe.cli import main
from specframe.testing.targets import tiny_target


def run_generate(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`specframe generate ARGS` in this process, on the tiny character-level model; (exit code, out, err),
    err ending in "[model not loaded]" when the command stopped before loading the model."""
    loads = []
    monkeypatch.setattr("specframe.runtime.load.load_target",
                        lambda *a, **k: loads.append(1) or tiny_target(seed=0))
    monkeypatch.setattr(sys, "argv", ["specframe", "generate", *args, "--model", "tiny"])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err + ("" if loads else "[model not loaded]")
