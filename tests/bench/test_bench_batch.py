"""`specframe bench --batch`: batched decoding against plain batched decoding and transformers' batched
`generate`, on a tiny random Llama with the character-level tokenizer.

The table has its columns; every method's rows are checked against plain decoding (a verifier broken on
purpose is caught); a sweep writes its method x B table and plot and resumes without rerunning finished
calls; bad `--batch` values and options a batch run cannot honour are refused before a model loads; a
call's time split counts the shared forward once. (The order of the calls, chunk by chunk, and the
tables' arithmetic: test_bench_batch_chunks.py.)
"""

from __future__ import annotations

import json

import pytest

import specframe
from specframe.bench import BenchPrompt
from specframe.bench import batch as bench_batch
from specframe.bench import store as bench_store
from specframe.bench.batch import parse_batches
from specframe.bench.harness import check_options, run_benchmark
from specframe.bench.batch_report import COLUMNS
from specframe.bench.runner import PipelineRunner
from specframe.bench.store import CALLS, start_out
from specframe.terms.errors import ConfigurationError, SpecframeError
from specframe.terms.metrics import clock_name, now, set_clock
from specframe.testing import tiny_target

from bench_runs import BROKEN_METHOD, bench_before_loading, bench_main, broken_registry

PROMPTS = [
    BenchPrompt("a", "code", ("abcabcabcabc",), chat=False),
    BenchPrompt("b", "code", ("xyz xyz xyz xyz xyz", "a second turn, never read at B > 1"), chat=False),
    BenchPrompt("c", "prose", ("the cat sat on the mat, the cat",), chat=False),
]
NEW_TOKENS = 8
QUIET = dict(repeats=1, max_new_tokens=NEW_TOKENS, progress=False)

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=3)


def test_the_table_has_its_columns_and_every_row_equals_plain_decoding(target, tmp_path):
    methods = ["pld(min_ngram=1)@4", "pld(min_ngram=1)+trie@4"]
    run, table = run_benchmark(target, PROMPTS, methods, tmp_path, batches=[2], peers="hf-generate",
                                     plots=False, **QUIET)
    assert run.mismatches == []
    rows = table[2]
    assert list(rows) == ["baseline", *methods, "hf-generate"]
    assert rows["baseline"]["speedup_plain"]["mean"] == 1.0 and rows["baseline"]["tau"] == 1.0
    assert rows["hf-generate"]["speedup_hf"]["mean"] == 1.0
    assert all(s["new_tokens"] == len(PROMPTS) * NEW_TOKENS and s["latency_p90_s"] > 0 for s in rows.values())
    assert rows["hf-generate"]["rows_compared"] == len(PROMPTS)  # counted against plain, never failed
    assert rows["baseline"]["time_per_step_ms"]["forward"] > 0
    assert rows["hf-generate"]["time_per_step_ms"] is None  # transformers' generate is not split
    for record in run.records:
        split = record["metrics"].get("time_s")
        if record["method"] != "hf-generate":  # a call's split and prefills lie within its seconds
            assert 0 < sum(split.values()) + record["metrics"]["prefill_s"] <= record["metrics"]["wall_s"]
    # plain batched rows are plain greedy decoding of each first turn alone
    plain = specframe.SpeculativeDecoder.from_names(target, "none", budget=1)
    base = next(r for r in run.records if r["method"] == "baseline")
    for prompt, tokens in zip(PROMPTS, base["tokens"]):
        ids = target.tokenizer(prompt.turns[0], add_special_tokens=False)["input_ids"]
        assert plain.generate(ids, max_new_tokens=NEW_TOKENS).tokens == tokens

    markdown = (tmp_path / "batch_results.md").read_text()
    assert "| " + " | ".join(COLUMNS) + " |" in markdown
    for label in rows:
        assert f"| {label} | 2 |" in markdown
    results = json.loads((tmp_path / "batch_results.json").read_text())
    assert set(results["batches"]["2"]) == set(rows) and results["mismatches"] == []


def test_a_row_that_departs_from_plain_decoding_is_a_mismatch(target, tmp_path):
    method = BROKEN_METHOD
    run, table = run_benchmark(target, PROMPTS, [method], tmp_path, batches=[2], peers="none",
                                     registry=broken_registry(), plots=False, **QUIET)
    assert run.mismatches and {(m.batch, m.method) for m in run.mismatches} == {(2, method)}
    assert table[2][method]["rows_differing"] > 0
    assert "MISMATCH" in (tmp_path / "batch_results.md").read_text()


