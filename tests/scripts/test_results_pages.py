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


def test_a_presets_table_shows_the_worst_turn_and_how_deep_drafts_are_accepted(records):
    run = records / "code-cpu"
    lines = run.joinpath("records.jsonl").read_text().splitlines()
    slow = record("s4c@auto", "a", 9.5, [1, 2]) | {}
    slow["metrics"] = slow["metrics"] | {"acceptance_histogram": [4, 3, 2, 1]}
    fast = record("s4c@auto", "b", 12.0, [1, 3])
    fast["metrics"] = fast["metrics"] | {"acceptance_histogram": [4, 3, 2, 1]}
    run.joinpath("records.jsonl").write_text("\n".join([*lines, json.dumps(slow), json.dumps(fast)]) + "\n")
    spec = {"name": "t", "page": "p.md", "kind": "presets", "runs": ["code-cpu"]}
    text = "\n".join(results.render_table(spec, records))
    row = next(line for line in text.splitlines() if line.startswith("| `s4c@auto`"))
    # turns at 0.95x and 1.20x of plain: the worst is 0.95x, one of two below 0.97x; of 20 steps, 12
    # accepted at least one drafted token, 6 at least two, 2 at least three
    assert "| 0.95x | 1 of 2 |" in row and "| 0.60 / 0.30 / 0.10 |" in row
    assert "| `baseline` | 1.00x | - | - |" in text


def test_a_run_without_records_says_so(tmp_path):
    spec = {"name": "t", "page": "p.md", "kind": "speed", "runs": ["code-gpu"]}
    assert "No records yet for code-gpu" in results.render_table(spec, tmp_path)[0]


def test_every_planned_table_has_its_markers_in_its_page():
    plan = tomllib.loads((ROOT / "benchmarks" / "plan.toml").read_text())
    for spec in plan["tables"]:
        assert spec["kind"] in results.KINDS and set(spec["runs"]) <= set(plan["runs"]), spec["name"]
        if "plot" in spec:  # a PNG under the docs, so that the page's link to it resolves in the site
            assert spec["kind"] in ("batch", "load") and spec["plot"].startswith("docs/"), spec["name"]
            assert spec["plot"].endswith(".png"), spec["name"]
        text = (ROOT / spec["page"]).read_text()
        for edge in ("begin", "end"):
            assert f"<!-- results:{edge} {spec['name']} -->" in text, spec["name"]


