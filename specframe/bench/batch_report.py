"""The tables of a batch run (`specframe bench --batch`): `batch_results.json`, `batch_results.md` and the
plot `batch_speedup.png`.

Per method and batch size B: throughput = new tokens of all rows / seconds of all its calls, one call per
chunk of the suite (for `hf-generate`, of all its calls); latency = each row's own seconds
(`GenerationResult.metrics.wall_s`: its admission to its end; for `hf-generate`, its call's), mean and
90th percentile over the rows; tau = (accepted draft tokens + steps) / steps over all rows; draft and
forward ms per batched step, from the calls' own time split (`specframe.decode.batch.BatchMetrics`: the
rows' drafting summed, the shared forward once); speedups = throughput over the plain baseline's through
the same backend, and over `hf-generate`'s, at the same B and repeat, with a 95 % bootstrap interval over
the chunks (`ratio_interval`). Throughputs and speedups are the mean ± std over repeats (`keep="all"`) or
come from each runner's fastest repeat (`keep="fastest"`).

Why these are not the one-request tables' statistics (`specframe.bench.report`): a request alone is its
own unit, so those average per-turn rates and ratios by category (as Spec-Bench reports); a batched
call's rows share every step and none has a rate of its own, so here tokens and seconds are pooled over
the calls, and the interval is over chunks. Both come out of one loop and one record store
(`specframe.bench.loop`); a B = 1 run summarised here would pool where the one-request pages average.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

from specframe.bench.report import (control_line, control_of, mean_std, outline, per_step_ms, stat_cell,
                                    write_pages)
from specframe.bench.loop import BenchRun
from specframe.bench.store import CALLS

RESULTS_JSON, RESULTS_MD, PLOT = "batch_results.json", "batch_results.md", "batch_speedup.png"
COLUMNS = ("method", "B", "tokens/s", "mean latency s", "p90 latency s", "tau", "draft ms/step",
           "forward ms/step", "x plain batched", "x hf-generate", "outputs")
# The speedups' intervals: percentile bootstrap over chunks. At 2000 draws their ends move by under 1 % of
# the speedup from one seed to another (20 seeds, 3 to 10 chunks); the seed is fixed, so a table is
# rendered the same twice.
DRAWS, LEVEL, SEED = 2000, 0.95, 0


def kept(records: dict[int, dict], keep: str) -> dict:
    """The repeats a table aggregates, by repeat: all, or only the fastest (keyed `fastest`, so that it
    pairs with another runner's fastest whatever repeat that was)."""
    if keep != "fastest" or not records:
        return records
    return {"fastest": max(records.values(), key=lambda r: r["metrics"]["tokens_per_s"])}


def merge_chunks(records: list[dict]) -> dict:
    """One (method, B, repeat)'s records, one per chunk, as one record: the rows in suite order, the
    metrics summed (tokens/s = all new tokens over all seconds, not a mean of the chunks' rates; the time
    split only when every chunk has one), and under `chunks` each chunk's (new tokens, seconds) by its
    question ids, for pairing with another method's on the same chunk (`ratio_interval`)."""
    records = sorted(records, key=lambda r: r.get("chunk", 0))
    metrics = [r["metrics"] for r in records]
    wall, total = sum(m["wall_s"] for m in metrics), sum(m["new_tokens"] for m in metrics)
    summed = {"wall_s": wall, "new_tokens": total, "tokens_per_s": total / wall if wall > 0 else 0.0,
              "latency_s": [s for m in metrics for s in m["latency_s"]],
              "steps": sum(m["steps"] for m in metrics),
              "accepted_draft_tokens": sum(m["accepted_draft_tokens"] for m in metrics),
              "batch_steps": None, "time_s": None}
    if all(m.get("time_s") is not None for m in metrics):
        summed["batch_steps"] = sum(m["batch_steps"] for m in metrics)
        summed["time_s"] = {k: sum(m["time_s"].get(k, 0.0) for m in metrics) for k in metrics[0]["time_s"]}
    return {"method": records[0]["method"], "batch": records[0]["batch"], "repeat": records[0]["repeat"],
            "tokens": [row for r in records for row in r["tokens"]], "metrics": summed,
            "chunks": {tuple(r["qids"]): (r["metrics"]["new_tokens"], r["metrics"]["wall_s"])
                       for r in records}}


def speedup(mine: dict, other: dict) -> dict | None:
    """Throughput of `mine` over `other`, repeat by repeat (the fastest with the fastest)."""
    return mean_std([mine[k]["metrics"]["tokens_per_s"] / other[k]["metrics"]["tokens_per_s"]
                     for k in mine if k in other and other[k]["metrics"]["tokens_per_s"] > 0])


def pooled_ratio(units: list[tuple[int, float, int, float]]) -> float | None:
    """Throughput over the other's on the chunks `units` ((new tokens, seconds, the other's new tokens,
    the other's seconds) each): all new tokens over all seconds on either side."""
    tokens, seconds, other_tokens, other_seconds = (sum(u[i] for u in units) for i in range(4))
    if seconds <= 0 or other_tokens <= 0 or other_seconds <= 0:
        return None
    return (tokens / seconds) / (other_tokens / other_seconds)


def ratio_interval(mine: dict, other: dict, draws: int = DRAWS, seed: int = SEED) -> list[float] | None:
    """The 95 % percentile bootstrap interval of `mine`'s throughput over `other`'s: the chunks both
    decoded (in every repeat both kept) drawn with replacement, a chunk's seconds staying paired with the
    other's on the same chunk, each draw's ratio pooled (`pooled_ratio`). It holds the load's drift from
    chunk to chunk and the chunks' own spread of speedup: speedups that differ by less cannot be told
    apart on this suite. None under two chunks."""
    units = [(*a["chunks"][q], *other[k]["chunks"][q]) for k, a in mine.items() if k in other
             for q in a["chunks"] if q in other[k]["chunks"]]
    if len(units) < 2:
        return None
    rng = random.Random(seed)
    ratios = sorted(r for r in (pooled_ratio(rng.choices(units, k=len(units))) for _ in range(draws))
                    if r is not None)
    if not ratios:
        return None
    tail = (1 - LEVEL) / 2
    return [ratios[round(tail * (len(ratios) - 1))], ratios[round((1 - tail) * (len(ratios) - 1))]]


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank): the latency nine rows in ten stay under."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def differing_rows(mine: dict, base: dict) -> tuple[int, int]:
    """(rows whose tokens differ from the baseline's, rows compared), over the kept repeats."""
    pairs = [(a, b) for k in mine if k in base for a, b in zip(mine[k]["tokens"], base[k]["tokens"])]
    return sum(a != b for a, b in pairs), len(pairs)


