"""What a newcomer reads first: `--help` texts, `bench --list-methods`."""

from __future__ import annotations

from typer.testing import CliRunner

from specframe.cli import app


def test_bench_help_names_the_ray_extra_and_the_ray_workers_default_plainly():
    help_text = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}).output
    out = " ".join(help_text.replace("│", " ").split())  # rich's boxes and line breaks aside
    assert "pip install 'specframe[ray]'" in out
    assert "default 1 under --ray" not in out and "--threads then defaults to 1" in out


def test_list_methods_prints_aligned_columns():
    lines = CliRunner().invoke(app, ["bench", "--list-methods"]).output.splitlines()
    assert lines[0].split() == ["preset", "pipeline", "status", "plugin"] and len(lines) > 2
    for column in ("pipeline", "status", "plugin"):
        start = lines[0].index(column)
        assert all(line[start - 2:start] == "  " and line[start] != " " for line in lines)



def test_the_adaptive_table_explains_its_predicted_and_realised_columns():
    from specframe.bench.report import adaptive_table

    stats = {"slow_turns": 0.0, "mean_tree_size": 3.0, "drafted_per_accepted": 2.0, "drafting_skipped": 1,
             "predicted_tokens_per_step": 1.8, "realised_tokens_per_step": 1.7, "predicted_step_ms": 30.0,
             "realised_step_ms": 31.0, "drafter_stats": None}
    text = "\n".join(adaptive_table({"pld@auto": stats}))
    assert "predicted / realised" in text and "planner's expected tokens per step" in text


def test_generate_help_says_why_tau_varies_under_auto_and_what_compare_times_against():
    help_text = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"}).output
    out = " ".join(help_text.replace("│", " ").split())
    assert "tau can differ between runs of one greedy prompt while the text stays identical" in out
    assert "plain decoding through the backend where it runs other weights (llamacpp)" in out


def test_version_prints_the_package_version_and_exits_zero():
    import specframe

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"specframe {specframe.__version__}\n"