@pytest.fixture
def llamacpp_records(tmp_path: Path) -> Path:
    """A stopped run with methods on the `llamacpp` backend and llama.cpp's own decoding as peers: plain
    decoding through `kv` (`baseline`) and through `llamacpp` (`baseline[llamacpp]`) at different speeds."""
    run = tmp_path / "llamacpp-cpu"
    run.mkdir()
    plain, pld = "none+chain+greedy+llamacpp@1", "pld+chain+greedy+llamacpp@8"
    rows = [record("baseline", q, 40.0, [1, 2]) for q in ("a", "b")]
    rows += [record("baseline[llamacpp]", q, 20.0, [1, 2]) for q in ("a", "b")]
    rows += [record(plain, "a", 22.0, [1, 2]), record(plain, "b", 20.0, [1, 2])]
    rows += [record(pld, q, 30.0, [1, 2]) for q in ("a", "b")]
    rows += [record("llamacpp-generate", q, 25.0, [1, 4]) for q in ("a", "b")]
    run.joinpath("records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run.joinpath("settings.json").write_text(json.dumps({"model": "m", "suite": "humaneval", "threads": 1}))
    return tmp_path


def test_llamacpp_methods_and_peers_are_measured_against_plain_llamacpp_decoding(llamacpp_records):
    plan = tomllib.loads((ROOT / "benchmarks" / "plan.toml").read_text())
    spec = next(t for t in plan["tables"] if t["name"] == "llamacpp-cpu")
    rows = {line.split(" | ")[0][3:-1]: line.split(" | ")[1:] for line in
            results.render_table(spec, llamacpp_records) if line.startswith("| `")}
    assert list(rows) == ["pld+chain+greedy+llamacpp@8", "llamacpp-generate", "none+chain+greedy+llamacpp@1",
                          "baseline[llamacpp]"]  # by speedup; the kv baseline is left out
    assert rows["pld+chain+greedy+llamacpp@8"][:2] == ["1.50x", "1.20x"]  # 30 over 20 tok/s; over 25
    assert rows["llamacpp-generate"][0] == "1.25x" and rows["llamacpp-generate"][-1] == "- |"  # not compared
    assert rows["none+chain+greedy+llamacpp@1"][-1] == "2 of 2 turns |"
    noise = results.render_table(spec, llamacpp_records)[-1]
    assert noise.startswith("Noise floor: `none+chain+greedy+llamacpp@1` decodes exactly like the baseline "
                            "and measured 1.05x")


def batch_stats(tps: float, plain: float, hf: float | None, tau: float, baseline: str | None,
                differing: int = 0, repeats: int = 1, std: float = 0.0, split: dict | None = None,
                intervals: tuple = (None, None), chunks: int = 1) -> dict:
    """One (method, B) entry of `batch_results.json`, as `specframe.bench.batch_report.row_stats` makes it
    (`split`: ms per batched step by phase; `intervals`: the speedups' over plain and over hf-generate)."""
    return {"tokens_per_s": {"mean": tps, "std": std}, "latency_mean_s": 1.0, "latency_p90_s": 1.5,
            "tau": tau, "speedup_plain": {"mean": plain, "std": 0.0},
            "speedup_hf": None if hf is None else {"mean": hf, "std": 0.0}, "new_tokens": 64,
            "repeats": repeats, "rows_differing": differing, "rows_compared": 0 if baseline is None else 4,
            "baseline": baseline, "time_per_step_ms": split, "speedup_plain_interval": intervals[0],
            "speedup_hf_interval": intervals[1], "chunks": chunks}


@pytest.fixture
def batch_records(tmp_path: Path) -> Path:
    """A finished `specframe bench --batch 1,4` sweep: batch_results.json and machine.json."""
    run = tmp_path / "batch-code-cpu"
    run.mkdir()
    settings = {"model": "m", "suite": "humaneval", "max_new_tokens": 16, "threads": 1, "device": "cpu",
                "clock": "cpu", "dtype": "float32", "limit": 4, "questions": 4, "batches": [1, 4],
                "repeats": 1, "keep": "all", "command": "specframe bench --suite humaneval --batch 1,4"}
    methods = [{"label": "baseline", "baseline": None, "lossless": True, "kind": "PipelineBatches"},
               {"label": "pld@auto", "baseline": "baseline", "lossless": True, "kind": "PipelineBatches"},
               {"label": "hf-generate", "baseline": "baseline", "lossless": False,
                "kind": "GeneratePeerBatches"}]
    batches = {"1": {"baseline": batch_stats(30.0, 1.0, 0.9, 1.0, None),
                     "pld@auto": batch_stats(45.0, 1.5, 1.35, 1.8, "baseline"),
                     "hf-generate": batch_stats(33.0, 1.1, 1.0, 1.0, "baseline")},
               "4": {"baseline": batch_stats(80.0, 1.0, 0.8, 1.0, None),
                     "pld@auto": batch_stats(84.0, 1.05, 0.84, 1.4, "baseline"),
                     "hf-generate": batch_stats(100.0, 1.25, 1.0, 1.0, "baseline", differing=1)}}
    run.joinpath("batch_results.json").write_text(json.dumps(
        {"settings": settings, "methods": methods, "batches": batches, "mismatches": [], "records": []}))
    run.joinpath("machine.json").write_text(json.dumps({"machine": "a test CPU, 2 cores",
                                                        "versions": {"torch": "2.0"}}))
    return tmp_path


def test_a_batch_sweep_is_rendered_by_method_and_batch_size(batch_records):
    spec = {"name": "t", "page": "p.md", "kind": "batch", "runs": ["batch-code-cpu"]}
    lines = results.render_table(spec, batch_records)
    assert lines[0] == ("| method | B | tokens/s | x plain batched | x hf-generate | tau | draft ms/step "
                        "| forward ms/step | identical rows |")
    rows = [line for line in lines if line.startswith("| `")]
    assert rows == ["| `baseline` | 1 | 30.0 | 1.00x | 0.90x | 1.00 | - | - | - |",  # kept no split
                    "| `baseline` | 4 | 80.0 | 1.00x | 0.80x | 1.00 | - | - | - |",
                    "| `pld@auto` | 1 | 45.0 | 1.50x | 1.35x | 1.80 | - | - | 4 of 4 rows |",
                    "| `pld@auto` | 4 | 84.0 | 1.05x | 0.84x | 1.40 | - | - | 4 of 4 rows |",
                    "| `hf-generate` | 1 | 33.0 | 1.10x | 1.00x | 1.00 | - | - | 4 of 4 rows |",
                    "| `hf-generate` | 4 | 100.0 | 1.25x | 1.00x | 1.00 | - | - | 3 of 4 rows |"]
    text = "\n".join(lines)
    assert "Machine: a test CPU, 2 cores; torch 2.0." in text
    assert "first turns of 4 question(s)" in text and "B = 1, 4" in text
    assert "Command: `specframe bench --suite humaneval --batch 1,4`" in text
    assert "Noise floor: one timed call per method and B" in text


def test_a_batch_table_keeps_the_rows_asked_for_and_reports_the_spread_of_repeats(batch_records):
    path = batch_records / "batch-code-cpu" / "batch_results.json"
    run = json.loads(path.read_text())
    run["batches"]["4"]["pld@auto"] = batch_stats(84.0, 1.05, 0.84, 1.4, "baseline", repeats=3, std=4.2)
    path.write_text(json.dumps(run))
    spec = {"name": "t", "page": "p.md", "kind": "batch", "runs": ["batch-code-cpu"], "rows": ["*@auto"]}
    lines = results.render_table(spec, batch_records)
    assert [line.split(" | ")[0] for line in lines if line.startswith("| `")] == ["| `pld@auto`"] * 2
    assert "at most 5 % of its mean" in "\n".join(lines)


def test_a_chunked_batch_table_gives_the_time_split_and_the_widest_interval_as_its_noise_floor(batch_records):
    path = batch_records / "batch-code-cpu" / "batch_results.json"
    run = json.loads(path.read_text())
    split = {"draft": 12.34, "tree": 0.5, "forward": 40.06, "verify": 1.0, "commit": 0.2, "other": 2.0}
    run["batches"]["4"]["pld@auto"] = batch_stats(84.0, 1.05, 0.84, 1.4, "baseline", split=split,
                                                  intervals=([0.945, 1.155], [0.8, 0.88]), chunks=5)
    run["batches"]["4"]["hf-generate"] = batch_stats(100.0, 1.25, 1.0, 1.0, "baseline",
                                                     intervals=([1.2, 1.3], None), chunks=5)
    run["settings"]["chunk_prompts"] = {"1": 8, "4": 8}
    path.write_text(json.dumps(run))
    spec = {"name": "t", "page": "p.md", "kind": "batch", "runs": ["batch-code-cpu"]}
    lines = results.render_table(spec, batch_records)
    assert "| `pld@auto` | 4 | 84.0 | 1.05x | 0.84x | 1.40 | 12.3 | 40.1 | 4 of 4 rows |" in lines
    text = "\n".join(lines)
    assert "methods taking turns in chunks of 8 prompts at B = 1, 8 prompts at B = 4" in text
    # over plain: pld's (1.155 - 0.945) / (1.155 + 0.945) = 10 %, wider than hf-generate's 0.1 / 2.5 = 4 %;
    # over hf-generate: (0.88 - 0.8) / 1.68 = 4.8 %
    assert lines[-1] == ("Noise floor: a speedup's 95 % bootstrap interval over its chunks (up to 5 per "
                         "method and B, drawn with replacement, each paired with the other method's seconds "
                         "on the same chunk) is at widest ±10.0 % over plain batched and ±4.8 % over "
                         "hf-generate; read differences inside it as noise.")


def test_a_batch_table_without_records_keeps_its_head_and_says_so(tmp_path):
    stopped = tmp_path / "batch-chat-cpu"  # a sweep stopped before its tables: records only
    stopped.mkdir()
    stopped.joinpath("batch_records.jsonl").write_text("")
    spec = {"name": "t", "page": "p.md", "kind": "batch", "runs": ["batch-chat-cpu"]}
    lines = results.render_table(spec, tmp_path)
    assert lines[0].startswith("| method | B | tokens/s |")
    assert lines[2].startswith("| batch-chat-cpu | no records |")
    assert lines[-1] == "No records yet for batch-chat-cpu: run `make results`."


def test_a_batch_table_with_a_plot_draws_speedup_against_b_and_links_it_in_its_block(batch_records, tmp_path):
    path = batch_records / "batch-code-cpu" / "batch_results.json"
    run = json.loads(path.read_text())
    run["batches"]["4"]["pld@auto"] = batch_stats(84.0, 1.05, 0.84, 1.4, "baseline",
                                                  intervals=([0.945, 1.155], None), chunks=5)
    path.write_text(json.dumps(run))
    page, plot = tmp_path / "docs" / "results" / "p.md", tmp_path / "docs" / "results" / "img" / "sweep.png"
    spec = {"name": "t", "page": str(page), "kind": "batch", "runs": ["batch-code-cpu"], "plot": str(plot)}
    lines = results.render_table(spec, batch_records)
    png = plot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"Software" not in png and b"matplotlib" not in png  # the same records give the same bytes
    assert "![Speedup over plain batched decoding against B, per method (t)](img/sweep.png)" in lines
    assert "error bars: a speedup's 95 % bootstrap interval over its chunks" in "\n".join(lines)
    assert lines.index("![Speedup over plain batched decoding against B, per method (t)](img/sweep.png)") < \
        next(i for i, line in enumerate(lines) if line.startswith("Machine:"))  # under the table it plots
    results.render_table(spec, batch_records)
    assert plot.read_bytes() == png


def test_a_batch_table_without_a_plot_or_without_records_draws_nothing(batch_records, tmp_path):
    plot = tmp_path / "img" / "sweep.png"
    spec = {"name": "t", "page": str(tmp_path / "p.md"), "kind": "batch", "runs": ["batch-code-cpu"]}
    lines = results.render_table(spec, batch_records)
    assert not any(line.startswith("![") for line in lines) and not plot.parent.exists()
    missing = {**spec, "runs": ["batch-sweep-cpu"], "plot": str(plot)}
    lines = results.render_table(missing, batch_records)
    assert lines[-1] == "No records yet for batch-sweep-cpu: run `make results`."
    assert not any(line.startswith("![") for line in lines) and not plot.parent.exists()


def test_a_finished_batch_sweep_is_not_measured_again(batch_records, capsys):
    plan = {"runs": {"batch-code-cpu": {"about": "a sweep", "gpu": False, "args": ["--batch", "1,4"]}}}
    results.run_plan(plan, batch_records, None)  # would run `specframe bench` if it were not complete
    assert "complete in" in capsys.readouterr().out


@pytest.mark.parametrize("recorded", ["--out /home/someone/specframe/results/records/code-cpu",
                                      "--out results/an-older-run/humaneval",
                                      "--out=/work/checkout/results/he"])
def test_a_page_shows_the_command_with_the_records_folder_relative_to_the_repository(records, recorded):
    """bench keeps its command as typed: an absolute --out names the measuring machine's folders, and an
    older run's folder is not where `make results` keeps the run."""
    settings = records / "code-cpu" / "settings.json"
    command = f"specframe bench --suite humaneval {recorded} --peers 'a,b(c=1)'"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "command": command}))
    spec = {"name": "t", "page": "p.md", "kind": "speed", "runs": ["code-cpu"]}
    command = next(line for line in results.render_table(spec, records) if line.startswith("Command:"))
    assert command == ("Command: `specframe bench --suite humaneval "
                       + ("--out=" if "--out=" in recorded else "--out ")
                       + "results/records/code-cpu --peers 'a,b(c=1)'`")


