"""`run_benchmark`: the whole harness in one call (what `specframe bench` runs), at one request at a time
or B rows at a time alike."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from specframe.terms.errors import ConfigurationError
from specframe.terms.kinds import ComponentKind
from specframe.terms.target import Target
from specframe.terms.metrics import clock_name
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.terms.sampling import SamplingParams

from specframe.bench.batch import GeneratePeerBatches, batch_peers, batched, check_batch_options
from specframe.bench.batch_report import PLOT, write_batch_reports
from specframe.bench.loop import BenchRun, batch_plan, request_plan, run_calls
from specframe.bench.methods import MethodSpec, resolve_methods
from specframe.bench.peers import PeerSpec, parse_peers
from specframe.bench.report import KEEP, command_text, page_header, write_reports
from specframe.bench.runner import build_runners, check_counts, check_run_args
from specframe.bench.store import CALLS, REQUESTS, start_out, tables_kept, writing
from specframe.support.prompt_suites import BenchPrompt, load_suite


def run_benchmark(target: Target, suite: str | list[BenchPrompt], methods: list[str], out: str | Path, *,
                  batches: list[int] | None = None, chunk: int | None = None, peers: str = "all",
                  limit: int | None = None, repeats: int = 3, max_new_tokens: int = 128,
                  budget: int | str = "auto", synthetic_acceptance: float | None = None,
                  sampling: SamplingParams | None = None, registry: PluginRegistry | None = None,
                  max_turns: int | None = None, shard: str | None = None, plots: bool = True,
                  progress: bool = True, fresh: bool = False, warmup: bool = True,
                  phase_timing: bool = True, keep: str = "all",
                  command: str | None = None) -> tuple[BenchRun, dict]:
    """Benchmark `methods` (specs or presets) against plain decoding and the transformers `peers` on
    `suite` (a suite name, a JSONL path, or prompts); write records, results and plots under `out`.

    `batches` are the batch sizes B: [1] (the default) decodes one request at a time, every turn
    (`specframe.bench.loop.request_plan`: `records.jsonl`, `results.*`); any other list decodes the first
    turns B rows at a time, the methods taking turns chunk by chunk (`chunk` prompts;
    `specframe.bench.loop.batch_plan`: `batch_records.jsonl`, `batch_results.*`). Both go through one
    option check, one loop (`specframe.bench.loop.run_calls`), one record store (`specframe.bench.store`)
    and one page writer. Returns the run and its
    summary table ({category: {method: stats}} at B = 1, {B: {method: stats}} otherwise); `keep` chooses
    which repeats the tables aggregate (`specframe.bench.report.KEEP`).
    """
    registry, sizes, out = registry or get_registry(), list(batches or [1]), Path(out)
    sampling, batch = sampling or SamplingParams(), batched(sizes)
    prompts, specs, peer_specs = check_options(
        suite, methods, batches=sizes, chunk=chunk, peers=peers, limit=limit, shard=shard,
        max_turns=max_turns, repeats=repeats, max_new_tokens=max_new_tokens, budget=budget, keep=keep,
        sampling=sampling, synthetic_acceptance=synthetic_acceptance, registry=registry)
    check_run_args(target, repeats, max_new_tokens)  # before the settings are written
    settings = bench_settings(target_settings(target), suite, max_new_tokens, budget, sampling)
    runners = build_runners(target, specs, [] if batch else peer_specs, sampling, registry,
                            synthetic_acceptance, budget, phase_timing)
    if batch:
        runners += [GeneratePeerBatches(target, peer, runners[0].label) for peer in peer_specs]
        settings |= {"limit": limit, "questions": len(prompts)}
    store = start_out(out, settings, fresh, CALLS if batch else REQUESTS)
    plan = batch_plan(len(prompts), sizes, repeats, chunk) if batch else request_plan(prompts, repeats)
    run = run_calls(target, prompts, runners, plan, repeats=repeats, max_new_tokens=max_new_tokens,
                    store=store, check_identity=sampling.greedy, warmup=warmup, progress=progress)
    return run, write_results(run, out, settings, limit=limit, repeats=repeats, max_turns=max_turns,
                              plots=plots, keep=keep, command=command)


def check_options(suite: str | list[BenchPrompt], methods: list[str], *, batches: list[int] | None = None,
                  chunk: int | None = None, peers: str = "all", limit: int | None = None,
                  shard: str | None = None, max_turns: int | None = None, repeats: int = 3,
                  max_new_tokens: int = 128, budget: int | str = "auto", keep: str = "all",
                  sampling: SamplingParams | None = None, synthetic_acceptance: float | None = None,
                  ray: str | None = None, registry: PluginRegistry | None = None
                  ) -> tuple[list[BenchPrompt], list[MethodSpec], list[PeerSpec]]:
    """Refuse every option of a run that can be judged without the model, so that `specframe bench`
    answers bad input before it spends seconds (or minutes, for a large model) loading one: at batch
    sizes other than [1] also the options a batch run cannot honour (`check_batch_options`), and the
    peers that cannot decode batches (`batch_peers`).

    Returns the prompts, the methods and the peers the options name."""
    registry, sampling, sizes = registry or get_registry(), sampling or SamplingParams(), batches or [1]
    batch = batched(sizes)
    if batch:
        check_batch_options(sizes, sampling=sampling, ray=ray, shard=shard,
                            synthetic_acceptance=synthetic_acceptance, max_turns=max_turns, chunk=chunk)
    prompts = select_prompts(suite, limit, shard, max_turns)
    check_counts(repeats, max_new_tokens)
    specs = resolve_methods(methods, registry, budget)
    check_keep(keep, sampling, specs, registry)
    return prompts, specs, batch_peers(peers) if batch else parse_peers(peers)


def check_keep(keep: str, sampling: SamplingParams, specs: list[MethodSpec],
               registry: PluginRegistry) -> None:
    """Refuse a `keep` (`specframe.bench.report.KEEP`) the tables cannot honour: the fastest of several
    repeats is a fair pick only when the repeats compute the same thing, with the same drafts."""
    if keep not in KEEP:
        raise ConfigurationError(f"--keep must be one of {', '.join(KEEP)}, got {keep!r}")
    if keep != "fastest":
        return
    if not sampling.greedy:
        raise ConfigurationError("--keep fastest needs greedy decoding (--temperature 0): sampled repeats "
                                 "are different samples, and the fastest of them is a biased pick")
    for spec in specs:
        if registry.get(ComponentKind.DRAFTER, spec.drafter.name).capabilities.remembers_requests:
            raise ConfigurationError(
                f"--keep fastest would flatter '{spec.label}': its drafter '{spec.drafter.name}' remembers "
                "earlier requests, so later repeats of a prompt can copy the first one's answer; run it "
                "with --repeats 1 (or in another run)")


def select_prompts(suite: str | list[BenchPrompt], limit: int | None, shard: str | None,
                   max_turns: int | None) -> list[BenchPrompt]:
    """The prompts a run covers: `--suite` cut by `--limit`, `--shard` and `--turns`."""
    prompts = load_suite(suite, limit) if isinstance(suite, str) else list(suite)
    if shard is not None:
        prompts = take_shard(prompts, shard)
    if not prompts:
        raise ConfigurationError("no prompts to benchmark: check --suite, --limit and --shard")
    if max_turns is not None:
        if max_turns < 1:
            raise ConfigurationError(f"--turns must be >= 1, got {max_turns}")
        prompts = [replace(p, turns=p.turns[:max_turns]) for p in prompts]
    return prompts


def target_settings(target: Target) -> dict:
    """The settings that come from the model and the process running it."""
    return {"model": target.name, "threads": torch.get_num_threads(), "device": str(target.device),
            "dtype": str(next(target.model.parameters()).dtype).removeprefix("torch.")}


def bench_settings(model: dict, suite: str | list[BenchPrompt], max_new_tokens: int, budget: int | str,
                   sampling: SamplingParams) -> dict:
    """What `settings.json` records: a resumed run must match it (`check_settings`)."""
    return {"model": model["model"], "suite": suite if isinstance(suite, str) else "custom",
            "max_new_tokens": max_new_tokens, "budget": budget, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": sampling.seed,
            "threads": model["threads"], "device": model["device"], "clock": clock_name(),
            "dtype": model["dtype"]}


def write_results(run: BenchRun, out: Path, settings: dict, *, repeats: int, plots: bool,
                  command: str | None = None, keep: str = "all", limit: int | None = None,
                  max_turns: int | None = None) -> dict:
    """Write the pages of a finished run under one header and, with `plots`, its plots; return its
    summary table. At B = 1: `results.json`, `results.md` and a plot per figure
    (`specframe.bench.report`); in a batch run: `batch_results.json`, `batch_results.md` and
    `batch_speedup.png` (`specframe.bench.batch_report`)."""
    command, batch = command_text(command), batched(run.sizes)
    title = f"{settings['suite']} ({settings['model']})"
    decoded = (f"first turns of {len(run.prompts)} question(s)" if batch
               else f"{turns_decoded(run.prompts)} one at a time")
    header = page_header(settings, sizes=run.sizes, decoded=decoded, repeats=repeats, keep=keep,
                         command=command)
    kept = {"repeats": repeats, "keep": keep, "command": command}
    if batch:
        table = write_batch_reports(run, out, {**settings, "batches": run.sizes, **kept}, header, keep)
    else:
        table = write_reports(run, out, {**settings, "limit": limit, "repeats": repeats, "turns": max_turns,
                                         "keep": keep, "command": command}, header, keep)
    if plots:
        from specframe.bench.plots import batch_speedup_plot, write_plots

        target = out / PLOT if batch else f"the plots in {out}"
        with writing(target, tables_kept(out / (CALLS if batch else REQUESTS).records)):
            if batch:
                batch_speedup_plot(table, out / PLOT, title=title)
            else:
                write_plots(table, out, title=title)
    return table


def turns_decoded(prompts: list[BenchPrompt]) -> str:
    """What a one-request run decoded, for its page's header: its questions and their turns."""
    turns = sum(len(p.turns) for p in prompts)
    return f"{turns} turn(s) of {len(prompts)} question(s)"


def take_shard(prompts: list[BenchPrompt], shard: str) -> list[BenchPrompt]:
    """Shard `I/N` of `prompts`: every N-th prompt from the I-th, so N processes (or machines) share a
    suite; their records merge into one directory, keyed by question (`RecordStore`)."""
    try:
        index, count = (int(x) for x in shard.split("/"))
    except ValueError:
        index = count = -1
    if not 0 <= index < count:
        raise ConfigurationError(f"--shard must be I/N with 0 <= I < N, e.g. 0/2, got {shard!r}")
    return prompts[index::count]