def row_stats(mine: dict, base: dict | None, peer: dict | None, is_peer: bool = False) -> dict:
    """The table row of one runner at one batch size from its records merged by repeat (`merge_chunks`);
    `base` is its baseline's (None for a baseline), `peer` hf-generate's (None without the peer);
    `is_peer` when the runner is hf-generate itself."""
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
            "speedup_plain_interval": ratio_interval(mine, base) if base is not None else None,
            "speedup_hf_interval": ratio_interval(mine, peer) if peer and not is_peer else None,
            "time_per_step_ms": per_step_ms(metrics, sum(m.get("batch_steps") or 0 for m in metrics)),
            "chunks": max(len(r["chunks"]) for r in mine.values()),
            "new_tokens": sum(m["new_tokens"] for m in metrics), "repeats": len(metrics),
            "rows_differing": differ, "rows_compared": rows}


def summarize(run: BenchRun, keep: str = "all") -> dict[int, dict[str, dict]]:
    """{B: {method: stats}} (`row_stats`), runners in their run order."""
    parts: dict[tuple, dict[int, list[dict]]] = {}
    for record in run.records:
        by_repeat = parts.setdefault((record["method"], record["batch"]), {})
        by_repeat.setdefault(record["repeat"], []).append(record)
    by = {key: {rep: merge_chunks(chunks) for rep, chunks in reps.items()} for key, reps in parts.items()}
    hf = run.peer
    table: dict[int, dict[str, dict]] = {}
    for size in run.sizes:
        peer = kept(by.get((hf, size), {}), keep) if hf else None
        table[size] = {}
        for runner in run.runners:
            mine = kept(by.get((runner.label, size), {}), keep)
            if mine:
                base = kept(by.get((runner.baseline, size), {}), keep) if runner.baseline else None
                table[size][runner.label] = {**row_stats(mine, base, peer, runner.label == hf),
                                             "baseline": runner.baseline}
    return table


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _speedup(stat: dict | None, interval: list[float] | None) -> str:
    """A speedup cell: mean (± std over repeats), then its interval over chunks in brackets."""
    return stat_cell(stat) + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def _ms(stats: dict, phase: str) -> str:
    return _num((stats.get("time_per_step_ms") or {}).get(phase), 1)


def half_width(interval: list[float] | None) -> float | None:
    """An interval's half width over its middle: [0.9, 1.1] is ±10 %."""
    return (interval[1] - interval[0]) / (interval[1] + interval[0]) if interval else None


def chunking(prompts: int, chunks: dict[int, int]) -> str:
    """How the suite's `prompts` were cut at each B (`chunks`: prompts per chunk), in words."""
    def cut(per: int) -> str:
        count, last = math.ceil(prompts / per), prompts % per
        if count == 1:
            return f"one chunk of {prompts} prompt(s)"
        return f"{count} chunks of {per} prompts" + (f", the last of {last}" if last else "")

    return "; ".join(f"{cut(n)} at B = {b}" for b, n in chunks.items())


