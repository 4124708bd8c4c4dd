"""How much of a `specframe bench` run's per-turn spread is the machine's, not the method's.

For every method: the geometric mean of its per-turn speedups over the baseline's run of the same turn,
an approximate 95 % interval of that mean (two standard errors of the mean log ratio), the spread of the
per-turn log ratios, and the slowest and fastest turn. A method that computes what plain decoding does
(`hf-generate`, or a drafter the planner switched off) shows the machine's own noise: a deficit inside
its interval, or "turns below 0.9x" no more frequent than for such a method, is not evidence against the
method. Only questions that every method finished are counted, so a run cut short still compares like
with like.

    python benchmarks/turn_noise.py results/gpu/humaneval
    python benchmarks/turn_noise.py results/gpu/floor --keep fastest

Reads each directory's `records.jsonl`; prints one markdown table per directory. Each turn counts its
first repeat, or with `--keep fastest` (for a run made with `--repeats N --keep fastest`) the fastest of
its repeats, for the baseline as for every method; then a question counts only where every method ran
every repeat.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from specframe.bench.report import complete_questions, fastest_repeats
from specframe.bench.runner import read_records


def wall_times(directory: Path, keep: str = "first") -> dict[tuple[str, int], dict[str, float]]:
    """{(question, turn): {method: wall seconds}} of the first repeat of each (`keep="first"`) or the
    fastest (`"fastest"`), on questions every method finished."""
    records = complete_questions(read_records(directory / "records.jsonl"))
    turns: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for record in fastest_repeats(records) if keep == "fastest" else records:
        if record["repeat"] == 0:
            turns[(record["qid"], record["turn"])][record["method"]] = record["metrics"]["wall_s"]
    return turns


def noise_table(directory: Path, baseline: str = "baseline", keep: str = "first") -> str:
    if not (directory / "records.jsonl").is_file():
        sys.exit(f"{directory}: no records.jsonl here; pass the --out directory of a `specframe bench` run")
    turns = wall_times(directory, keep)
    if not turns or any(baseline not in runs for runs in turns.values()):
        sys.exit(f"{directory}: no question that every method, '{baseline}' included, finished")
    methods = sorted({m for runs in turns.values() for m in runs} - {baseline})
    which = "the fastest repeat of each" if keep == "fastest" else "first repeats"
    lines = [f"#### {directory.name}: per-turn speedup over `{baseline}` ({len(turns)} turns, {which})", "",
             "| method | geometric mean | ~95 % interval | sd of log ratio | slowest turn | fastest turn |",
             "|---|---|---|---|---|---|"]
    for method in methods:
        logs = [math.log(runs[baseline] / runs[method]) for runs in turns.values()]
        mean = statistics.fmean(logs)
        sd = statistics.stdev(logs) if len(logs) > 1 else 0.0
        half = 2 * sd / math.sqrt(len(logs))
        low, high = math.exp(mean - half), math.exp(mean + half)
        lines.append(f"| {method} | {math.exp(mean):.3f} | {low:.3f}-{high:.3f} | {sd:.3f} "
                     f"| {math.exp(min(logs)):.2f} | {math.exp(max(logs)):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", type=Path, help="`specframe bench --out` directories")
    parser.add_argument("--keep", choices=["first", "fastest"], default="first",
                        help="which repeat of each turn counts (default: the first)")
    args = parser.parse_args()
    print("\n\n".join(noise_table(d, keep=args.keep) for d in args.directories))
