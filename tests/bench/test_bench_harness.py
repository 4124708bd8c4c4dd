"""The benchmark harness end to end on a tiny random Llama with the real SmolLM2 tokenizer.

Every kind of method runs (presets, pipeline specs from several plugins, the synthetic drafter, the
transformers peers); a verifier broken on purpose is reported as a lossless mismatch; tables, JSON and
plots are written; an interrupted run resumes without redoing finished work.
"""

from __future__ import annotations

import json

import pytest

import specframe
from specframe.bench import BenchPrompt, run_benchmark
from specframe.bench import runner as bench_runner
from specframe.bench import store as bench_store
from specframe.terms.errors import ConfigurationError, SpecframeError, SpecframeWarning
from specframe.terms.metrics import DecodeMetrics
from specframe.testing import tiny_target

from bench_runs import BROKEN_METHOD, bench_before_loading, bench_main, broken_registry

PROMPTS = [
    BenchPrompt("q1", "writing", ("Write a short poem about the sea. The sea, the sea, the sea.",
                                  "Now make it rhyme.")),
    BenchPrompt("code-1", "coding", ("def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n",),
                chat=False),
]
NEW_TOKENS = 10


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def target():
    """A random 2-layer Llama over SmolLM2's vocabulary, with SmolLM2's tokenizer and chat template."""
    from transformers import AutoTokenizer

    from specframe.runtime.load import resolve_model_dir

    tiny = tiny_target(seed=3, vocab_size=49152, hidden_size=32)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m"))
    return specframe.Target(model=tiny.model, tokenizer=tokenizer, name="tiny-smollm2-vocab")


