"""Aggregates of a benchmark run, written as `results.json` and a markdown table per category.

Definitions (`docs/explanation/metrics-and-costs.md`): speedup = mean over turns of (tokens/s of the
method) / (tokens/s of its baseline on the same turn and repeat), prefill included, and again with the
prefill excluded; tokens/s = mean over turns of each turn's tokens/s;
tau = tokens emitted / verification steps; alpha = accepted draft tokens / draft tokens. Speedups and
tokens/s are computed per repeat, then reported as mean and standard deviation over repeats
(`keep="all"`), or from each turn's fastest repeat of every method, baseline included
(`keep="fastest"`: a stall of the machine during one repeat then no longer reaches the tables).
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
from pathlib import Path

from specframe.support.atomic_dirs import write_atomically
from specframe.bench.loop import BenchRun
from specframe.bench.store import REQUESTS, bench_lock, tables_kept, writing

OVERALL = "overall"
KEEP = ("all", "fastest")  # which repeats the tables aggregate: see the module docstring
SLOW = 0.9  # a turn slower than this share of its baseline counts as slow ("prompts below 0.9x")


def mean_std(values: list[float]) -> dict | None:
    """Mean and standard deviation of one figure over repeats (a one-request or a batch table's cell),
    None without a value."""
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def per_step_ms(metrics: list[dict], steps: int) -> dict[str, float] | None:
    """Milliseconds per step by phase over the records' time splits (`time_s`: seconds by phase, of one
    request or of one batched call, whose steps are batched steps), None when a record has no split (the
    peers, or a run with --no-phase-timing) or there were no steps."""
    if not steps or any(m.get("time_s") is None for m in metrics):
        return None
    return {k: 1000 * sum(m["time_s"].get(k, 0.0) for m in metrics) / steps for k in metrics[0]["time_s"]}


def method_stats(records: list[dict], base: dict[tuple, dict] | None) -> dict:
    """Aggregates of one method's records over one category; `base` maps (qid, turn, repeat) to the
    baseline's record (None for a baseline itself)."""
    repeats = sorted({r["repeat"] for r in records})
    speed, speed_decode, tps, tps_decode = [], [], [], []
    for rep in repeats:
        mine = [r for r in records if r["repeat"] == rep]
        m = [r["metrics"] for r in mine]
        tps.append(statistics.fmean(x["tokens_per_s"] for x in m))
        tps_decode.append(statistics.fmean(x["decode_tokens_per_s"] for x in m))
        if base is None:
            speed.append(1.0)
            speed_decode.append(1.0)
            continue
        pairs = [(r["metrics"], base[(r["qid"], r["turn"], rep)]["metrics"]) for r in mine
                 if (r["qid"], r["turn"], rep) in base]
        speed.append(statistics.fmean(a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs
                                      if b["tokens_per_s"]) if pairs else float("nan"))
        speed_decode.append(statistics.fmean(a["decode_tokens_per_s"] / b["decode_tokens_per_s"]
                                             for a, b in pairs if b["decode_tokens_per_s"])
                            if pairs else float("nan"))
    metrics = [r["metrics"] for r in records]
    steps = sum(x["steps"] for x in metrics)
    drafted = [x["draft_tokens"] for x in metrics]
    alpha = (sum(x["accepted_draft_tokens"] for x in metrics) / sum(drafted)
             if None not in drafted and sum(drafted) else None)
    histogram: list[int] = []
    for x in metrics:
        for j, count in enumerate(x["acceptance_histogram"]):
            histogram += [0] * (j + 1 - len(histogram))
            histogram[j] += count
    paired = [(r, base.get((r["qid"], r["turn"], r["repeat"]))) for r in records] if base is not None else []
    slow = [r for r, b in paired if b is not None
            and r["metrics"]["tokens_per_s"] < SLOW * b["metrics"]["tokens_per_s"]]
    return {
        "turns": len({(r["qid"], r["turn"]) for r in records}), "repeats": len(repeats),
        "speedup": mean_std(speed), "speedup_excl_prefill": mean_std(speed_decode),
        "tokens_per_s": mean_std(tps), "decode_tokens_per_s": mean_std(tps_decode),
        "tau": sum(x["new_tokens"] for x in metrics) / steps if steps else None, "alpha": alpha,
        "new_tokens": sum(x["new_tokens"] for x in metrics), "steps": steps,
        "prefill_s": sum(x["prefill_s"] for x in metrics), "wall_s": sum(x["wall_s"] for x in metrics),
        "acceptance_histogram": histogram, "time_per_step_ms": per_step_ms(metrics, steps),
        "peak_memory_bytes": max(x["peak_memory_bytes"] for x in metrics),
        "mean_tree_size": sum(x["draft_tokens"] or 0 for x in metrics) / steps if steps else None,
        "slow_turns": len(slow) / len(records) if base is not None else None,
        "drafted_per_accepted": (sum(drafted) / sum(x["accepted_draft_tokens"] for x in metrics)
                                 if alpha else None),
        "drafter_stats": next((r["metrics"]["drafter_stats"] for r in reversed(records)
                               if r["metrics"].get("drafter_stats")), None),  # after the last request
        **predictions(metrics),
    }


