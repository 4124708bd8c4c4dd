"""The bench loop, at every batch size B alike: a plan of calls, every runner decoding each call in turn,
resumable from the record store, every lossless runner's rows checked against its baseline's.

A call is every runner decoding turn t of a chunk of prompts at batch size B in one repeat. Every runner
decodes a call before any decodes the next, their order rotated by one place per prompt (`request_plan`)
or per chunk (`batch_plan`), with synthetic runners last (they read their baseline's answer), so slow
drifts of a shared machine (thermal state, other processes) and any cost of running first or after a
given method hit all methods alike. One warm-up call per runner, on a prompt of no suite, runs before any
timing and is not recorded.

At B = 1 (`request_plan`) a chunk is one prompt: every turn of a prompt follows the one before it, with
the runner's own earlier answers as history, every repeat of a prompt before the next prompt; a record is
one request (layout `REQUESTS`, `records.jsonl`). Sampled runs with `--seed S` draw repeat r with seed
S + r in every method: the repeats are n different samples of each prompt. In a batch run or sweep
(`batch_plan`, `specframe.bench.batch`) the chunks are `chunk_size` prompts' first turns, B rows at a
time, every chunk of a (B, repeat) before the next repeat; a record is one call (layout `CALLS`,
`batch_records.jsonl`), and a drafter that remembers requests starts afresh at the first chunk of every
(B, repeat) (`PipelineRunner.start_suite`). Batch runs decode first turns only: their records are keyed
without a turn.

Every finished call is appended at once to the store; a rerun with the same `--out` skips what is there,
so an interrupted run resumes where it stopped, and a drafter that remembers earlier requests (`suffix`)
is handed the skipped calls' recorded outputs (`Drafter.remember`), so that the calls still to run find
the memory an uninterrupted run would have left them. A lossless runner's rows differing from its
baseline's (greedy runs) are printed at once and collected in the run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from specframe.support.progress import bar as progress_bar
from specframe.support.prompt_suites import BenchPrompt, encode_turn
from specframe.terms.target import Target

from specframe.bench.batch import GeneratePeerBatches, chunk_size, chunks
from specframe.bench.runner import WARMUP_PROMPT, WARMUP_TOKENS, SyntheticRunner
from specframe.bench.store import REQUESTS, RecordStore


@dataclass(frozen=True)
class Call:
    """One call of a plan: turn `turn` of the prompts at `part` (indices into the suite), `size` rows at a
    time, in repeat `repeat`. `number` counts the chunks of a (size, repeat); `shift` rotates the runners;
    `fresh` starts a drafter that remembers requests afresh before it."""

    size: int
    repeat: int
    number: int
    part: range
    turn: int
    shift: int
    fresh: bool = False


def request_plan(prompts: list[BenchPrompt], repeats: int, first_index: int = 0) -> list[Call]:
    """B = 1, one request at a time: for each prompt, each repeat, each turn, one call. `first_index` is
    the place of `prompts[0]` in the whole suite (it sets the rotation), for a worker that runs part of it
    (`specframe.bench.distributed`)."""
    return [Call(1, rep, index, range(index, index + 1), turn, (first_index + index) * repeats + rep)
            for index, prompt in enumerate(prompts) for rep in range(repeats)
            for turn in range(len(prompt.turns))]


def batch_plan(count: int, sizes: list[int], repeats: int, chunk: int | None = None) -> list[Call]:
    """Batch runs: for each size, each repeat, each chunk of the `count` prompts (`chunk_size`), one call
    on their first turns, the runners rotated by one place per call."""
    cells = [(size, rep, number, part) for size in sizes for rep in range(repeats)
             for number, part in enumerate(chunks(count, chunk_size(size, chunk)))]
    return [Call(size, rep, number, part, 0, shift, fresh=number == 0)
            for shift, (size, rep, number, part) in enumerate(cells)]


@dataclass
class Mismatch:
    """The first row where a lossless method's output departs from its baseline's in one call."""

    method: str
    baseline: str
    qid: str
    category: str
    turn: int
    repeat: int
    position: int  # first differing token index
    baseline_text: str
    method_text: str
    batch: int = 1

    def describe(self) -> str:
        return (f"LOSSLESS MISMATCH: '{self.method}' differs from '{self.baseline}' on question {self.qid} "
                f"turn {self.turn + 1} repeat {self.repeat + 1} at new token {self.position}: "
                f"baseline ...{self.baseline_text!r} vs method ...{self.method_text!r}")


@dataclass
class BenchRun:
    """What a finished run hands to the reports, at any batch sizes."""

    records: list[dict]
    runners: list
    prompts: list[BenchPrompt]
    sizes: list[int] = field(default_factory=lambda: [1])
    mismatches: list[Mismatch] = field(default_factory=list)
    identity_checked: bool = True  # greedy runs; sampled outputs are not compared
    peer: str | None = None  # the label of transformers' batched generate, when it ran batches
    chunks: dict[int, int] = field(default_factory=dict)  # prompts per chunk (the last may hold fewer), by B


def run_calls(target: Target, prompts: list[BenchPrompt], runners: list, plan: list[Call], *, repeats: int,
              max_new_tokens: int, store: RecordStore, check_identity: bool = True, warmup: bool = True,
              progress: bool = True) -> BenchRun:
    """Every runner decodes every call of `plan` (see the module docstring), each call's record read from
    `store` where an earlier process made it, else decoded and stored; returns the run."""
    requests, tokenizer = store.layout is REQUESTS, target.tokenizer
    todo = [r.label for c in plan for r in runners
            if store.get(*store.key(call_record(c, r.label, prompts, requests))) is None]
    bar = progress_bar(total=len(plan) * len(runners), initial=len(plan) * len(runners) - len(todo),
                       desc="bench" if requests else "bench --batch", unit="gen" if requests else "call",
                       show=progress, mininterval=1)
    if warmup and todo:
        warm_up([r for r in runners if r.label in todo], tokenizer, prompts[0].chat, max_new_tokens, bar,
                1 if requests else 2)
    run = BenchRun([], runners, prompts, list(dict.fromkeys(c.size for c in plan)),
                   identity_checked=check_identity,
                   peer=next((r.label for r in runners if isinstance(r, GeneratePeerBatches)), None),
                   chunks={c.size: len(c.part) for c in plan if c.number == 0})
    history: dict[tuple, list[str]] = {}
    for call in plan:
        records = {r.label: run_call(r, call, prompts, store, history, tokenizer, max_new_tokens, repeats,
                                     bar) for r in rotation(runners, call.shift)}
        run.records += records.values()
        for mismatch in call_mismatches(records, runners, prompts, call, tokenizer) if check_identity else []:
            run.mismatches.append(mismatch)
            where = "" if requests else f"batch {call.size}: "
            bar.write(f"\033[1;31m{where}{mismatch.describe()}\033[0m", file=sys.stderr)
    bar.close()
    return run


def run_call(runner, call: Call, prompts: list[BenchPrompt], store: RecordStore, history: dict,
             tokenizer, max_new_tokens: int, repeats: int, bar) -> dict:
    """The record of `runner` on one call: read from `store` where a stopped run made it already (a drafter
    that remembers requests is then told of its rows), else decoded and stored. The call's answers join
    each row's history for the prompt's next turn."""
    requests = store.layout is REQUESTS
    keys = [(runner.label, prompts[i].qid, call.repeat) for i in call.part]
    ids = [encode_turn(tokenizer, prompts[i], call.turn, history.get(k, [])) for i, k in zip(call.part, keys)]
    if call.fresh and getattr(runner, "remembers", False):
        runner.start_suite()
    record = store.get(*store.key(call_record(call, runner.label, prompts, requests)))
    if record is None:
        bar.set_postfix_str(progress_text(runner.label, call, prompts, repeats, requests))
        record = decode(runner, call, ids, max_new_tokens, store, prompts)
        store.add(record)
        bar.update()
    elif getattr(runner, "remembers", False):
        # Resuming: the drafter's memory of earlier requests gets these as well, so the calls still to run
        # see what an uninterrupted run would have shown them.
        for prompt_ids, tokens in zip(ids, rows(record)):
            runner.remember(prompt_ids, tokens)
    for i, key, tokens in zip(call.part, keys, rows(record)):
        if call.turn + 1 < len(prompts[i].turns):
            history.setdefault(key, []).append(tokenizer.decode(tokens, skip_special_tokens=True))
    return record


def call_record(call: Call, label: str, prompts: list[BenchPrompt], requests: bool) -> dict:
    """What names the record of `label` on `call` in the store, before its tokens and metrics: a request
    (question, category, turn, repeat) at B = 1, a batched call (B, repeat, chunk, questions) otherwise."""
    if requests:
        prompt = prompts[call.part[0]]
        return {"method": label, "qid": prompt.qid, "category": prompt.category, "turn": call.turn,
                "repeat": call.repeat}
    return {"method": label, "batch": call.size, "repeat": call.repeat, "chunk": call.number,
            "qids": [prompts[i].qid for i in call.part]}


def decode(runner, call: Call, ids: list[list[int]], max_new_tokens: int, store: RecordStore,
           prompts: list[BenchPrompt]) -> dict:
    """Decode one call with `runner`: one request (seeded per repeat, `request_seed`) at B = 1, the rows
    B at a time otherwise. Returns its record."""
    record = call_record(call, runner.label, prompts, store.layout is REQUESTS)
    if store.layout is not REQUESTS:
        tokens, metrics = runner.generate_batch(ids, max_new_tokens, call.size)
        return {**record, "tokens": tokens, "metrics": metrics}
    if isinstance(runner, SyntheticRunner):  # its drafter proposes the baseline's answer, kept at its rate
        runner.drafter.reference = store.get(*store.key({**record, "method": runner.baseline}))["tokens"]
    seed = request_seed(runner, call.repeat)
    tokens, metrics = runner.generate(ids[0], max_new_tokens, seed=seed)
    return {**record, "tokens": tokens, "metrics": metrics, "seed": seed}


def rows(record: dict) -> list[list[int]]:
    """The new tokens of every row of a record: one request's, or a batched call's rows."""
    return record["tokens"] if "batch" in record else [record["tokens"]]


def progress_text(label: str, call: Call, prompts: list[BenchPrompt], repeats: int, requests: bool) -> str:
    """What the progress bar says is being decoded."""
    where = (f"on {prompts[call.part[0]].qid} turn {call.turn + 1}" if requests else
             f"at B = {call.size}, prompts {call.part[0] + 1}-{call.part[-1] + 1} of {len(prompts)}")
    return f"{label} {where}, repeat {call.repeat + 1}/{repeats}"


def warm_up(runners: list, tokenizer, chat: bool, max_new_tokens: int, bar, rows: int = 1) -> None:
    """One short untimed call of each runner before any timed one (a first request may calibrate, a first
    batched step pay setup), on a prompt of no suite: methods that remember earlier responses (`suffix`)
    learn nothing from it. At `rows` > 1 the call is a batch of that many rows of the prompt."""
    warm = BenchPrompt("warmup", "warmup", (WARMUP_PROMPT,), chat)
    ids, tokens = encode_turn(tokenizer, warm, 0, []), min(WARMUP_TOKENS, max_new_tokens)
    for runner in runners:
        if isinstance(runner, SyntheticRunner):
            runner.drafter.reference = []
        bar.set_postfix_str(f"warming up {runner.label}")
        if rows > 1:
            runner.generate_batch([ids] * rows, tokens, rows)
        else:
            runner.generate(ids, tokens)


def call_mismatches(records: dict[str, dict], runners: list, prompts: list[BenchPrompt], call: Call,
                    tokenizer) -> list[Mismatch]:
    """The first row of `call` where each lossless runner's record departs from its baseline's."""
    found = []
    for runner in runners:
        if runner.baseline is None or not runner.lossless:
            continue
        mine, base = records[runner.label], records[runner.baseline]
        for i, a, b in zip(call.part, rows(mine), rows(base)):
            if a != b:
                position, base_text, text = difference(b, a, tokenizer)
                found.append(Mismatch(runner.label, runner.baseline, prompts[i].qid, prompts[i].category,
                                      call.turn, call.repeat, position, base_text, text, call.size))
                break
    return found


def difference(base: list[int], mine: list[int], tokenizer) -> tuple[int, str, str]:
    """The first token where `mine` departs from `base`, and the text of each around it."""
    position = next((i for i, (x, y) in enumerate(zip(base, mine)) if x != y), min(len(base), len(mine)))
    lo = max(0, position - 8)
    return position, tokenizer.decode(base[lo:position + 8]), tokenizer.decode(mine[lo:position + 8])


def request_seed(runner, repeat: int) -> int | None:
    """The sampling seed of one request: `--seed` plus the repeat, so the repeats of a sampled run are
    n different samples (best-of-n) while every method draws with the same seed on the same repeat; None
    (fresh seeds) without `--seed`."""
    seed = runner.seed
    return None if seed is None else seed + repeat


def rotation(runners: list, shift: int) -> list:
    """The runners rotated by `shift`, so that no method always runs first (or right after another),
    with synthetic runners moved last: they need their baseline's output on the same call."""
    shift %= len(runners)
    order = runners[shift:] + runners[:shift]
    return [r for r in order if not isinstance(r, SyntheticRunner)] + [
        r for r in order if isinstance(r, SyntheticRunner)]
