"""`benchmarks/subset_run.py`: cut a bench run to the problems and methods that compare like with like."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import specframe

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "subset_run.py"
SETTINGS = {"model": "m", "suite": "humaneval", "max_new_tokens": 4, "budget": "auto", "temperature": 0.0,
            "top_p": 1.0, "top_k": 0, "seed": None, "threads": 1, "device": "cpu", "clock": "wall",
            "dtype": "float32"}


def load_script():
    spec = importlib.util.spec_from_file_location("subset_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(method: str, problem: int, wall_s: float, tokens=(1, 2, 3), repeat: int = 0) -> dict:
    metrics = specframe.DecodeMetrics().to_dict()
    metrics.update(new_tokens=len(tokens), steps=len(tokens), tokens_per_s=len(tokens) / wall_s,
                   decode_tokens_per_s=len(tokens) / wall_s, wall_s=wall_s, prefill_s=0.0,
                   time_s=dict.fromkeys(metrics["time_s"], 0.01))
    return {"method": method, "qid": f"HumanEval/{problem}", "category": "humaneval", "turn": 0,
            "repeat": repeat, "seed": None, "tokens": list(tokens), "metrics": metrics}


def write_run(directory: Path, records: list[dict]) -> Path:
    directory.mkdir()
    (directory / "settings.json").write_text(json.dumps(SETTINGS))
    (directory / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def test_keeps_only_questions_every_chosen_method_finished(tmp_path):
    records = [record("baseline", 0, 2.0), record("fast", 0, 1.0), record("new", 0, 0.5),
               record("baseline", 1, 2.0), record("fast", 1, 1.0),   # 'new' never ran problem 1
               record("baseline", 2, 2.0)]                             # the run was cut inside problem 2
    subset = load_script()
    assert {r["qid"] for r in subset.select(records, None, None)} == {"HumanEval/0"}
    both = subset.select(records, None, ["baseline", "fast"])
    assert {r["qid"] for r in both} == {"HumanEval/0", "HumanEval/1"}
    assert {r["method"] for r in both} == {"baseline", "fast"}
    assert {r["qid"] for r in subset.select(records, range(1, 3), ["baseline", "fast"])} == {"HumanEval/1"}


def test_a_question_missing_a_repeat_is_left_out(tmp_path):
    records = [record(m, 0, 1.0, repeat=k) for m in ("baseline", "fast") for k in (0, 1)]
    records += [record("baseline", 1, 1.0, repeat=0), record("baseline", 1, 1.0, repeat=1),
                record("fast", 1, 1.0, repeat=0)]
    assert {r["qid"] for r in load_script().select(records, None, None)} == {"HumanEval/0"}


def test_writes_reports_and_finds_mismatches(tmp_path):
    source = write_run(tmp_path / "run", [record("baseline", 0, 2.0), record("fast", 0, 1.0),
                                          record("wrong", 0, 1.0, tokens=(1, 9, 3))])
    load_script().write_subset(source, tmp_path / "cut", range(0, 40), None)
    results = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert [(m["method"], m["position"]) for m in results["mismatches"]] == [("wrong", 1)]
    assert abs(results["categories"]["humaneval"]["fast"]["speedup"]["mean"] - 2.0) < 1e-9
    assert "HumanEval/0" in (tmp_path / "cut" / "results.md").read_text()


def test_lossy_methods_keep_their_label_and_baseline_is_required(tmp_path):
    runs = [record("baseline", 0, 2.0), record("typical", 0, 1.0, tokens=(1, 9))]
    source = write_run(tmp_path / "run", runs)
    (source / "results.json").write_text(json.dumps({"methods": [
        {"label": "baseline", "baseline": None, "lossless": True},
        {"label": "typical", "baseline": "baseline", "lossless": False}]}))
    subset = load_script()
    subset.write_subset(source, tmp_path / "cut", None, None)
    assert "n/a" in (tmp_path / "cut" / "results.md").read_text()  # a lossy method is not checked
    with pytest.raises(SystemExit, match="must include baseline"):
        subset.write_subset(source, tmp_path / "cut2", None, ["typical"])
