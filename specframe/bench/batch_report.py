"""The tables of a batch run (`specframe bench --batch`): `batch_results.json`, `batch_results.md` and the
plot `batch_speedup.png`.

Per method and batch size B: throughput = new tokens of all rows / seconds of the whole call (for
`hf-generate`, of all its calls); latency = each row's own seconds (`GenerationResult.metrics.wall_s`: its
admission to its end; for `hf-generate`, its call's), mean and 90th percentile over the rows; tau =
(accepted draft tokens + steps) / steps over all rows; speedups = throughput over the plain baseline's
through the same backend, and over `hf-generate`'s, at the same B and repeat. Throughputs and speedups are
the mean ± std over repeats (`keep="all"`) or come from each runner's fastest repeat (`keep="fastest"`).
"""

from __future__ import annotations

import json
import math
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specframe.support.atomic_dirs import write_atomically

from specframe.support.prompt_suites import BenchPrompt

from specframe.bench.runner import Mismatch, bench_lock

RESULTS_JSON, RESULTS_MD, PLOT = "batch_results.json", "batch_results.md", "batch_speedup.png"
COLUMNS = ("method", "B", "tokens/s", "mean latency s", "p90 latency s", "tau", "x plain batched",
           "x hf-generate", "outputs")


@dataclass
class BatchRun:
    """What a finished batch run (`specframe.bench.batch.run_batches`) hands to the reports."""

    records: list[dict]
    runners: list
    prompts: list[BenchPrompt]
    sizes: list[int]
    peer: str | None = None  # the label of transformers' batched generate, when it ran
    mismatches: list[tuple[int, Mismatch]] = field(default_factory=list)  # (B, the first differing row)


def kept(records: dict[int, dict], keep: str) -> dict:
    """The repeats a table aggregates, by repeat: all, or only the fastest (keyed `fastest`, so that it
    pairs with another runner's fastest whatever repeat that was)."""
    if keep != "fastest" or not records:
        return records
    return {"fastest": max(records.values(), key=lambda r: r["metrics"]["tokens_per_s"])}


def mean_std(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def speedup(mine: dict, other: dict) -> dict | None:
    """Throughput of `mine` over `other`, repeat by repeat (the fastest with the fastest)."""
    return mean_std([mine[k]["metrics"]["tokens_per_s"] / other[k]["metrics"]["tokens_per_s"]
                     for k in mine if k in other and other[k]["metrics"]["tokens_per_s"] > 0])


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank): the latency nine rows in ten stay under."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def differing_rows(mine: dict, base: dict) -> tuple[int, int]:
    """(rows whose tokens differ from the baseline's, rows compared), over the kept repeats."""
    pairs = [(a, b) for k in mine if k in base for a, b in zip(mine[k]["tokens"], base[k]["tokens"])]
    return sum(a != b for a, b in pairs), len(pairs)


def row_stats(mine: dict, base: dict | None, peer: dict | None) -> dict:
    """The table row of one runner at one batch size; `base` is its baseline's records (None for a
    baseline), `peer` hf-generate's (None without the peer)."""
    metrics = [r["metrics"] for r in mine.values()]
    latency = [s for m in metrics for s in m["latency_s"]]
    steps = sum(m["steps"] for m in metrics)
    differ, rows = differing_rows(mine, base) if base is not None else (0, 0)
    return {"tokens_per_s": mean_std([m["tokens_per_s"] for m in metrics]),
            "latency_mean_s": statistics.fmean(latency) if latency else None,
            "latency_p90_s": p90(latency) if latency else None,
            "tau": (sum(m["accepted_draft_tokens"] for m in metrics) + steps) / steps if steps else None,
            "speedup_plain": speedup(mine, base) if base is not None else mean_std([1.0]),
            "speedup_hf": speedup(mine, peer) if peer else None,
            "new_tokens": sum(m["new_tokens"] for m in metrics), "repeats": len(metrics),
            "rows_differing": differ, "rows_compared": rows}


def summarize(run: BatchRun, keep: str = "all") -> dict[int, dict[str, dict]]:
    """{B: {method: stats}} (`row_stats`), runners in their run order."""
    by: dict[tuple, dict] = {}
    for record in run.records:
        by.setdefault((record["method"], record["batch"]), {})[record["repeat"]] = record
    hf = run.peer
    table: dict[int, dict[str, dict]] = {}
    for size in run.sizes:
        peer = kept(by.get((hf, size), {}), keep) if hf else None
        table[size] = {}
        for runner in run.runners:
            mine = kept(by.get((runner.label, size), {}), keep)
            if mine:
                base = kept(by.get((runner.baseline, size), {}), keep) if runner.baseline else None
                table[size][runner.label] = {**row_stats(mine, base, peer), "baseline": runner.baseline}
    return table