def test_a_run_without_package_versions_says_so_and_the_machine_record_has_them(records):
    spec = {"name": "t", "page": "p.md", "kind": "speed", "runs": ["code-cpu"]}
    text = "\n".join(results.render_table(spec, records))
    assert "package versions not recorded with these records" in text
    versions = results.machine()["versions"]
    assert {"python", "specframe", "torch", "transformers"} <= set(versions)


def test_a_run_is_measured_from_the_repository_root_with_a_relative_out_and_its_env(tmp_path, monkeypatch):
    seen = {}

    def run(command, **kwargs):
        seen.update(command=command, cwd=kwargs.get("cwd"), env=kwargs.get("env"))
        (records / "code-cpu").mkdir(parents=True)

    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results.subprocess, "run", run)
    monkeypatch.setattr(results, "machine", lambda: {})
    records = tmp_path / "results" / "records"
    plan = {"runs": {"code-cpu": {"about": "a run", "gpu": False, "args": ["--limit", "1"],
                                  "env": {"SPECFRAME_CPU_LINEAR": "onednn"}}}}
    results.run_plan(plan, records, None)
    assert seen["command"][-2:] == ["--out", "results/records/code-cpu"] and seen["cwd"] == tmp_path
    assert seen["env"]["SPECFRAME_CPU_LINEAR"] == "onednn"


