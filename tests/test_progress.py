"""Progress bars only on a terminal: piped into a file or shown in a notebook, every redraw of a bar would
stay behind as a line. pytest's captured stderr is no terminal; `Terminal` stands in for one."""

import io
import sys

from transformers.utils import logging as hf_logging

from specframe.bench import BenchPrompt, run_benchmark
from specframe.models import load_target, progress_bars_on_a_terminal
from specframe.testing import tiny_target

PROMPT = BenchPrompt("c1", "coding", ("def add(a, b):\n    return a + b\n",), chat=False)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def bench(tmp_path) -> None:
    run_benchmark(tiny_target(seed=1), [PROMPT], ["pld"], tmp_path, peers="none", repeats=1,
                  max_new_tokens=4, budget=4, plots=False, progress=True)


def test_bench_draws_its_bar_only_on_a_terminal(tmp_path, capsys, monkeypatch):
    bench(tmp_path / "piped")
    assert "bench" not in capsys.readouterr().err
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bench(tmp_path / "terminal")
    assert "bench: 100%" in terminal.getvalue()


def test_transformers_bars_only_on_a_terminal(monkeypatch):
    assert hf_logging.is_progress_bar_enabled()
    with progress_bars_on_a_terminal():
        assert not hf_logging.is_progress_bar_enabled()  # captured stderr: no terminal
    assert hf_logging.is_progress_bar_enabled()  # as it was after the block
    monkeypatch.setattr(sys, "stderr", Terminal())
    with progress_bars_on_a_terminal():
        assert hf_logging.is_progress_bar_enabled()


def test_loading_weights_draws_no_bar_when_piped(tmp_path, capfd):
    tiny = tiny_target(seed=2)
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    capfd.readouterr()
    load_target(str(tmp_path), device="cpu")
    assert "Loading weights" not in capfd.readouterr().err