def _stat(stat: dict | None, digits: int = 2) -> str:
    if stat is None:
        return "-"
    mean = f"{stat['mean']:.{digits}f}"
    return f"{mean} ± {stat['std']:.{digits}f}" if stat["std"] else mean


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def outputs_cell(stats: dict, lossless: bool) -> str:
    """Whether a runner's rows equal its baseline's: a lossless method's differences are mismatches, the
    peer's are counted (its padded rows may round differently)."""
    if stats["baseline"] is None:
        return "baseline"
    differ, rows = stats["rows_differing"], stats["rows_compared"]
    if not differ:
        return "identical"
    return f"MISMATCH: {differ} of {rows} rows" if lossless else f"{differ} of {rows} rows differ"


def markdown(table: dict[int, dict[str, dict]], run: BatchRun, header: str = "") -> str:
    """The table of every (method, B), a method x B table of speedups for a sweep, then the mismatches."""
    lossless = {r.label: r.lossless for r in run.runners}
    lines = [header] if header else []
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for label in dict.fromkeys(label for rows in table.values() for label in rows):
        for size, rows in table.items():
            s = rows.get(label)
            if s is not None:
                cells = [label, str(size), _stat(s["tokens_per_s"], 1), _num(s["latency_mean_s"]),
                         _num(s["latency_p90_s"]), _num(s["tau"]), _stat(s["speedup_plain"]),
                         _stat(s["speedup_hf"]), outputs_cell(s, lossless[label])]
                lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "*tokens/s*: new tokens of all rows over the seconds of the whole batched call; *latency*: "
              "each request's seconds from its admission to its end (hf-generate: its call's); *tau*: tokens "
              "per row per step, (accepted + steps) / steps; *x plain batched*: throughput over plain "
              "decoding through the same backend at the same B; *x hf-generate*: over transformers' own "
              "batched generate, B left-padded prompts per call.", ""]
    if len(table) > 1:
        lines += sweep_table(table)
    if run.mismatches:
        lines += ["### Lossless mismatches", ""] + [f"- batch {size}: {m.describe()}"
                                                   for size, m in run.mismatches] + [""]
    return "\n".join(lines)


def sweep_table(table: dict[int, dict[str, dict]]) -> list[str]:
    """Method x B: throughput, speedup over plain batched and over hf-generate, in one cell each."""
    sizes = list(table)
    lines = ["### tokens/s (x plain batched, x hf-generate) by batch size", "",
             "| method | " + " | ".join(f"B={b}" for b in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for label in dict.fromkeys(label for rows in table.values() for label in rows):
        cells = []
        for size in sizes:
            s = table[size].get(label)
            cells.append("-" if s is None else f"{_num(s['tokens_per_s']['mean'], 1)} "
                         f"({_num((s['speedup_plain'] or {}).get('mean'))}x, "
                         f"{_num((s['speedup_hf'] or {}).get('mean'))}x)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def write_batch_results(run: BatchRun, out: Path, settings: dict, *, repeats: int, plots: bool,
                        keep: str = "all", command: str | None = None) -> dict:
    """Write `batch_results.json` (settings, table, mismatches, records), `batch_results.md` and, with
    `plots`, `batch_speedup.png`; return the table."""
    command = command or "specframe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    kept_text = f"the fastest of {repeats} repeat(s)" if keep == "fastest" else f"{repeats} repeat(s)"
    header = (f"## {settings['suite']}, batched: {settings['model']}, first turns of {len(run.prompts)} "
              f"question(s), {settings['max_new_tokens']} new tokens, B = {', '.join(map(str, run.sizes))}, "
              f"{kept_text}, greedy, {settings['device']}, {settings['dtype']}, "
              f"{settings['threads']} torch thread(s), {settings['clock']} clock\n\nCommand: `{command}`\n")
    table = summarize(run, keep)
    payload = {"settings": {**settings, "batches": run.sizes, "repeats": repeats, "keep": keep,
                            "command": command},
               "methods": [{"label": r.label, "baseline": r.baseline, "lossless": r.lossless,
                            "kind": type(r).__name__} for r in run.runners],
               "batches": {str(size): rows for size, rows in table.items()},
               "mismatches": [{"batch": size, **vars(m)} for size, m in run.mismatches],
               "records": run.records}
    with bench_lock(out):
        write_atomically(out / RESULTS_JSON, json.dumps(payload, indent=1))
        write_atomically(out / RESULTS_MD, markdown(table, run, header))
    if plots:
        from specframe.bench.plots import batch_speedup_plot

        batch_speedup_plot(table, out / PLOT, title=f"{settings['suite']} ({settings['model']})")
    return table