def test_a_structured_table_gives_valid_and_identical_shares_marks_other_kernels_and_its_command(tmp_path):
    run = tmp_path / "structured-cpu"
    run.mkdir()
    rows = [{"method": "baseline", "valid": 1.0, "identical": 1.0, "tokens_per_s": 10.0, "tau": 1.0,
             "speedup": 1.0, "lossless": True},
            {"method": "forced(then=pld)+chain@8", "valid": 1.0, "identical": 1.0, "tokens_per_s": 18.0,
             "tau": 2.2, "speedup": 1.8, "lossless": True},
            {"method": "llamacpp-grammar", "valid": 0.97, "identical": 0.5, "tokens_per_s": 20.0, "tau": 1.0,
             "speedup": 2.0, "lossless": False}]
    run.joinpath("structured_results.json").write_text(json.dumps({
        "header": "33 prompts of structured", "rows": rows,
        "command": "specframe bench --suite structured --out /elsewhere/run"}))
    spec = {"name": "t", "page": "p.md", "kind": "structured", "runs": ["structured-cpu"]}
    lines = results.render_table(spec, tmp_path)
    assert lines[0].startswith("| method | valid | identical to constrained plain |")
    assert "| `forced(then=pld)+chain@8` | 100% | 100% | 18.0 | 2.20 | 1.80x |" in lines
    assert "| `llamacpp-grammar` (other kernels) | 97% | 50% | 20.0 | 1.00 | 2.00x |" in lines
    assert lines[-1] == "Command: `specframe bench --suite structured --out results/records/structured-cpu`"
    assert "Settings: 33 prompts of structured.  " in lines


