"""The bench loop at B = 1 (`specframe.bench.loop`, `request_plan`): the order in which stub runners decode
every turn of every prompt, the history each turn is given, and resuming a stopped run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specframe.bench import BenchPrompt
from specframe.bench import loop as bench_loop
from specframe.bench.loop import batch_plan, request_plan, run_calls
from specframe.bench.store import RECORD_METRICS, REQUESTS, start_out
from specframe.testing.targets import tiny_tokenizer

PROMPTS = [BenchPrompt("q0", "code", ("first zero", "second zero"), chat=False),
           BenchPrompt("q1", "code", ("first one",), chat=False)]


class StubRunner:
    """A runner that answers a request with its last two ids and appends (its label, the question, the
    turn, the repeat, the prompt's text) to `calls`; with `remembers`, it keeps what it is `remember`ed."""

    lossless, seed = True, None

    def __init__(self, label: str, baseline: str | None, calls: list, remembers: bool = False, stop=None):
        self.label, self.baseline, self.calls = label, baseline, calls
        self.remembers, self.stop = remembers, stop
        self.memory: list = []

    def generate(self, ids: list[int], max_new_tokens: int, seed=None):
        if self.stop is not None and len(self.calls) == self.stop:
            raise KeyboardInterrupt
        self.calls.append((self.label, tiny_tokenizer().decode(ids)))
        self.memory.append(ids)
        return ids[-2:], dict.fromkeys(RECORD_METRICS, 0)

    def remember(self, ids: list[int], tokens: list[int]) -> None:
        self.memory.append(ids)


def runners(calls: list, **kwargs) -> list[StubRunner]:
    return [StubRunner("baseline", None, calls, **kwargs), StubRunner("a", "baseline", calls, **kwargs),
            StubRunner("b", "baseline", calls, **kwargs)]


def bench(out, stubs, repeats: int = 2):
    store = start_out(out, {"suite": "stub"}, False, REQUESTS)
    target = SimpleNamespace(tokenizer=tiny_tokenizer())
    return run_calls(target, PROMPTS, stubs, request_plan(PROMPTS, repeats), repeats=repeats,
                     max_new_tokens=4, store=store, warmup=False, progress=False)


def test_every_method_decodes_a_turn_before_any_decodes_the_next_rotated_per_prompt_and_repeat(tmp_path):
    calls: list = []
    run = bench(tmp_path, runners(calls))
    order = [label for label, _ in calls]
    assert order == ["baseline", "a", "b", "baseline", "a", "b",  # q0, repeat 0: both turns, one order
                     "a", "b", "baseline", "a", "b", "baseline",  # q0, repeat 1: rotated by one
                     "b", "baseline", "a",  # q1, repeat 0
                     "baseline", "a", "b"]  # q1, repeat 1
    keys = [(r["method"], r["qid"], r["turn"], r["repeat"]) for r in run.records]
    assert keys[:6] == [(m, "q0", t, 0) for t in (0, 1) for m in ("baseline", "a", "b")]
    assert run.sizes == [1] and run.mismatches == []


def test_a_later_turn_is_given_the_runners_own_earlier_answer(tmp_path, monkeypatch):
    histories = []

    def encode(tokenizer, prompt, turn, answers):
        histories.append((prompt.qid, turn, list(answers)))
        return real(tokenizer, prompt, turn, answers)

    real = bench_loop.encode_turn
    monkeypatch.setattr(bench_loop, "encode_turn", encode)
    calls: list = []
    bench(tmp_path, runners(calls), repeats=1)
    tokenizer = tiny_tokenizer()
    answer = tokenizer.decode(tokenizer("first zero", add_special_tokens=False)["input_ids"][-2:])
    assert histories[:6] == [("q0", 0, [])] * 3 + [("q0", 1, [answer])] * 3  # its answer to the first turn
    assert histories[6:] == [("q1", 0, [])] * 3


def test_a_stopped_run_resumes_and_hands_a_remembering_runner_what_it_skipped(tmp_path):
    calls: list = []
    with pytest.raises(KeyboardInterrupt):
        bench(tmp_path, runners(calls, remembers=True, stop=7))
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == 7

    whole: list = []
    reference = runners(whole, remembers=True)
    bench(tmp_path / "whole", reference)
    again: list = []
    resumed = runners(again, remembers=True)
    run = bench(tmp_path, resumed)
    assert len(again) == 18 - 7 and again == whole[7:]  # only the missing requests, in the same order
    assert [r.memory for r in resumed] == [r.memory for r in reference]  # the skipped ones remembered
    assert [json.loads(line)["method"] for line in lines] == [label for label, _ in whole[:7]]
    assert len(run.records) == 18


def test_a_batch_plan_cuts_chunks_per_size_and_repeat_and_starts_memory_afresh_at_each():
    plan = batch_plan(10, [2, 4], 2, chunk=4)
    assert [(c.size, c.repeat, c.number, list(c.part)) for c in plan[:3]] == [
        (2, 0, 0, [0, 1, 2, 3]), (2, 0, 1, [4, 5, 6, 7]), (2, 0, 2, [8, 9])]
    assert [c.shift for c in plan] == list(range(12))
    assert [c.fresh for c in plan] == [True, False, False] * 4
    assert {c.turn for c in plan} == {0}
