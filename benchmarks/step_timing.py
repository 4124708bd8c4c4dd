"""What the benchmarks that time verification steps share (`cpu_linear.py`, `kv_cache.py`): their common
options, warming the backends up, timing `backend.score` with the rounds interleaved, and writing the
table and the medians.

Imported by those scripts as a sibling module: `python benchmarks/NAME.py` puts this folder on the path.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from specframe.terms.metrics import CLOCKS


def timing_parser(description: str, rounds: int) -> argparse.ArgumentParser:
    """A parser with the options every step timing takes: the model, torch's threads, the clock (the
    process CPU clock suits a shared machine), the rounds timed per cell and the folder to write into."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", type=Path, default=None)
    return parser


def warm_up(backends: dict, ids: list[int], trees: dict) -> None:
    """Prefill every backend with `ids` and score every tree once, so that no timed step is a first one."""
    for backend in backends.values():
        backend.prefill(ids)
        for tree in trees.values():
            backend.score(tree)


def time_scores(backends: dict, trees: dict[tuple, object], rounds: int, clock, bar) -> dict[tuple, list]:
    """Seconds of each `backend.score(tree)` on `clock`, `rounds` of them per (backend name, *tree key).
    The rounds run interleaved over trees and backends, so that a drift of the machine spreads over all
    of them; `bar` advances once a step."""
    times = {(name, *key): [] for name in backends for key in trees}
    for _ in range(rounds):
        for key, tree in trees.items():
            for name, backend in backends.items():
                start = clock()
                backend.score(tree)
                times[(name, *key)].append(clock() - start)
                bar.update()
    return times


def medians(times: dict[tuple, list]) -> dict[str, float]:
    """The median seconds of each cell, keyed by its key's parts joined with spaces."""
    return {" ".join(map(str, key)): float(np.median(t)) for key, t in times.items()}


def report(text: str, medians: dict[str, float], out: Path | None) -> None:
    """Print `text`; with an `out` folder, write it there as results.md and `medians` as medians.json."""
    print(text)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(text + "\n")
        (out / "medians.json").write_text(json.dumps(medians, indent=1))
