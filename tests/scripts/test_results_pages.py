"""`benchmarks/results.py`: the result pages are rendered from bench records between markers, prose kept."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("results_script", ROOT / "benchmarks" / "results.py")
results = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(results)


def record(method: str, qid: str, tps: float, tokens: list[int]) -> dict:
    metrics = {"tokens_per_s": tps, "decode_tokens_per_s": tps, "steps": 10, "new_tokens": 20,
               "draft_tokens": 12, "accepted_draft_tokens": 10, "acceptance_histogram": [1, 2],
               "time_s": None, "prefill_s": 0.1, "wall_s": 1.0, "peak_memory_bytes": 2**20}
    return {"method": method, "qid": qid, "category": "humaneval", "turn": 0, "repeat": 0, "tokens": tokens,
            "metrics": metrics}


@pytest.fixture
def records(tmp_path: Path) -> Path:
    """A stopped run: records.jsonl and settings.json, no results.json."""
    run = tmp_path / "code-cpu"
    run.mkdir()
    rows = [record("baseline", q, 10.0, [1, 2]) for q in ("a", "b")]
    rows += [record("pld@auto", "a", 20.0, [1, 2]), record("pld@auto", "b", 15.0, [1, 3])]
    run.joinpath("records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run.joinpath("settings.json").write_text(json.dumps({"model": "m", "suite": "humaneval", "threads": 1,
                                                         "command": "specframe bench --suite humaneval"}))
    return tmp_path


def test_a_table_is_rendered_between_its_markers_and_the_prose_stays(records, tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nbefore\n\n<!-- results:begin t -->\nold\n<!-- results:end t -->\n\nafter\n")
    spec = {"name": "t", "page": str(page), "kind": "speed", "runs": ["code-cpu"]}
    text = results.replace_block(page.read_text(), "t", results.render_table(spec, records))
    assert text.startswith("# Title\n\nbefore\n") and text.endswith("\nafter\n") and "old" not in text
    assert "| `pld@auto` | 1.75x |" in text  # the mean of 2.0 and 1.5 over the turns
    assert "1 of 2 turns" in text  # question b's output differed from plain decoding's
    assert "Command: `specframe bench --suite humaneval`" in text and "Noise floor:" in text


def test_a_run_without_records_says_so(tmp_path):
    spec = {"name": "t", "page": "p.md", "kind": "speed", "runs": ["code-gpu"]}
    assert "No records yet for code-gpu" in results.render_table(spec, tmp_path)[0]


def test_every_planned_table_has_its_markers_in_its_page():
    plan = tomllib.loads((ROOT / "benchmarks" / "plan.toml").read_text())
    for spec in plan["tables"]:
        assert spec["kind"] in results.KINDS and set(spec["runs"]) <= set(plan["runs"]), spec["name"]
        text = (ROOT / spec["page"]).read_text()
        for edge in ("begin", "end"):
            assert f"<!-- results:{edge} {spec['name']} -->" in text, spec["name"]