def test_a_sweep_writes_its_table_and_plot_and_resumes_without_rerunning(target, tmp_path, monkeypatch):
    kwargs = dict(batches=[1, 2], peers="hf-generate", **QUIET)
    run, table = run_benchmark(target, PROMPTS, ["pld@4"], tmp_path, **kwargs)
    assert list(table) == [1, 2] and run.mismatches == []
    assert (tmp_path / "batch_speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (tmp_path / "batch_results.md").read_text()
    assert "| method | B=1 | B=2 |" in markdown
    assert not (tmp_path / "results.md").exists()  # a one-request run's files are left alone
    lines = (tmp_path / "batch_records.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 3  # (baseline, pld@4, hf-generate) x (B=1, B=2)

    (tmp_path / "batch_records.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    calls = []
    for runner in (PipelineRunner, bench_batch.GeneratePeerBatches):
        real = runner.generate_batch

        def counted(self, *args, real=real):
            calls.append(self.label)
            return real(self, *args)

        monkeypatch.setattr(runner, "generate_batch", counted)
    again, _ = run_benchmark(target, PROMPTS, ["pld@4"], tmp_path, warmup=False, plots=False, **kwargs)
    last = json.loads(lines[-1])
    assert calls == [last["method"]]  # only the call whose line was cut short ran again
    assert len(again.records) == 6

    with pytest.raises(ConfigurationError, match="other settings"):
        run_benchmark(target, PROMPTS, ["pld@4"], tmp_path, **{**kwargs, "max_new_tokens": 5})


@pytest.mark.parametrize("text, sizes", [("1", [1]), ("4", [4]), (" 1, 2,4 ", [1, 2, 4])])
def test_batch_values_parse(text, sizes):
    assert parse_batches(text) == sizes


@pytest.mark.parametrize("args, message", [
    (["--batch", "0"], "--batch sizes must be >= 1"),
    (["--batch", "-2"], "--batch sizes must be >= 1"),
    (["--batch", "two"], "--batch takes a number of rows"),
    (["--batch", "1.5"], "--batch takes a number of rows"),
    (["--batch", "2,2"], "names a size twice"),
    (["--batch", "2", "--methods", "pld@4", "--peers", "hf-generate,hf-pld"], "peer 'hf-pld' cannot decode"),
    (["--batch", "2", "--methods", "pld@4", "--peers", "none", "--temperature", "0.7"], "decode greedily"),
    (["--batch", "2", "--methods", "pld@4", "--peers", "none", "--shard", "0/2"], "--limit instead"),
    (["--batch", "2", "--methods", "pld@4", "--peers", "none", "--synthetic-acceptance", "0.5"],
     "run it at --batch 1"),
    (["--batch", "2", "--methods", "pld@4", "--peers", "none", "--turns", "2"],
     "--turns 2 does not go with --batch 2: a batch run decodes the first turn of every question only"),
    (["--batch", "1,2", "--methods", "pld@4", "--peers", "none", "--turns", "0"], "--turns 0 does not go"),
])
def test_bad_batch_options_are_refused_before_the_model_loads(monkeypatch, tmp_path, args, message):
    result = bench_before_loading(monkeypatch, tmp_path / "out", *args)
    assert isinstance(result.exception, SpecframeError), result.output
    assert message in str(result.exception)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_bench_command_runs_a_sweep(target, tmp_path):
    from typer.testing import CliRunner

    from specframe.cli import app

    from specframe.testing.targets import tiny_tokenizer

    model_dir = tmp_path / "model"
    target.model.save_pretrained(model_dir)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # the suite chats
    tokenizer.save_pretrained(model_dir)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [text]}) + "\n"
                                 for i, text in enumerate(["abcabcabc", "hello hello hello", "1 2 3 1 2 3"])))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "bench", "--model", str(model_dir), "--suite", str(questions), "--methods", "pld@4",
        "--peers", "hf-generate", "--repeats", "1", "--max-new-tokens", "6", "--batch", "1,2",
        "--threads", "1", "--clock", "cpu", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| pld@4 | 2 |" in result.output and "| method | B=1 | B=2 |" in result.output
    assert {p.name for p in out.iterdir()} >= {"batch_records.jsonl", "batch_results.json",
                                               "batch_results.md", "batch_speedup.png"}


def test_a_drafter_that_remembers_requests_starts_every_batch_size_afresh(target, tmp_path):
    """suffix learns every finished row; each timed call starts with no memory, so the second batch size
    does not copy the first one's answers (its drafts then match those of the same size run alone)."""
    sweep, _ = run_benchmark(target, PROMPTS, ["suffix@4"], tmp_path / "sweep", batches=[2, 3],
                                   peers="none", plots=False, **QUIET)
    alone, _ = run_benchmark(target, PROMPTS, ["suffix@4"], tmp_path / "alone", batches=[3],
                                   peers="none", plots=False, **QUIET)
    steps = {(r["batch"], r["method"]): r["metrics"]["steps"] for r in sweep.records}
    assert steps[(3, "suffix@4")] == next(r["metrics"]["steps"] for r in alone.records
                                          if r["method"] == "suffix@4")


