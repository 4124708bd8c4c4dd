"""`benchmarks/turn_noise.py`: per-turn speedups over the baseline, on questions every method finished."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from specframe.bench.runner import RECORD_METRICS

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "turn_noise.py"


def load_script():
    spec = importlib.util.spec_from_file_location("turn_noise", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(method: str, qid: str, wall_s: float, repeat: int = 0) -> str:
    """A finished run as `specframe bench` records it (one token), every other metric left at zero."""
    metrics = {**dict.fromkeys(RECORD_METRICS, 0), "wall_s": wall_s, "tokens_per_s": 1 / wall_s}
    return json.dumps({"method": method, "qid": qid, "category": "test", "turn": 0, "repeat": repeat,
                       "tokens": [], "metrics": metrics})


def test_geometric_mean_of_complete_questions_only(tmp_path):
    lines = [record("baseline", "q0", 2.0), record("fast", "q0", 1.0),   # 2x
             record("baseline", "q1", 3.0), record("fast", "q1", 6.0),   # 0.5x
             record("baseline", "q2", 4.0), record("fast", "q2", 0.5)]   # 8x
    lines.append(record("baseline", "q3", 1.0))  # a question the run was cut inside: left out
    (tmp_path / "records.jsonl").write_text("\n".join(lines))
    noise = load_script()
    assert set(noise.wall_times(tmp_path)) == {("q0", 0), ("q1", 0), ("q2", 0)}
    row = next(r for r in noise.noise_table(tmp_path).splitlines() if r.startswith("| fast"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == f"{(2 * 0.5 * 8) ** (1 / 3):.3f}"  # 2.000: the geometric, not the arithmetic mean
    spread = [math.log(x) for x in (2, 0.5, 8)]
    mean = sum(spread) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in spread) / 2)
    assert cells[3] == f"{sd:.3f}"
    assert (cells[4], cells[5]) == ("0.50", "8.00")
    assert "(3 turns, first repeats)" in noise.noise_table(tmp_path)


def test_a_directory_without_a_finished_run_is_refused_with_what_to_pass(tmp_path):
    noise = load_script()
    with pytest.raises(SystemExit, match="no records.jsonl here"):
        noise.noise_table(tmp_path)
    (tmp_path / "records.jsonl").write_text(record("fast", "q0", 1.0))  # no baseline run
    with pytest.raises(SystemExit, match="'baseline' included"):
        noise.noise_table(tmp_path)


def test_a_record_cut_short_is_skipped_and_the_file_left_as_it_is(tmp_path):
    """A run stopped mid-write (a timeout on a lent machine) leaves a cut last line; reading it changes
    nothing, so a read-only copy of the results can be summarised."""
    cut = record("fast", "q1", 1.0)[:30]
    text = "\n".join([record("baseline", "q0", 2.0), record("fast", "q0", 1.0), cut])
    path = tmp_path / "records.jsonl"
    path.write_text(text)
    path.chmod(0o444)
    assert set(load_script().wall_times(tmp_path)) == {("q0", 0)}
    assert path.read_text() == text


def test_the_fastest_repeat_of_every_method_on_questions_with_every_repeat(tmp_path):
    lines = [record("baseline", "q0", 2.0, 0), record("baseline", "q0", 1.0, 1),   # fastest 1.0
             record("fast", "q0", 1.0, 0), record("fast", "q0", 0.25, 1),          # fastest 0.25: 4x
             record("baseline", "q1", 1.0, 0), record("baseline", "q1", 1.0, 1),
             record("fast", "q1", 1.0, 0)]                                          # cut before repeat 1
    (tmp_path / "records.jsonl").write_text("\n".join(lines))
    noise = load_script()
    assert noise.wall_times(tmp_path, "fastest") == {("q0", 0): {"baseline": 1.0, "fast": 0.25}}
    assert noise.wall_times(tmp_path)[("q0", 0)] == {"baseline": 2.0, "fast": 1.0}  # first repeats
    assert "(1 turns, the fastest repeat of each)" in noise.noise_table(tmp_path, keep="fastest")