def predictions(metrics: list[dict]) -> dict:
    """Predicted vs realised tokens per step and step time (budget="auto"), over the predicted steps."""
    n = sum(x.get("predicted_steps") or 0 for x in metrics)

    def mean(key: str) -> float | None:
        return sum((x.get(key) or 0) * (x.get("predicted_steps") or 0) for x in metrics) / n if n else None

    return {"predicted_steps": n, "drafting_skipped": sum(x.get("drafting_skipped") or 0 for x in metrics),
            **{k: mean(k) for k in ("predicted_tokens_per_step", "realised_tokens_per_step",
                                    "predicted_step_ms", "realised_step_ms")}}


def complete_questions(records: list[dict], methods: list[str] | None = None) -> list[dict]:
    """The records of the questions on which every method (`methods`, by default every one in `records`)
    ran every repeat of every turn the question has: what a run stopped part way can compare like with
    like. The repeats are those of the whole run, so a question cut between two repeats is left out."""
    methods = methods or list(dict.fromkeys(r["method"] for r in records))
    repeats = {r["repeat"] for r in records}
    done: dict[str, set] = {}
    for r in records:
        done.setdefault(r["qid"], set()).add((r["method"], r["turn"], r["repeat"]))
    complete = {q for q, runs in done.items()
                if runs >= {(m, t, k) for m in methods for t in {t for _, t, _ in runs} for k in repeats}}
    return [r for r in records if r["qid"] in complete]


def fastest_repeats(records: list[dict]) -> list[dict]:
    """One record per (method, question, turn): the repeat with the most tokens/s, relabelled repeat 0.
    Greedy repeats compute the same tokens, so the fastest one is the run least disturbed by the machine
    (the reasoning of `timeit`'s minimum); the baseline's turns are taken the same way."""
    best: dict[tuple, dict] = {}
    for record in records:
        key = (record["method"], record["qid"], record["turn"])
        if key not in best or record["metrics"]["tokens_per_s"] > best[key]["metrics"]["tokens_per_s"]:
            best[key] = record
    return [{**record, "repeat": 0} for record in best.values()]


def summarize(run: BenchRun, keep: str = "all") -> dict:
    """{category: {method: stats}} with an `overall` category, in the runners' order; `keep` chooses
    which repeats count (`KEEP`)."""
    by_method: dict[str, list[dict]] = {r.label: [] for r in run.runners}
    for record in fastest_repeats(run.records) if keep == "fastest" else run.records:
        by_method[record["method"]].append(record)
    categories = [OVERALL] + list(dict.fromkeys(p.category for p in run.prompts))
    if len(categories) == 2:
        categories = categories[1:]  # one category: its table is the overall one
    table: dict[str, dict] = {}
    for category in categories:
        table[category] = {}
        for runner in run.runners:
            mine = [r for r in by_method[runner.label] if category in (OVERALL, r["category"])]
            if not mine:
                continue
            base = None
            if runner.baseline is not None:
                base = {(r["qid"], r["turn"], r["repeat"]): r for r in by_method[runner.baseline]}
            stats = method_stats(mine, base)
            stats["mismatches"] = sum(1 for m in run.mismatches if m.method == runner.label
                                      and category in (OVERALL, m.category))
            table[category][runner.label] = stats
    return table


