"""The per-step time split of every method in `specframe bench` runs: milliseconds per verification step
spent drafting, building the tree, in the target's forward, verifying and committing, summed over all
of a method's turns (so long turns weigh more), beside tau.

    python benchmarks/step_split.py results/hybrid-bench/humaneval results/hybrid-bench/spec-bench

Reads each directory's `records.jsonl`; prints one markdown table per directory.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from specframe.bench.runner import read_records

PHASES = ("draft", "tree", "forward", "verify", "commit", "other")


def split(directory: Path) -> str:
    seconds: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(PHASES, 0.0))
    steps: dict[str, int] = defaultdict(int)
    tokens: dict[str, int] = defaultdict(int)
    for record in read_records(directory / "records.jsonl"):
        metrics = record["metrics"]
        if not metrics.get("time_s"):  # transformers peers: no per-step split
            continue
        for phase in PHASES:
            seconds[record["method"]][phase] += metrics["time_s"].get(phase, 0.0)
        steps[record["method"]] += metrics["steps"]
        tokens[record["method"]] += metrics["new_tokens"]
    lines = [f"#### {directory.name}: ms per step", "",
             "| method | steps | tau | " + " | ".join(PHASES) + " | total |",
             "|---|---|---|" + "---|" * (len(PHASES) + 1)]
    for method, phases in seconds.items():
        n = max(1, steps[method])
        cells = " | ".join(f"{phases[p] * 1e3 / n:.1f}" for p in PHASES)
        total = sum(phases.values()) * 1e3 / n
        lines.append(f"| {method} | {steps[method]} | {tokens[method] / n:.2f} | {cells} | {total:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(split(Path(d)) for d in sys.argv[1:]))
