"""`specframe bench`: compare methods on a prompt suite (added to the CLI app in `specframe.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specframe.kit.cli_options import (clock_option, device_option, dtype_option, model_option,
                                  phase_timing_option, set_timing, threads_option)


def bench_command(
    suite: str = typer.Option("spec-bench", help="humaneval, spec-bench, mt-bench, structured (each "
                                "prompt under its own JSON schema: see --json-schema), or a JSONL file."),
    methods: str = typer.Option("pld", help="Comma list of presets or pipeline specs "
                                "DRAFTER[+TREE[+VERIFIER[+BACKEND]]][@BUDGET], e.g. "
                                "'pld,rest(c=16)+trie+greedy@16'; 'all' = every usable preset. "
                                "The plain-decoding baseline always runs."),
    peers: str = typer.Option("all", help="Peers in the same process: all (the transformers ones), none, "
                              "or a comma list of hf-generate, hf-pld(num_tokens=10), "
                              "hf-assisted(layers=8,num_tokens=4), and, for a GGUF model with "
                              "llama-cpp-python installed, llama.cpp's own llamacpp-generate and "
                              "llamacpp-pld(num_tokens=10). Under schemas (--suite structured, "
                              "--json-schema): hf-generate and llamacpp-grammar; all = both."),
    limit: Optional[int] = typer.Option(None, help="Questions per category (default: all)."),
    turns: Optional[int] = typer.Option(None, help="Turns per question at most (default: all). At --batch "
                                        "> 1 only first turns are decoded: leave it out there."),
    shard: Optional[str] = typer.Option(None, help="I/N: only every N-th question from the I-th (0-based), "
                                        "e.g. 0/2 and 1/2 in two processes; merge their records.jsonl "
                                        "into one --out and rerun without --shard for the whole table."),
    repeats: int = typer.Option(3, help="Timed runs of every (method, question)."),
    keep: str = typer.Option("all", help="Which repeats the tables aggregate: all (mean ± std over repeats) "
                             "or fastest (each turn's fastest repeat of every method, baseline included; "
                             "greedy only). Fastest-of drops stalls of a noisy machine; drafters that "
                             "remember earlier requests (suffix) see the first repeat in later ones."),
    out: Path = typer.Option(Path("results/bench"), help="Directory for records, tables and plots."),
    model: str = model_option(),
    device: str = device_option(),
    dtype: str = dtype_option(),
    phase_timing: bool = phase_timing_option(),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Tokens to generate per turn at most."),
    budget: str = typer.Option("auto", help="Tree nodes per step for methods without '@BUDGET': N, or "
                               "'auto' / 'auto:CAP' (the subtree that pays, up to CAP nodes)."),
    synthetic_acceptance: Optional[float] = typer.Option(
        None, "--synthetic-acceptance", help="Also run a drafter accepted with this probability per token "
        "(measures the framework's own overhead)."),
    temperature: float = typer.Option(0.0, help="0 = greedy (outputs then checked against the baseline)."),
    seed: Optional[int] = typer.Option(None, help="Seed for sampled runs: repeat r samples with seed + r "
                                       "(the repeats are n samples of each question) in every method."),
    threads: Optional[int] = threads_option(),
    clock: str = clock_option(),
    plots: bool = typer.Option(True, help="Write PNG plots (needs matplotlib)."),
    fresh: bool = typer.Option(False, help="Discard earlier records in --out instead of resuming."),
    # In --ray's help, "\\[" keeps rich from reading "[ray]" as markup and dropping it.
    ray: Optional[str] = typer.Option(None, help="Run the questions as Ray work: 'local' (a Ray instance on "
                                      "this machine) or the ADDRESS of a cluster. Needs the 'ray' extra: "
                                      "pip install 'specframe\\[ray]'."),
    ray_workers: int = typer.Option(2, "--ray-workers", help="Ray actors under --ray, each with its own copy "
                                    "of the model and --threads torch threads (--threads then defaults to "
                                    "1)."),
    batch: str = typer.Option("1", "--batch", help="Rows decoded together: B, or a comma list such as "
                              "1,2,4,8,16 (a sweep in one process, with batch_speedup.png). 1 (the default) "
                              "decodes one request at a time, every turn. At B > 1 (or in a sweep) every "
                              "method and the plain baseline decode the FIRST TURN of every question, B rows "
                              "at a time with continuous batching, greedily; at auto every row's tree is "
                              "sized together for the batch; the only peer is hf-generate, B left-padded "
                              "prompts per call. Writes batch_results.md and batch_records.jsonl."),
    batch_chunk: Optional[int] = typer.Option(
        None, "--batch-chunk", help="At --batch > 1: prompts each method decodes before the next method "
        "takes its turn (default 2 B, at least 8). The methods take turns chunk by chunk so that a shared "
        "machine's drifting load falls on all of them; the speedups' intervals are taken over the chunks."),
    list_methods: bool = typer.Option(False, "--list-methods", help="Print the presets and exit."),
    json_schema: Optional[Path] = typer.Option(
        None, "--json-schema", help="Structured output: decode the first turn of every question under the "
        "JSON schema in this file. --suite structured (the shipped suite) or a JSONL file whose rows carry "
        "a \"schema\" decode each prompt under its own schema instead. Such a run is greedy, one request at "
        "a time: it reports the valid-output rate, the share identical to constrained plain decoding, "
        "tokens/s, tau and the speed over constrained plain decoding of each method and peer (peers: "
        "hf-generate, transformers' generate with the same masks, and llamacpp-grammar, llama.cpp's "
        "grammar decoding on a GGUF model; all = both, where they can run) in "
        "structured_results.md."),
) -> None:
    """Benchmark speculative methods against plain decoding and transformers, Spec-Bench style; with
    --suite structured or --json-schema, under JSON schemas (structured output)."""
    from specframe.bench.batch import parse_batches
    from specframe.terms.sampling import SamplingParams

    if list_methods:
        from specframe.plugging.registry import get_registry

        typer.echo(preset_listing(get_registry()))
        return
    sampling = SamplingParams(temperature=temperature, seed=seed)
    if structured_bench(suite, _split(methods), out, json_schema, sampling, model=model, device=device,
                        dtype=dtype, threads=threads, clock=clock, peers=peers, limit=limit,
                        repeats=repeats, max_new_tokens=max_new_tokens, budget=budget,
                        phase_timing=phase_timing, unsupported={
                            "batch": parse_batches(batch), "ray": ray, "shard": shard, "turns": turns,
                            "synthetic-acceptance": synthetic_acceptance, "keep": keep,
                            "batch-chunk": batch_chunk}):
        return
    bench_run(parse_batches(batch), suite, _split(methods), out, model=model, device=device, dtype=dtype,
              threads=threads, clock=clock, ray=ray, workers=ray_workers, sampling=sampling,
              chunk=batch_chunk, peers=peers, limit=limit, repeats=repeats, max_new_tokens=max_new_tokens,
              budget=budget, keep=keep, plots=plots, fresh=fresh, phase_timing=phase_timing, shard=shard,
              synthetic_acceptance=synthetic_acceptance, max_turns=turns)


def structured_bench(suite: str, methods: list[str], out: Path, json_schema: Path | None, sampling, *,
                     model: str, device: str, dtype: str, threads: int | None, clock: str,
                     unsupported: dict, **options) -> bool:
    """The structured-output run (`specframe.bench.structured.bench_structured`) where `suite` carries
    schemas or --json-schema names one, every option checked before the model loads; False otherwise."""
    from functools import partial

    from specframe.bench.structured import bench_structured, check_bench
    from specframe.bench.structured_suite import is_structured, read_schema
    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import load_target
    from specframe.support.paths import check_writable_dir

    schema = read_schema(json_schema)
    if not is_structured(suite, schema):
        return False
    check_bench(unsupported, sampling)
    set_timing(threads, clock, device)
    check_writable_dir(out, "--out", "pass a writable directory with --out")
    loader = partial(load_target, model, device=device, dtype=dtype, recipes=model_recipes)
    bench_structured(loader, suite, methods, out, json_schema=schema, **options)
    return True


# The options `check_options` judges before the model loads.
CHECKED = ("chunk", "peers", "limit", "shard", "max_turns", "repeats", "max_new_tokens", "budget", "keep",
           "sampling", "synthetic_acceptance")


def bench_run(sizes: list[int], suite: str, methods: list[str], out: Path, *, model: str, device: str,
              dtype: str, threads: int | None, clock: str, ray: str | None, workers: int, **options) -> None:
    """`specframe bench` at every batch size of `sizes`: every option checked before the model loads
    (`specframe.bench.harness.check_options`), then `specframe.bench.harness.run_benchmark`, or under
    --ray `specframe.bench.distributed.run_benchmark_ray` (on `workers` actors, one torch thread each
    unless --threads says); prints the results page and exits 3 on a lossless mismatch."""
    from specframe.bench.batch import batched
    from specframe.bench.harness import check_options, run_benchmark
    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import load_target
    from specframe.support.paths import check_writable_dir

    batch = batched(sizes)
    if ray is not None and not batch:
        from specframe.bench.distributed import require_ray

        require_ray()  # a clear error before anything else when Ray is missing
        threads = 1 if threads is None else threads
    set_timing(threads, clock, device)
    check_writable_dir(out, "--out", "pass a writable directory with --out")  # before loading the model
    check_options(suite, methods, batches=sizes, ray=ray, **{k: options[k] for k in CHECKED})
    if ray is not None:
        from functools import partial

        from specframe.bench.distributed import run_benchmark_ray

        load_model = partial(load_target, model, device=device, dtype=dtype, recipes=model_recipes)
        options.pop("chunk")
        run, _ = run_benchmark_ray(load_model, suite, methods, out, address=ray, workers=workers,
                                   threads=threads, **options)
    else:
        target = load_target(model, device=device, dtype=dtype, recipes=model_recipes)
        run, _ = run_benchmark(target, suite, methods, out, batches=sizes, **options)
    prefix, plots = ("batch_", "batch_speedup.png") if batch else ("", "*.png")
    report_written(run, out, f"{prefix}results.md", f"{prefix}records.jsonl, {prefix}results.json, "
                   f"{prefix}results.md" + (f", {plots}" if options["plots"] else ""))


def report_written(run, out: Path, results: str, written: str) -> None:
    """Print the results page `out / results` and the list of files `written`; exit with status 3 on a
    lossless mismatch."""
    typer.echo((out / results).read_text("utf-8"))
    typer.echo(f"written under {out}: {written}")
    if run.mismatches:
        typer.secho(f"{len(run.mismatches)} LOSSLESS MISMATCH(ES): see {out / results}", fg="red", err=True)
        raise typer.Exit(3)


def preset_listing(registry) -> str:
    """The presets as aligned columns: name, pipeline spec, whether its plugins are installed, its plugin."""
    from specframe.bench.methods import usable_presets

    usable = usable_presets(registry)
    rows = [("preset", "pipeline", "status", "plugin")]
    rows += [(name, preset.spec, "usable" if name in usable else "missing components",
              registry.presets.owner(name)) for name, preset in registry.presets.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in rows)


def _split(methods: str) -> list[str]:
    from specframe.bench.methods import split_parts

    return [m for m in split_parts(methods, ",") if m]