def stat_cell(stat: dict | None, digits: int = 2) -> str:
    """A table cell of `mean_std`'s figure: the mean, ± the std when there is a spread."""
    if stat is None or stat["mean"] is None:
        return "-"
    mean = f"{stat['mean']:.{digits}f}"
    return f"{mean} ± {stat['std']:.{digits}f}" if stat["std"] else mean


TABLE_NOTE = (
    "*speedup over*: the plain decoding each row is timed against, on the same turns and repeats: "
    "`baseline` through the default backend, `baseline[NAME]` through the backend NAME (a method is timed "
    "against plain decoding through its own backend; llama.cpp's own decoding against `baseline[llamacpp]` "
    "where a method uses that backend); *speedup*: the row's tokens/s over that baseline's, mean over "
    "turns; *tau*: tokens emitted per verification step, the target's bonus token included (new tokens "
    "over all steps, plain steps too); *alpha*: accepted over drafted tokens.")


def markdown(table: dict, run: BenchRun, header: str = "") -> str:
    """One markdown table per category (overall first), then the noise floor (`control_line`) and the
    mismatch list."""
    lossless = {r.label: (r.baseline is None or r.lossless) for r in run.runners}
    baseline = {r.label: r.baseline for r in run.runners}
    lines = [header] if header else []
    for category, rows in table.items():
        lines += [f"### {category}", "",
                  "| method | speedup over | speedup | speedup excl. prefill | tau | alpha | tokens/s "
                  "| tokens/s excl. prefill | identical to baseline |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for label, s in rows.items():
            ident = ("n/a" if not lossless[label] else "not checked (sampled)" if not run.identity_checked
                     else f"MISMATCH x{s['mismatches']}" if s["mismatches"] else "yes")
            alpha = "-" if s["alpha"] is None else f"{s['alpha']:.2f}"
            tau = "-" if s["tau"] is None else f"{s['tau']:.2f}"
            cells = [label, baseline[label] or "-", stat_cell(s["speedup"]),
                     stat_cell(s["speedup_excl_prefill"]), tau, alpha, stat_cell(s["tokens_per_s"], 1),
                     stat_cell(s["decode_tokens_per_s"], 1), ident]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", TABLE_NOTE, ""]
        lines += adaptive_table(rows)
    control = control_of(run.runners)
    lines += [control_line(control, {c: rows[control]["speedup"]["mean"] for c, rows in table.items()
                                     if control in rows}, "categories"), ""]
    if run.mismatches:
        lines += ["### Lossless mismatches", ""] + [f"- {m.describe()}" for m in run.mismatches] + [""]
    return "\n".join(lines)


def control_of(runners: list) -> str | None:
    """The label of the run's control, plain decoding run as a method (`PipelineRunner.control`: drafter
    `none`, timed apart from the baseline it decodes exactly like), None without one."""
    return next((r.label for r in runners if getattr(r, "control", False)), None)


def control_line(control: str | None, speedups: dict, where: str) -> str:
    """The noise floor, one-request or batched alike: the control's distance from a speedup of one, its
    speedup in each of `speedups` (by category, or by B); without a control, how to measure it."""
    values = [v for v in speedups.values() if v is not None]
    if control is None or not values:
        return ("*Noise floor*: not measured: no control ran. Add plain decoding as a method (`none@1`) to "
                "--methods: its distance from 1.00x is the noise of the machine, not of any method.")
    low, high = min(values), max(values)
    spread = f"{low:.2f}-{high:.2f}x across {where}" if len(values) > 1 else f"{low:.2f}x"
    return (f"*Noise floor*: `{control}` decodes exactly like its baseline and measured {spread}: read "
            f"differences within ±{100 * max(abs(low - 1), abs(high - 1)):.1f} % of 1.00x as noise.")


def adaptive_table(rows: dict) -> list[str]:
    """Tree sizes, slow turns and, for `auto` budgets, predicted against realised tokens and step time."""
    def num(value, digits=2, scale=1.0):
        return "-" if value is None else f"{value * scale:.{digits}f}"

    lines = ["| method | mean tree | drafted per accepted | turns < 0.9x | tokens/step predicted / realised "
             "| step ms predicted / realised | drafting skipped | drafter memory |",
             "|---|---|---|---|---|---|---|---|"]
    for label, s in rows.items():
        if s.get("slow_turns") is None:
            continue
        lines.append(f"| {label} | {num(s['mean_tree_size'], 1)} | {num(s.get('drafted_per_accepted'), 1)} "
                     f"| {num(s['slow_turns'], 0, 100)} % "
                     f"| {num(s['predicted_tokens_per_step'])} / {num(s['realised_tokens_per_step'])} "
                     f"| {num(s['predicted_step_ms'], 1)} / {num(s['realised_step_ms'], 1)} "
                     f"| {s['drafting_skipped']} | {memory(s.get('drafter_stats'))} |")
    caption = ("*mean tree*: draft nodes scored per step; *predicted / realised* (budget `auto` only): the "
               "planner's expected tokens per step and step time against what those steps emitted and took, "
               "over the steps it predicted (those that scored a draft tree), so realised tokens/step is "
               "not tau: it counts accepted + bonus tokens before the cut at EOS or the token limit, and "
               "leaves out the plain steps that tau includes; *drafting skipped*: steps the planner did not "
               "draft because drafting did not pay.")
    return lines + ["", caption, ""] if len(lines) > 2 else []


def memory(stats: dict | None) -> str:
    """A drafter's `stats()` in a table cell: its memory, and the responses and tokens it keeps if it says."""
    if not stats or stats.get("memory_bytes") is None:
        return "-"
    kept = f" ({stats['responses']} responses, {stats['tokens']} tokens)" if "responses" in stats else ""
    size = stats["memory_bytes"]
    return (f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB") + kept


def command_text(command: str | None) -> str:
    """The command a results page says made it: `command`, else this process's own command line."""
    return command or "specframe " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def page_header(settings: dict, *, sizes: list[int], decoded: str, repeats: int, keep: str,
                command: str) -> str:
    """The first lines of a results page, one-request or batched alike: the suite and the model, the
    batch sizes B and what was decoded at them (`decoded`), the repeats the tables keep, the sampling,
    the machine, and the command that regenerates the page."""
    kept = f"the fastest of {repeats} repeat(s)" if keep == "fastest" else f"{repeats} repeat(s)"
    sampling = "greedy" if not settings.get("temperature") else f"temperature {settings['temperature']}"
    return (f"## {settings['suite']}: {settings['model']}, B = {', '.join(map(str, sizes))}, {decoded}, "
            f"{settings['max_new_tokens']} new tokens, {kept}, {sampling}, {settings['device']}, "
            f"{settings['dtype']}, {settings['threads']} torch thread(s), {settings['clock']} clock\n\n"
            f"Command: `{command}`\n")


def write_pages(out: Path, pages: dict[str, str], records: Path) -> None:
    """Write each page of a finished run (file name -> text) whole, under `out`'s lock: shards of one run
    may finish at once, and each file is then one writer's. A failed write names what stays in
    `records` and how to go on."""
    with bench_lock(out):
        for name, text in pages.items():
            with writing(out / name, tables_kept(records)):
                write_atomically(out / name, text)


def outline(runner) -> dict:
    """What a results file (and a Ray worker, to its driver) says of a runner: its label, its baseline,
    whether its output must equal the baseline's, whether it is the control, and its class's name."""
    return {"label": runner.label, "baseline": runner.baseline,
            "lossless": runner.baseline is None or runner.lossless,
            "control": getattr(runner, "control", False), "kind": type(runner).__name__}


def write_reports(run: BenchRun, out: Path, settings: dict, header: str = "", keep: str = "all") -> dict:
    """Write `results.json` (settings, aggregates, mismatches, every record) and `results.md`."""
    table = summarize(run, keep)
    payload = {"settings": settings, "methods": [outline(r) for r in run.runners], "categories": table,
               "mismatches": [vars(m) for m in run.mismatches], "records": run.records}
    write_pages(out, {"results.json": json.dumps(payload, indent=1),
                      "results.md": markdown(table, run, header)}, out / REQUESTS.records)
    return table
