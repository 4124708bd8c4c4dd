"""`specframe bench --batch`: the methods take turns chunk by chunk, a method's chunks add up to its
throughput, and its speedups carry a bootstrap interval over the chunks.

The runners here are stubs that record the order of their calls and report chosen seconds, so the order,
the resumption and the arithmetic are checked on known numbers without a model.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specframe.bench import BenchPrompt
from specframe.bench.batch import chunk_size
from specframe.bench.batch_report import markdown, ratio_interval, summarize
from specframe.bench.loop import BenchRun, batch_plan, run_calls
from specframe.bench.store import CALLS, call_metrics, start_out
from specframe.testing.targets import tiny_tokenizer

PROMPTS = [BenchPrompt(f"q{i}", "code", (f"prompt number {i}",), chat=False) for i in range(10)]


class StubRunner:
    """A runner that answers every prompt with its first two ids, in `seconds(label, prompts)` seconds,
    and appends (its label, the question numbers it was given) to `calls`."""

    lossless = True

    def __init__(self, label: str, baseline: str | None, calls: list, seconds=lambda label, n: float(n)):
        self.label, self.baseline, self.calls, self.seconds = label, baseline, calls, seconds

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int, size: int):
        numbers = tuple(int(tiny_tokenizer().decode(p).split()[-1]) for p in prompts)
        self.calls.append((self.label, numbers))
        tokens = [p[:2] for p in prompts]
        seconds = self.seconds(self.label, len(prompts))
        lengths = [len(t) for t in tokens]
        return tokens, call_metrics(seconds, lengths, [seconds] * len(tokens), len(tokens), 0)


def runners(calls: list) -> list[StubRunner]:
    return [StubRunner("baseline", None, calls), StubRunner("fast", "baseline", calls),
            StubRunner("slow", "baseline", calls)]


@pytest.fixture(scope="module")
def target():
    return SimpleNamespace(tokenizer=tiny_tokenizer())


def run_batches(target, prompts, stubs, sizes, *, repeats, store, chunk=None, **kwargs) -> BenchRun:
    """The bench loop on a batch plan, as `run_benchmark` runs it at --batch `sizes`."""
    return run_calls(target, prompts, stubs, batch_plan(len(prompts), sizes, repeats, chunk), repeats=repeats,
                     store=store, **kwargs)


def run(target, out, stubs, **kwargs) -> BenchRun:
    store = start_out(out, {"suite": "stub"}, False, CALLS)
    return run_batches(target, PROMPTS, stubs, [2], repeats=kwargs.pop("repeats", 1), max_new_tokens=4,
                       store=store, warmup=False, progress=False, **kwargs)


def test_every_method_decodes_a_chunk_before_any_decodes_the_next(target, tmp_path):
    calls: list = []
    result = run(target, tmp_path, runners(calls), chunk=4, repeats=2)
    first, second, third = (0, 1, 2, 3), (4, 5, 6, 7), (8, 9)
    assert calls == [("baseline", first), ("fast", first), ("slow", first),  # repeat 0
                     ("fast", second), ("slow", second), ("baseline", second),  # rotated by one per chunk
                     ("slow", third), ("baseline", third), ("fast", third),
                     ("baseline", first), ("fast", first), ("slow", first),  # repeat 1
                     ("fast", second), ("slow", second), ("baseline", second),
                     ("slow", third), ("baseline", third), ("fast", third)]
    assert [r["chunk"] for r in result.records[:9]] == [0] * 3 + [1] * 3 + [2] * 3
    assert result.mismatches == []


@pytest.mark.parametrize("size, prompts", [(1, 8), (2, 8), (3, 9), (4, 8), (5, 10), (8, 16), (16, 32)])
def test_a_chunk_holds_two_batches_at_least_eight_prompts_and_whole_batches(size, prompts):
    assert chunk_size(size) == prompts
    assert chunk_size(size, 5) == 5  # --batch-chunk as given


def test_a_stopped_run_resumes_without_redoing_its_finished_chunks(target, tmp_path):
    calls: list = []

    def stop_at_the_fifth_call(label, n):
        if len(calls) == 5:
            raise KeyboardInterrupt
        return float(n)

    with pytest.raises(KeyboardInterrupt):
        run(target, tmp_path, [StubRunner(r.label, r.baseline, calls, stop_at_the_fifth_call)
                               for r in runners([])], chunk=4)
    done = calls[:4]
    lines = (tmp_path / "batch_records.jsonl").read_text().splitlines()
    assert [(json.loads(line)["method"], tuple(int(q[1:]) for q in json.loads(line)["qids"]))
            for line in lines] == done

    again: list = []
    result = run(target, tmp_path, runners(again), chunk=4)
    assert not set(again) & set(done) and len(again) == 9 - len(done)
    assert len(result.records) == 9 and result.mismatches == []


def chunk_record(method: str, chunk: int, qids: list[str], tokens: int, seconds: float,
                 split: dict | None = None) -> dict:
    rows = [[1] * (tokens // len(qids))] * len(qids)
    metrics = call_metrics(seconds, [len(r) for r in rows], [seconds] * len(rows), len(qids) * 4, len(qids))
    return {"method": method, "batch": 2, "repeat": 0, "chunk": chunk, "qids": qids, "tokens": rows,
            "metrics": {**metrics, **(split or {})}}


def known_run() -> BenchRun:
    """Two chunks: plain decodes each in 4 s and 2 s, `fast` in 2 s and 1.5 s (2x, then 1.33x)."""
    a, b = ["q0", "q1"], ["q2", "q3"]
    split = [{"batch_steps": 10, "time_s": {"draft": 0.5, "forward": 1.0, "other": 0.1}},
             {"batch_steps": 5, "time_s": {"draft": 0.3, "forward": 0.9, "other": 0.1}}]
    records = [chunk_record("baseline", 0, a, 40, 4.0), chunk_record("fast", 0, a, 40, 2.0, split[0]),
               chunk_record("fast", 1, b, 40, 1.5, split[1]), chunk_record("baseline", 1, b, 40, 2.0)]
    stubs = [StubRunner("baseline", None, []), StubRunner("fast", "baseline", [])]
    return BenchRun(records, stubs, PROMPTS[:4], [2], chunks={2: 2})


def test_a_methods_chunks_add_up_to_its_throughput_and_split():
    stats = summarize(known_run())[2]
    assert stats["fast"]["tokens_per_s"]["mean"] == pytest.approx(80 / 3.5)  # not the mean of 20 and 26.7
    assert stats["baseline"]["tokens_per_s"]["mean"] == pytest.approx(80 / 6.0)
    assert stats["fast"]["speedup_plain"]["mean"] == pytest.approx((80 / 3.5) / (80 / 6.0))
    assert stats["fast"]["chunks"] == 2
    assert stats["fast"]["time_per_step_ms"] == pytest.approx({"draft": 800 / 15, "forward": 1900 / 15,
                                                                "other": 200 / 15})
    assert stats["baseline"]["time_per_step_ms"] is None  # these chunks kept no split


def test_the_speedup_interval_spans_the_chunks_and_the_noise_line_gives_its_widest():
    run = known_run()
    stats = summarize(run)[2]
    # Two chunks: a draw takes both from one chunk a quarter of the time, so the 95 % interval runs from
    # the one chunk's ratio to the other's
    assert stats["fast"]["speedup_plain_interval"] == pytest.approx([(40 / 1.5) / (40 / 2.0), 2.0])
    assert stats["baseline"]["speedup_plain_interval"] is None
    text = markdown(summarize(run), run)
    assert "| draft ms/step | forward ms/step |" in text
    row = "| fast | 2 | 22.9 | 1.75 | 2.00 | 1.25 | 53.3 | 126.7 | 1.71 [1.33, 2.00] | - | identical |"
    assert row in text
    assert "at widest ±20.0 % over plain batched" in text  # (2.00 - 1.33) / (2.00 + 1.33)


def test_equal_ratios_on_every_chunk_leave_no_spread_and_one_chunk_gives_no_interval():
    def merged(*chunks):
        return {0: {"chunks": {(f"q{i}",): c for i, c in enumerate(chunks)}}}

    assert ratio_interval(merged((10, 1.0), (30, 3.0), (20, 2.0)),
                          merged((10, 2.0), (30, 6.0), (20, 4.0))) == pytest.approx([2.0, 2.0])
    assert ratio_interval(merged((10, 1.0)), merged((10, 2.0))) is None
    run = known_run()
    run.records = [r for r in run.records if r["chunk"] == 0]
    run.prompts = PROMPTS[:2]
    text = markdown(summarize(run), run)
    assert "*Noise*: not measured: one chunk of 2 prompt(s) at B = 2, and one repeat kept" in text
    assert "about 5 %" not in text  # no fixed rule of thumb stands in for a measurement


def test_the_noise_line_states_the_chunks_the_run_really_cut(target, tmp_path):
    """Four prompts at B = 4 make one chunk of four, not the default chunk's eight; with two repeats the
    noise given is the interval over the chunk's two timings."""
    calls: list = []
    store = start_out(tmp_path, {"suite": "stub"}, False, CALLS)

    def seconds(label, n):  # plain: 4 s then 5 s; fast: 2 s each time
        return 2.0 if label == "fast" else 4.0 + sum(c[0] == "baseline" for c in calls) - 1

    stubs = [StubRunner("baseline", None, calls, seconds), StubRunner("fast", "baseline", calls, seconds)]
    result = run_batches(target, PROMPTS[:4], stubs, [4], repeats=2, max_new_tokens=4, store=store,
                         warmup=False, progress=False)
    assert result.chunks == {4: 4}
    text = markdown(summarize(result), result)
    assert "chunk by chunk (one chunk of 4 prompt(s) at B = 4)" in text
    assert "at widest ±11.1 % over plain batched" in text  # speedups 2.0 and 2.5: 0.5 / 4.5
    assert "8 prompts" not in text and "about 5 %" not in text


def test_chunks_are_counted_as_cut():
    from specframe.bench.batch_report import chunking

    assert chunking(10, {2: 4, 4: 8, 16: 10}) == (
        "3 chunks of 4 prompts, the last of 2 at B = 2; 2 chunks of 8 prompts, the last of 2 at B = 4; "
        "one chunk of 10 prompt(s) at B = 16")


def test_batch_progress_names_method_batch_prompts_and_repeat_on_a_terminal_only(target, tmp_path, capsys,
                                                                                monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    def bench(out):
        store = start_out(out, {"suite": "stub"}, False, CALLS)
        run_batches(target, PROMPTS, runners([]), [2], repeats=1, max_new_tokens=4, store=store, chunk=4,
                    warmup=False)

    bench(tmp_path / "piped")
    assert capsys.readouterr().err == ""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bench(tmp_path / "terminal")
    shown = terminal.getvalue()
    assert "bench --batch: 100%" in shown
    assert "slow at B = 2, prompts 9-10 of 10, repeat 1/1" in shown