def test_a_calls_time_split_counts_the_shared_forward_once_and_lies_within_the_call(target):
    """Each row's own split holds the shared forward of every step it took part in; the call's split
    (`SpeculativeDecoder.batch_metrics`) counts a step's forward once and sums its rows' drafting and
    verifying, so that with the prefills it adds up to the call's seconds less what the call spends
    outside its steps (admitting and retiring rows). On the CPU clock, which other processes' load does
    not inflate."""
    decoder = specframe.SpeculativeDecoder.from_names(target, "pld(min_ngram=1)", budget=4)
    ids = [target.tokenizer(p.turns[0], add_special_tokens=False)["input_ids"] for p in PROMPTS]
    previous = clock_name()
    set_clock("cpu")
    try:
        start = now()
        results = decoder.generate_batch(ids, NEW_TOKENS, batch_size=len(ids))
        wall = now() - start
    finally:
        set_clock(previous)
    split, rows = decoder.batch_metrics, [r.metrics for r in results]
    assert split.steps == max(m.steps for m in rows)  # every row admitted at once: one forward per step
    for phase in ("draft", "tree", "verify"):
        assert split.time[phase] == pytest.approx(sum(m.time[phase] for m in rows))
    longest = max(rows, key=lambda m: m.steps)
    assert split.time["forward"] == pytest.approx(longest.time["forward"])  # it took part in every step
    assert sum(m.time["forward"] for m in rows) > split.time["forward"]  # summing rows counts it again
    assert split.prefill_s == pytest.approx(sum(m.prefill_s for m in rows))
    rest = wall - sum(split.time.values()) - split.prefill_s
    assert 0 <= rest < 0.5 * wall


def test_a_drafter_that_remembers_requests_keeps_its_memory_from_chunk_to_chunk_and_on_resuming(target,
                                                                                                tmp_path):
    """At B = 1 one call over the suite lets each request copy the answers before it; in chunks of one
    prompt each chunk must find them too: the (B, repeat)'s decoder carries over, and a resumed run gives
    it the finished chunks' recorded answers. One prompt three times makes the memory count (its copies
    are drafted from the first answer)."""
    same = [BenchPrompt(qid, "code", PROMPTS[2].turns, chat=False) for qid in ("x", "y", "z")]
    kwargs = dict(batches=[1, 2], peers="none", plots=False, **QUIET)  # a sweep: B = 1 is a batch of one

    def steps(run) -> int:
        return sum(r["metrics"]["steps"] for r in run.records
                   if r["method"] == "suffix@4" and r["batch"] == 1)

    alone, _ = run_benchmark(target, same[:1], ["suffix@4"], tmp_path / "alone", **kwargs)
    whole, _ = run_benchmark(target, same, ["suffix@4"], tmp_path / "whole", chunk=3, **kwargs)
    chunked, _ = run_benchmark(target, same, ["suffix@4"], tmp_path / "chunked", chunk=1, **kwargs)
    assert steps(chunked) == steps(whole) < 3 * steps(alone)

    records = tmp_path / "chunked" / "batch_records.jsonl"
    first = [line for line in records.read_text().splitlines() if json.loads(line)["chunk"] == 0]
    records.write_text("\n".join(first) + "\n")  # stopped after the first chunk
    resumed, _ = run_benchmark(target, same, ["suffix@4"], tmp_path / "chunked", chunk=1, **kwargs)
    assert steps(resumed) == steps(chunked)


def test_turns_1_goes_with_a_batch_run_it_is_what_the_run_decodes():
    prompts, _, _ = check_options(PROMPTS, ["pld@4"], batches=[2], peers="none", max_turns=1)
    assert [p.qid for p in prompts] == ["a", "b", "c"]


def test_a_full_disk_ends_a_batch_run_with_one_error_line_and_keeps_its_records(tmp_path, monkeypatch,
                                                                                 capsys):
    import errno
    import os

    from specframe.testing.targets import tiny_tokenizer

    chatting = tiny_target(seed=4)
    chatting.tokenizer = tiny_tokenizer()
    chatting.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [p.turns[0]]})
                                 + "\n" for i, p in enumerate(PROMPTS)))
    out = tmp_path / "out"
    writes = []

    def full_disk(path, line):
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        writes.append(line)
        real(path, line)

    real = bench_store.append_line
    monkeypatch.setattr(bench_store, "append_line", full_disk)
    code, err = bench_main(monkeypatch, capsys, chatting, "--suite", str(questions), "--methods", "pld@4",
                           "--peers", "none", "--repeats", "1", "--max-new-tokens", "4", "--batch", "2",
                           "--batch-chunk", "2", "--no-plots", "--out", str(out))
    assert code == 2 and err.count("\n") == 1
    records = out / "batch_records.jsonl"
    assert err.startswith(f"error: bench could not write {records} (No space left on device")
    assert "the 2 record(s) written before stay in" in err
    store = start_out(out, json.loads((out / "batch_settings.json").read_text()), False, CALLS)
    assert len(store.records) == 2
