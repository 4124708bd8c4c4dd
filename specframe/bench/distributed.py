"""`specframe bench --ray`: the question grid as Ray work, one model per worker.

A cell is one question with all its methods, turns and repeats. A fixed pool of Ray actors (`ActorPool`)
each build the target once, from a picklable `target_factory`, pin torch to `threads` threads and build
the runners; each cell runs in one of them through `run_calls`, the local loop, so the rotation order,
the warm-up (once per worker) and the records are the local run's. The driver loads no model: it skips
cells whose records are all in `records.jsonl`, hands a half-done cell its finished records (only the
missing runs are made), appends every record a cell returns to `records.jsonl` as soon as the cell
ends, compares each turn's lossless outputs with their baseline's, and writes the same reports.

Ray is imported only here, when `--ray` is given: `pip install 'specframe[ray]'`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass, make_dataclass
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager
from collections.abc import Callable

from specframe.terms.errors import ConfigurationError
from specframe.terms.metrics import clock_name
from specframe.terms.target import Target
from specframe.support.progress import bar as progress_bar
from specframe.support.ray_support import import_ray, ray_session
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.terms.sampling import SamplingParams

from specframe.bench.harness import bench_settings, check_options, target_settings, write_results
from specframe.bench.methods import resolve_methods
from specframe.bench.report import outline
from specframe.bench.loop import BenchRun, Mismatch, call_mismatches, request_plan
from specframe.bench.store import RecordStore, start_out
from specframe.support.prompt_suites import BenchPrompt


def require_ray():
    """The `ray` module, or a `ConfigurationError` saying how to install it or run without it."""
    return import_ray(ConfigurationError, "drop --ray to run the grid in this process")


@contextmanager
def worker_pool(ray, workers: int, threads: int) -> Iterator[list]:
    """`workers` `BenchWorker` actors of `threads` CPUs each, killed on the way out: each holds a model,
    freed at once, also on a cluster that stays up."""
    actors = [ray.remote(num_cpus=threads)(BenchWorker).remote() for _ in range(workers)]
    try:
        yield actors
    finally:
        for actor in actors:
            ray.kill(actor)


@dataclass(frozen=True)
class GridSpec:
    """What every worker needs to build the runners and run a cell (shipped to the actors)."""

    methods: list[str]
    peers: str
    sampling: SamplingParams
    repeats: int
    max_new_tokens: int
    budget: int | str
    synthetic_acceptance: float | None
    phase_timing: bool
    warmup: bool
    registry: PluginRegistry | None = None  # None: the installed plugins, loaded in the worker


class BenchWorker:
    """A Ray actor: one target, one set of runners, any number of cells."""

    def setup(self, target_factory: Callable[[], Target], threads: int, clock: str, grid: GridSpec) -> dict:
        """Load the model and build the runners; return the settings they give and the runners' outline.
        (Not in `__init__`: an error here reaches the driver as itself, e.g. a `ConfigurationError`.)"""
        import torch

        from specframe.bench.peers import parse_peers
        from specframe.bench.runner import build_runners, check_run_args
        from specframe.terms.metrics import set_clock

        torch.set_num_threads(threads)
        set_clock(clock)
        self.grid, self.warm = grid, not grid.warmup
        self.target = target_factory()
        check_run_args(self.target, grid.repeats, grid.max_new_tokens)
        registry = grid.registry or get_registry()
        specs = resolve_methods(grid.methods, registry, grid.budget)
        self.runners = build_runners(self.target, specs, parse_peers(grid.peers), grid.sampling, registry,
                                     grid.synthetic_acceptance, grid.budget, grid.phase_timing)
        return {"settings": target_settings(self.target), "runners": [outline(r) for r in self.runners],
                "tokenizer": self.target.tokenizer}

    def run_cell(self, index: int, prompt: BenchPrompt, done: list[dict]) -> list[dict]:
        """Every record of question `prompt` (the `index`-th of the suite), making those not in `done`."""
        from specframe.bench.loop import run_calls

        grid = self.grid
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done), "utf-8")
            run = run_calls(self.target, [prompt], self.runners, request_plan([prompt], grid.repeats, index),
                            repeats=grid.repeats, max_new_tokens=grid.max_new_tokens,
                            store=RecordStore(Path(tmp) / "records.jsonl"), check_identity=False,
                            warmup=not self.warm, progress=False)
        self.warm = True
        return run.records


def run_benchmark_ray(target_factory: Callable[[], Target], suite: str | list[BenchPrompt],
                      methods: list[str], out: str | Path, *, address: str = "local", workers: int = 2,
                      threads: int = 1, peers: str = "all", limit: int | None = None, repeats: int = 3,
                      max_new_tokens: int = 128, budget: int | str = "auto",
                      synthetic_acceptance: float | None = None, sampling: SamplingParams | None = None,
                      registry: PluginRegistry | None = None, max_turns: int | None = None,
                      shard: str | None = None, plots: bool = True, progress: bool = True,
                      fresh: bool = False, warmup: bool = True, phase_timing: bool = True,
                      keep: str = "all", command: str | None = None) -> tuple[BenchRun, dict]:
    """`run_benchmark` with the questions spread over `workers` Ray actors of `threads` torch threads,
    on a new local Ray instance (`address="local"`, unless Ray is already initialised) or the cluster at
    `address`. `target_factory` builds the target in each worker, e.g.
    `functools.partial(load_target, "smollm2-135m", device="cpu")`. Same records, results and plots."""
    ray = require_ray()
    from ray.util import ActorPool

    if workers < 1 or threads < 1:
        raise ConfigurationError(f"--ray-workers and --threads must be >= 1, got {workers} and {threads}")
    sampling = sampling or SamplingParams()
    prompts, _, _ = check_options(suite, methods, peers=peers, limit=limit, shard=shard, max_turns=max_turns,
                                  repeats=repeats, max_new_tokens=max_new_tokens, budget=budget, keep=keep,
                                  sampling=sampling, registry=registry)
    out = Path(out)
    grid = GridSpec(methods, peers, sampling, repeats, max_new_tokens, budget, synthetic_acceptance,
                    phase_timing, warmup, registry)
    with ray_session(ray, address, workers * threads, log_to_driver=False), \
            worker_pool(ray, workers, threads) as actors:
        outlines = ray.get([a.setup.remote(target_factory, threads, clock_name(), grid) for a in actors])
        runners = [stand_in(r) for r in outlines[0]["runners"]]
        tokenizer = outlines[0]["tokenizer"]
        settings = bench_settings(outlines[0]["settings"], suite, max_new_tokens, budget, sampling)
        store = start_out(out, settings, fresh)
        cells = pending_cells(prompts, runners, store, repeats)
        by_qid = {p.qid: p for p in prompts}

        def check(qid: str) -> list[Mismatch]:
            return check_cell(by_qid[qid], runners, store, repeats, tokenizer, sampling.greedy)

        pending = {p.qid for _, p, _ in cells}  # the others are checked again, as a local resumed run does
        mismatches = [m for p in prompts if p.qid not in pending for m in check(p.qid)]
        bar = progress_bar(total=len(prompts), initial=len(prompts) - len(cells), desc="bench (ray)",
                           unit="question", show=progress, mininterval=1)
        mismatches += run_cells(ActorPool(actors), cells, store, check, bar)
        bar.close()
    records = [store.records[k] for p in prompts for k in cell_keys(p, runners, repeats)]
    run = BenchRun(records, runners, prompts, mismatches=mismatches, identity_checked=sampling.greedy)
    table = write_results(run, out, settings, limit=limit, repeats=repeats, max_turns=max_turns, plots=plots,
                          keep=keep, command=command)
    return run, table


def pending_cells(prompts: list[BenchPrompt], runners: list, store: RecordStore,
                  repeats: int) -> list[tuple[int, BenchPrompt, list[dict]]]:
    """(index, question, its records already in `store`) for each question with records missing."""
    cells = []
    for index, prompt in enumerate(prompts):
        keys = cell_keys(prompt, runners, repeats)
        if any(k not in store.records for k in keys):
            cells.append((index, prompt, [store.records[k] for k in keys if k in store.records]))
    return cells


def run_cells(pool, cells: list[tuple], store: RecordStore, check: Callable[[str], list[Mismatch]],
              bar) -> list[Mismatch]:
    """Run `cells` on the actors of `pool` as they come free; add each record a cell returns to `store` at
    once, then `check` its question and print what does not match. Returns the mismatches."""
    mismatches: list[Mismatch] = []
    for records in pool.map_unordered(lambda actor, cell: actor.run_cell.remote(*cell), cells):
        for record in records:
            if store.key(record) not in store.records:
                store.add(record)
        for mismatch in check(records[0]["qid"]):
            bar.write(f"\033[1;31m{mismatch.describe()}\033[0m", file=sys.stderr)
            mismatches.append(mismatch)
        bar.update()
    return mismatches


def stand_in(outline: dict):
    """What the reports read of a runner that lives in the workers, under the runner's class name
    (`results.json` records it as the method's kind)."""
    cls = make_dataclass(outline["kind"], [("label", str), ("baseline", "str | None"), ("lossless", bool),
                                           ("control", bool)], frozen=True)
    return cls(outline["label"], outline["baseline"], outline["lossless"], outline["control"])


def cell_keys(prompt: BenchPrompt, runners: list, repeats: int) -> list[tuple]:
    """The record keys of one cell, in the order of a local run's records for each method."""
    return [(r.label, prompt.qid, turn, rep) for rep in range(repeats) for turn in range(len(prompt.turns))
            for r in runners]


def check_cell(prompt: BenchPrompt, runners: list, store: RecordStore, repeats: int, tokenizer,
               greedy: bool) -> list[Mismatch]:
    """Each lossless method's output on every turn of `prompt` against its baseline's (greedy runs)."""
    if not greedy:
        return []
    return [m for call in request_plan([prompt], repeats)
            for m in call_mismatches({r.label: store.get(r.label, prompt.qid, call.turn, call.repeat)
                                      for r in runners}, runners, [prompt], call, tokenizer)]
