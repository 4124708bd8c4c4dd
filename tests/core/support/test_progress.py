"""Progress bars only on a terminal: piped into a file or shown in a notebook, every redraw of a bar would
stay behind as a line. pytest's captured stderr is no terminal; `Terminal` stands in for one."""

import io
import re
import sys
from pathlib import Path
from types import SimpleNamespace

from specframe_corpus.build import build_datastore
from specframe_corpus.distributed import build_sharded_datastore
from specframe_corpus.sources import TokenDocuments
from transformers.utils import logging as hf_logging

from specframe.bench import BenchPrompt, run_benchmark
from specframe.runtime.load import load_target, progress_bars_on_a_terminal
from specframe.support.progress import bar
from specframe.testing import tiny_target

ROOT = Path(__file__).resolve().parents[3]

PROMPT = BenchPrompt("c1", "coding", ("def add(a, b):\n    return a + b\n",), chat=False)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def piped_then_on_a_terminal(run, captured, monkeypatch, tmp_path) -> tuple[str, str]:
    """What `run(folder)` writes to stderr piped (pytest's `captured`: capsys or capfd), then with a
    `Terminal` as stderr, each run into a folder of its own."""
    run(tmp_path / "piped")
    piped = captured.readouterr().err
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run(tmp_path / "terminal")
    return piped, terminal.getvalue()


def bench(tmp_path) -> None:
    run_benchmark(tiny_target(seed=1), [PROMPT], ["pld"], tmp_path, peers="none", repeats=1,
                  max_new_tokens=4, budget=4, plots=False, progress=True)


def test_bench_draws_its_bar_only_on_a_terminal(tmp_path, capsys, monkeypatch):
    piped, terminal = piped_then_on_a_terminal(bench, capsys, monkeypatch, tmp_path)
    assert "bench" not in piped
    assert "bench: 100%" in terminal


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


def test_bar_draws_only_where_shown_and_on_a_terminal(monkeypatch):
    assert bar(total=1).disable  # captured stderr: no terminal
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert not bar(total=1).disable
    assert bar(total=1, show=False).disable
    assert list(bar(range(3), show=False)) == [0, 1, 2]  # a silent bar still wraps its iterable


def build_both(out: Path) -> None:
    """A datastore and a sharded datastore, both with their progress bars asked for."""
    docs = [[1, 2, 3, 4], [2, 3, 5], [7, 7, 7, 1, 2]]
    target = SimpleNamespace(name="ids", tokenizer=None, vocab_size=50)
    sources = [TokenDocuments("docs", "ids", documents=docs)]
    build_datastore(out / "single", sources, target, progress=True)
    build_sharded_datastore(out / "sharded", sources, target, shards=2, progress=True)


def test_datastore_builds_draw_no_redraws_when_piped(tmp_path, capfd, monkeypatch):
    piped, terminal = piped_then_on_a_terminal(build_both, capfd, monkeypatch, tmp_path)
    assert "\r" not in piped
    assert "tokenizing docs" in terminal and "building 2 shards" in terminal


def test_every_bar_goes_through_the_one_helper():
    """tqdm is imported by `specframe.support.progress` alone, so that no bar escapes the terminal rule."""
    files = [path for folder in ("specframe", "plugins", "benchmarks")
             for path in (ROOT / folder).rglob("*.py")]
    uses = sorted(str(path.relative_to(ROOT)) for path in files for line in path.read_text().splitlines()
                  if re.match(r"\s*(from tqdm\b|import tqdm\b|from rich\.progress\b)", line))
    assert uses == ["specframe/support/progress.py"]