def noise_line(table: dict[int, dict[str, dict]], run: BenchRun) -> str:
    """The noise this run measured: the widest bootstrap interval (`ratio_interval`) of a speedup over
    plain batched and over hf-generate, as ± % of the speedup; without one (one chunk, one repeat kept),
    that none was measured and how to measure it."""
    sizes = chunking(len(run.prompts), run.chunks)
    names = {"speedup_plain": "over plain batched", "speedup_hf": "over hf-generate"}
    # a speedup of a runner over itself measures nothing: a baseline's over plain, hf-generate's over itself
    rows = {"speedup_plain": [s for stats in table.values() for s in stats.values() if s["baseline"]],
            "speedup_hf": [s for stats in table.values() for label, s in stats.items() if label != run.peer]}
    widths = {key: [w for s in rows[key] if (w := half_width(s.get(f"{key}_interval"))) is not None]
              for key in names}
    if any(widths.values()):
        parts = [f"±{100 * max(w):.1f} % {names[key]}" for key, w in widths.items() if w]
        return (f"*Noise*: the methods take turns chunk by chunk ({sizes}); [lo, hi] is a "
                f"speedup's 95 % bootstrap interval over its timed chunks, those of every repeat kept (drawn "
                f"with replacement, paired with the other method's seconds on the same chunk), at widest "
                f"{' and '.join(parts)}: read differences inside it as noise.")
    return (f"*Noise*: not measured: {sizes}, and one repeat kept per method and B, so no speedup has an "
            "interval, and this table cannot tell a small difference from the machine's noise. "
            "To measure it, decode at least two chunks (more questions with --limit, or a smaller "
            "--batch-chunk) or pass --repeats 2 or more.")


def outputs_cell(stats: dict, lossless: bool) -> str:
    """Whether a runner's rows equal its baseline's: a lossless method's differences are mismatches, the
    peer's are counted (its padded rows may round differently)."""
    if stats["baseline"] is None:
        return "baseline"
    differ, rows = stats["rows_differing"], stats["rows_compared"]
    if not differ:
        return "identical"
    return f"MISMATCH: {differ} of {rows} rows" if lossless else f"{differ} of {rows} rows differ"


def markdown(table: dict[int, dict[str, dict]], run: BenchRun, header: str = "") -> str:
    """The table of every (method, B), a method x B table of speedups for a sweep, then the mismatches."""
    lossless = {r.label: r.lossless for r in run.runners}
    lines = [header] if header else []
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for label in dict.fromkeys(label for rows in table.values() for label in rows):
        for size, rows in table.items():
            s = rows.get(label)
            if s is not None:
                cells = [label, str(size), stat_cell(s["tokens_per_s"], 1), _num(s["latency_mean_s"]),
                         _num(s["latency_p90_s"]), _num(s["tau"]), _ms(s, "draft"), _ms(s, "forward"),
                         _speedup(s["speedup_plain"], s.get("speedup_plain_interval")),
                         _speedup(s["speedup_hf"], s.get("speedup_hf_interval")),
                         outputs_cell(s, lossless[label])]
                lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "*tokens/s*: new tokens of all rows over the seconds of all the batched calls, one per "
              "chunk of the suite; *latency*: each request's seconds from its admission to its end "
              "(hf-generate: its call's); *tau*: tokens per row per step, (accepted + steps) / steps; "
              "*draft / forward ms/step*: per batched step, the drafting of all its rows summed and the one "
              "forward that scores them (hf-generate: not split); *x plain batched*: throughput over plain "
              "decoding through the same backend at the same B; *x hf-generate*: over transformers' own "
              "batched generate, B left-padded prompts per call.", "", noise_line(table, run), ""]
    control = control_of(run.runners)
    lines += [control_line(control, {b: (rows[control]["speedup_plain"] or {}).get("mean")
                                     for b, rows in table.items() if control in rows}, "batch sizes"), ""]
    if len(table) > 1:
        lines += sweep_table(table)
    if run.mismatches:
        lines += ["### Lossless mismatches", ""] + [f"- batch {m.batch}: {m.describe()}"
                                                   for m in run.mismatches] + [""]
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


def write_batch_reports(run: BenchRun, out: Path, settings: dict, header: str = "",
                        keep: str = "all") -> dict:
    """Write `batch_results.json` (settings, table, mismatches, records) and `batch_results.md`; return
    the table."""
    table = summarize(run, keep)
    payload = {"settings": {**settings, "chunk_prompts": {str(b): n for b, n in run.chunks.items()}},
               "methods": [outline(r) for r in run.runners],
               "batches": {str(size): rows for size, rows in table.items()},
               "mismatches": [vars(m) for m in run.mismatches],
               "records": run.records}
    write_pages(out, {RESULTS_JSON: json.dumps(payload, indent=1), RESULTS_MD: markdown(table, run, header)},
                out / CALLS.records)
    return table