def test_a_structured_table_without_records_says_so(tmp_path):
    spec = {"name": "t", "page": "p.md", "kind": "structured", "runs": ["structured-cpu"]}
    lines = results.render_table(spec, tmp_path)
    assert lines[2].startswith("| structured-cpu | no records |")
    assert lines[-1] == "No records yet for structured-cpu: run `make results`."


def steps_record(folder: Path, linear: str, one_row_ms: float, command: str) -> None:
    folder.mkdir()
    costs = [{"nodes": n, "flat_ms": one_row_ms * (1 + n / 8), "chain_ms": one_row_ms} for n in (0, 1, 3, 7)]
    settings = {"model": "smollm2-135m", "backend": "kv", "device": "cpu", "dtype": "float32", "threads": 1,
                "linear": linear, "attention": "specframe_exact", "context": 257}
    folder.joinpath("step_costs.json").write_text(json.dumps({"settings": settings, "command": command,
                                                              "costs": costs}))


def test_a_steps_table_gives_each_configuration_its_curve_and_command(tmp_path):
    steps_record(tmp_path / "steps-a", "blocks", 40.0, "specframe calibrate --threads 1 --out /x/steps-a")
    steps_record(tmp_path / "steps-b", "onednn", 80.0,
                 "SPECFRAME_CPU_LINEAR=onednn specframe calibrate --threads 1 --out /x/steps-b")
    spec = {"name": "t", "page": "p.md", "kind": "steps", "runs": ["steps-a", "steps-b", "steps-c"],
            "labels": {"steps-a": "default"}}
    lines = results.render_table(spec, tmp_path)
    assert lines[0] == ("| configuration | measured as | 1 row | 2 rows | 4 rows | 8 rows | 17 rows "
                        "| 25 rows | 33 rows |")
    assert lines[2] == ("| `default` | kv, float32, blocks linears, specframe_exact attention | 40.0 (1.0x) "
                        "| 45.0 (1.1x) | 55.0 (1.4x) | 75.0 (1.9x) | - | - | - |")
    assert lines[3].startswith("| `steps-b` | kv, float32, onednn linears")
    assert lines[4].startswith("| `steps-c` | no records |")
    command = "SPECFRAME_CPU_LINEAR=onednn specframe calibrate --threads 1 --out results/records/steps-b"
    assert f"`{command}`" in lines[-1]