def test_every_method_runs_and_reports(target, tmp_path):
    methods = ["pld", "pld-trie", "rest-live", "pld+chain+sample-match@4",
               "draft-model(layers=1)+chain+greedy"]
    # A fixed budget: under `auto` the planner may judge, by timing, that no draft pays on this random
    # model, and the synthetic drafter's tau > 1 below would then depend on the machine's speed.
    run, table = run_benchmark(target, PROMPTS, methods, tmp_path, repeats=2, max_new_tokens=NEW_TOKENS,
                               budget=4, synthetic_acceptance=0.7, progress=False)
    labels = [r.label for r in run.runners]
    assert labels == ["baseline", *methods, "synthetic(p=0.7)", "hf-generate", "hf-pld", "hf-assisted"]
    turns = sum(len(p.turns) for p in PROMPTS)
    assert len(run.records) == len(labels) * turns * 2
    assert run.mismatches == []  # every method here is lossless at temperature 0

    results = json.loads((tmp_path / "results.json").read_text())
    keys = set(DecodeMetrics().to_dict())
    assert all(set(r["metrics"]) == keys for r in results["records"])
    assert set(results["categories"]) == {"overall", "writing", "coding"}
    overall = results["categories"]["overall"]
    assert overall["baseline"]["tau"] == 1.0 and overall["baseline"]["speedup"]["mean"] == 1.0
    assert overall["hf-generate"]["tau"] == 1.0 and overall["hf-generate"]["alpha"] is None
    assert overall["synthetic(p=0.7)"]["tau"] > 1.0  # the synthetic drafter is accepted
    markdown = (tmp_path / "results.md").read_text()
    for category in ("overall", "writing", "coding"):
        assert f"### {category}" in markdown
    for label in labels:
        assert f"| {label} |" in markdown
    for png in ("speedup.png", "acceptance_histogram.png", "time_split.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_second_turn_sees_the_first_answer(target, tmp_path):
    run, _ = run_benchmark(target, PROMPTS[:1], ["pld"], tmp_path, peers="none", repeats=1,
                           max_new_tokens=NEW_TOKENS, plots=False, progress=False)
    first, second = [r for r in run.records if r["method"] == "baseline"]
    answer = target.tokenizer.decode(first["tokens"], skip_special_tokens=True)
    assert second["metrics"]["prompt_tokens"] > first["metrics"]["prompt_tokens"] + len(first["tokens"]) - 2
    assert answer.strip() and answer.strip() in _decoded_prompt(target, PROMPTS[0], answer)


def _decoded_prompt(target, prompt, answer):
    from specframe.support.prompt_suites import encode_turn

    return target.tokenizer.decode(encode_turn(target.tokenizer, prompt, 1, [answer]))


def test_a_broken_verifier_is_reported_as_a_mismatch(target, tmp_path):
    method = BROKEN_METHOD
    run, table = run_benchmark(target, PROMPTS[1:], [method], tmp_path, peers="hf-generate", repeats=1,
                               max_new_tokens=24, registry=broken_registry(), plots=False, progress=False)
    assert run.mismatches and {m.method for m in run.mismatches} == {method}
    assert table["coding"][method]["mismatches"] == len(run.mismatches)
    assert table["coding"]["hf-generate"]["mismatches"] == 0
    markdown = (tmp_path / "results.md").read_text()
    assert "MISMATCH" in markdown and "LOSSLESS MISMATCH" in markdown


def test_an_interrupted_run_resumes_where_it_stopped(target, tmp_path, monkeypatch):
    real = bench_runner.PipelineRunner.generate
    calls = {"n": 0}

    def flaky(self, ids, max_new_tokens, seed=None):
        calls["n"] += 1
        if calls["n"] == 6:  # 2 warm-ups, then 3 timed generations, then the "power cut"
            raise KeyboardInterrupt
        return real(self, ids, max_new_tokens, seed)

    monkeypatch.setattr(bench_runner.PipelineRunner, "generate", flaky)
    kwargs = dict(peers="none", repeats=2, max_new_tokens=NEW_TOKENS, plots=False, progress=False)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(target, PROMPTS, ["pld"], tmp_path, **kwargs)
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == 3
    with (tmp_path / "records.jsonl").open("a") as f:
        f.write('{"method": "pld", "qid": "q1", "tur')  # a record cut short by the interruption
    monkeypatch.setattr(bench_runner.PipelineRunner, "generate", real)
    run, _ = run_benchmark(target, PROMPTS, ["pld"], tmp_path, **kwargs)
    expected = 2 * sum(len(p.turns) for p in PROMPTS) * 2
    assert len(run.records) == expected
    before = [json.loads(line) for line in lines]
    assert all(r in run.records for r in before)  # the finished runs were kept, not redone
    # the cut line stays, skipped
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 3 + 1 + expected - 3

    with pytest.raises(ConfigurationError, match="other settings"):
        run_benchmark(target, PROMPTS, ["pld"], tmp_path, **{**kwargs, "max_new_tokens": NEW_TOKENS + 1})


def test_a_resumed_run_hands_a_remembering_drafter_the_requests_it_skipped(target, tmp_path, monkeypatch):
    pytest.importorskip("arctic_inference.suffix_decoding")
    kwargs = dict(peers="none", repeats=1, max_new_tokens=NEW_TOKENS, budget=4, plots=False, progress=False)
    whole, _ = run_benchmark(target, PROMPTS, ["suffix"], tmp_path / "whole", **kwargs)

    real = bench_runner.PipelineRunner.generate
    calls = {"n": 0}

    def flaky(self, ids, max_new_tokens, seed=None):
        calls["n"] += 1
        if calls["n"] == 7:  # 2 warm-ups and both turns of q1 by both methods, then the "power cut"
            raise KeyboardInterrupt
        return real(self, ids, max_new_tokens, seed)

    monkeypatch.setattr(bench_runner.PipelineRunner, "generate", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(target, PROMPTS, ["suffix"], tmp_path / "resumed", **kwargs)
    monkeypatch.setattr(bench_runner.PipelineRunner, "generate", real)
    resumed, _ = run_benchmark(target, PROMPTS, ["suffix"], tmp_path / "resumed", **kwargs)

    def last(run):
        return next(r for r in run.records if r["method"] == "suffix" and r["qid"] == "code-1")

    # q1's two answers were decoded by the first process and replayed into the second one's cache
    assert last(resumed)["tokens"] == last(whole)["tokens"]
    stats = [last(run)["metrics"]["drafter_stats"] for run in (whole, resumed)]
    assert stats[0]["responses"] == 4  # the warm-up, q1's two turns and code-1
    assert [(s["responses"], s["tokens"]) for s in stats[1:]] == [(stats[0]["responses"], stats[0]["tokens"])]


def test_all_skips_presets_that_cannot_be_built(target, tmp_path):
    with pytest.warns(SpecframeWarning) as caught:
        run, _ = run_benchmark(target, PROMPTS[1:], ["all"], tmp_path, peers="none", repeats=1,
                               max_new_tokens=4, plots=False, progress=False)
    assert any("skipping preset 's4c'" in str(w.message) for w in caught)  # no heads for this model
    assert "pld" in [r.label for r in run.runners]
    assert "s4c" not in [r.label for r in run.runners]


def test_the_bench_command_writes_tables_and_plots(target, tmp_path):
    from typer.testing import CliRunner

    from specframe.cli import app

    model_dir = tmp_path / "model"
    target.model.save_pretrained(model_dir)
    target.tokenizer.save_pretrained(model_dir)
    questions = tmp_path / "questions.jsonl"
    question = {"question_id": 7, "category": "qa", "turns": ["Name three colors."]}
    questions.write_text(json.dumps(question) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "bench", "--model", str(model_dir), "--suite", str(questions),
        "--methods", "pld,pld(max_ngram=2)+chain", "--peers", "hf-generate", "--repeats", "1",
        "--max-new-tokens", "6", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| pld(max_ngram=2)+chain |" in result.output and "### qa" in result.output
    assert {p.name for p in out.iterdir()} >= {"records.jsonl", "results.json", "results.md", "speedup.png",
                                               "acceptance_histogram.png", "time_split.png", "settings.json"}


@pytest.mark.parametrize("args, message", [
    (["--suite", "no-such-suite"], "unknown suite"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--methods", "no-such-drafter"], "unknown drafter"),
    (["--peers", "no-such-peer"], "unknown peer"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--keep", "fastest", "--temperature", "0.7"], "needs greedy decoding"),
    (["--shard", "3/2"], "--shard must be I/N"),
])
def test_the_bench_command_refuses_bad_options_before_loading_the_model(monkeypatch, tmp_path, args, message):
    """Bad input costs no model load: the options that need no model are judged first."""
    result = bench_before_loading(monkeypatch, tmp_path / "out", *args)
    assert isinstance(result.exception, SpecframeError), result.output
    assert message in str(result.exception)
    assert not any((tmp_path / "out").iterdir())  # nothing written


def test_generate_compare_warms_both_sides_up_and_reports_the_same_tokens(target, tmp_path):
    """`--compare` first runs an untimed warm-up through both sides; what it reports is still the prompt's
    own continuation, identical to transformers' and to a run without `--compare`."""
    from typer.testing import CliRunner

    from specframe.cli import app

    model_dir = tmp_path / "model"
    target.model.save_pretrained(model_dir)
    target.tokenizer.save_pretrained(model_dir)
    args = ["generate", "one two three one two three", "--model", str(model_dir), "--max-new-tokens", "12",
            "--json"]
    plain, compared = (CliRunner().invoke(app, args + extra) for extra in ([], ["--compare"]))
    assert plain.exit_code == 0 and compared.exit_code == 0, compared.output
    plain, compared = json.loads(plain.stdout), json.loads(compared.stdout)
    assert compared["identical"] is True and compared["text"] == plain["text"]
    assert compared["new_tokens"] == plain["new_tokens"] == 12


def test_sampled_repeats_are_different_samples_drawn_alike_by_every_method(target, tmp_path):
    """With --seed S, repeat r samples with seed S + r: n repeats are n samples of a prompt (best-of-n),
    and `sample-match`, which draws one token per emitted token, reproduces plain sampling's tokens."""
    sampling = specframe.SamplingParams(temperature=1.0, seed=11)
    run, _ = run_benchmark(target, PROMPTS[1:], ["pld+chain+sample-match@4"], tmp_path, peers="none",
                           repeats=3, max_new_tokens=NEW_TOKENS, sampling=sampling, progress=False,
                           plots=False)
    by = {(r["method"], r["repeat"]): r for r in run.records}
    assert [by["baseline", rep]["seed"] for rep in range(3)] == [11, 12, 13]
    samples = {tuple(by["baseline", rep]["tokens"]) for rep in range(3)}
    assert len(samples) == 3  # three different samples, not one sample three times
    for rep in range(3):
        assert by["pld+chain+sample-match@4", rep]["tokens"] == by["baseline", rep]["tokens"]


def test_a_request_seed_replaces_the_sampling_seed_for_that_request_only(target):
    decoder = specframe.SpeculativeDecoder.from_names(
        target, "none", verifier="sample-match", budget=1,
        sampling=specframe.SamplingParams(temperature=1.0, seed=3))
    fixed = decoder.generate([1, 2, 3], max_new_tokens=8).tokens
    other = decoder.generate([1, 2, 3], max_new_tokens=8, seed=4).tokens
    assert decoder.generate([1, 2, 3], max_new_tokens=8).tokens == fixed
    seeded4 = specframe.SpeculativeDecoder.from_names(
        target, "none", verifier="sample-match", budget=1,
        sampling=specframe.SamplingParams(temperature=1.0, seed=4))
    assert seeded4.generate([1, 2, 3], max_new_tokens=8).tokens == other != fixed


# --- what `specframe bench` shows and where it stops --------------------------------------------------------


def two_questions(tmp_path) -> list[str]:
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [text]}) + "\n"
                                 for i, text in enumerate(["Name three colors.", "Count to five."])))
    return ["--suite", str(questions), "--methods", "pld@4", "--peers", "none", "--repeats", "1",
            "--max-new-tokens", "4", "--no-plots"]


def full_disk_after(writes: int, real, cut: bool = False):
    """A writer that does `writes` writes, then (with `cut`) half of the next, then fails as a full disk
    does."""
    import errno
    import os

    done = []

    def write(path, text, *rest):
        if len(done) == writes:
            if cut:
                real(path, text[:len(text) // 2], *rest)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        done.append(path)
        return real(path, text, *rest)

    return write


def test_a_full_disk_ends_bench_with_one_error_line_and_keeps_the_records(target, tmp_path, monkeypatch,
                                                                          capsys):
    out = tmp_path / "out"
    args = [*two_questions(tmp_path), "--out", str(out)]
    monkeypatch.setattr(bench_store, "append_line", full_disk_after(2, bench_store.append_line, cut=True))
    code, err = bench_main(monkeypatch, capsys, target, *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: bench could not write")
    assert "No space left on device" in err and "free some space on that disk" in err
    assert "the 2 record(s) written before stay in" in err and "rerun the same command" in err
    lines = (out / "records.jsonl").read_text().split("\n")
    assert len(lines) == 3 and all(json.loads(line) for line in lines[:2])  # and half a third line

    monkeypatch.undo()  # room again: the same command resumes, the cut line redone
    code, _ = bench_main(monkeypatch, capsys, target, *args)
    assert code == 0
    assert len(bench_store.read_records(out / "records.jsonl")) == 4


def test_a_full_disk_at_the_tables_keeps_every_record_and_says_how_to_write_them(target, tmp_path,
                                                                                 monkeypatch, capsys):
    import specframe.bench.report as report

    out = tmp_path / "out"
    monkeypatch.setattr(report, "write_atomically", full_disk_after(0, report.write_atomically))
    code, err = bench_main(monkeypatch, capsys, target, *two_questions(tmp_path), "--out", str(out))
    assert code == 2 and err.count("\n") == 1 and "results.json" in err and "No space left" in err
    assert "every record stays in" in err and "nothing is run again" in err
    assert len(bench_store.read_records(out / "records.jsonl")) == 4


@pytest.mark.parametrize("where", ["a file", "under a file", "read-only"])
def test_an_out_that_cannot_be_written_is_one_error_line(target, tmp_path, monkeypatch, capsys, where):
    from pathlib import Path

    (tmp_path / "file").write_text("")
    out = {"a file": tmp_path / "file", "under a file": tmp_path / "file" / "out",
           "read-only": Path("/proc/bench-out")}[where]  # /proc: no one creates files there, root included
    if where == "read-only" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    code, err = bench_main(monkeypatch, capsys, target, *two_questions(tmp_path), "--out", str(out))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: --out")
    assert ("cannot be a directory" if where != "read-only" else "is not writable") in err


def test_progress_names_the_method_question_and_repeat_on_a_terminal_only(target, tmp_path, monkeypatch,
                                                                          capsys):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    prompts = PROMPTS[1:]
    run_benchmark(target, prompts, ["pld@4"], tmp_path / "piped", peers="none", repeats=2, max_new_tokens=4,
                  plots=False)
    assert capsys.readouterr().err == ""  # a pipe gets no progress at all
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run_benchmark(target, prompts, ["pld@4"], tmp_path / "terminal", peers="none", repeats=2,
                  max_new_tokens=4, plots=False)
    shown = terminal.getvalue()
    assert "warming up pld@4" in shown and "bench: 100%" in shown
    assert "pld@4 on code-1 turn 1, repeat 2/2" in shown and "baseline on code-1 turn 1, repeat 1/2" in shown


def test_every_speedup_names_its_baseline_and_tau_is_told_from_realised_tokens_per_step(target, tmp_path):
    run, _ = run_benchmark(target, PROMPTS[1:], ["pld@4", "pld"], tmp_path, peers="hf-generate", repeats=1,
                           max_new_tokens=4, plots=False, progress=False)
    text = (tmp_path / "results.md").read_text()
    assert "| method | speedup over | speedup |" in text
    for label, baseline in (("baseline", "-"), ("pld@4", "baseline"), ("hf-generate", "baseline")):
        assert f"| {label} | {baseline} |" in text
    assert "*speedup over*: the plain decoding each row is timed against" in text
    assert "*tau*: tokens emitted per verification step, the target's bonus token included" in text
    assert "realised tokens/step is not tau" in text  # the `auto` table of pld
