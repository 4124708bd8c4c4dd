"""Replay a `specframe bench` run's recorded outputs through other drafters or options, without the target.

    python benchmarks/replay_drafts.py results/i14c/humaneval \\
        --methods 'pld@auto,suffix@auto,suffix(factor=1.0,offset=0.0)+trie@auto'

Exact for greedy runs and for `sample-match` runs with a seed (see `specframe.bench.replay`): tau and the
tree sizes are what a real run would give; the speedup is modelled from the stored step calibration
(`specframe calibrate` at the run's thread count) plus real drafting time, with verify and commit left
out. Methods the run measured show their measured tau beside the replayed one, as a check.
`--copy-bound 1 2` adds what an oracle copying one path from earlier text could reach (see
`specframe.bench.replay.copy_bound`). `--oracle` adds each method replayed with a planner that knows
which path of its tree the target accepts (`specframe.bench.replay.oracle_choice`): how far the drafts
themselves would take it, and so how much a better tree choice could still gain (its mean tree counts
the accepted path only). `--price-as A:B` replays a machine on which trees of A+1 to B nodes cost what A
nodes cost (the stored calibration otherwise): what cheaper rows would be worth, for planner and speedup.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from pathlib import Path

import numpy as np

from specframe.bench.methods import resolve_methods, split_parts
from specframe.bench.replay import copy_bound, open_run, replay
from specframe.bench.store import read_records
from specframe.terms.cost import MeasuredCost
from specframe.plugging.pipeline import assemble
from specframe.support.progress import bar as progress_bar
from specframe.plugging.registry import get_registry


def priced_as(cost: MeasuredCost, cheap: int, up_to: int) -> MeasuredCost:
    """`cost` with every measured tree size in (cheap, up_to] priced as size `cheap` (a measured size)."""
    if cheap not in cost.sizes:
        sizes = ", ".join(map(str, cost.sizes))
        raise SystemExit(f"--price-as: {cheap} nodes is not a calibrated size ({sizes})")
    at = cost.sizes.index(cheap)

    def flatten(values: tuple[float, ...]) -> tuple[float, ...]:
        if not values:
            return values
        return tuple(values[at] if cheap < n <= up_to else v for n, v in zip(cost.sizes, values))

    return dataclasses.replace(cost, flat_s=flatten(cost.flat_s), chain_s=flatten(cost.chain_s),
                               flat_slope=flatten(cost.flat_slope), chain_slope=flatten(cost.chain_slope))


def repriced(target, backend, price_as: tuple[int, int]) -> MeasuredCost | None:
    """The stored calibration of `backend` on `target`, `priced_as` `price_as`; None where there is none
    (`replay` then says to calibrate). Assembles the backend alone: no drafter is loaded for this."""
    calibrated = assemble(target, backend=backend).backend.calibration.cost  # handed down at assembly
    return priced_as(calibrated, *price_as) if calibrated else None


def price_range(text: str) -> tuple[int, int]:
    cheap, _, up_to = text.partition(":")
    try:
        return int(cheap), int(up_to)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B (two node counts), got {text!r}") from None


def measured_tau(records: Path) -> dict[str, float]:
    tokens, steps = defaultdict(int), defaultdict(int)
    for row in read_records(records):
        tokens[row["method"]] += row["metrics"]["new_tokens"]
        steps[row["method"]] += row["metrics"]["steps"]
    return {m: tokens[m] / steps[m] for m in tokens if steps[m]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a `specframe bench --out` directory")
    parser.add_argument("--methods", required=True, help="as `specframe bench --methods`")
    parser.add_argument("--baseline", default="baseline", help="the method whose outputs are replayed")
    parser.add_argument("--copy-bound", type=int, nargs="*", default=[], metavar="K",
                        help="also print the single-path copy bound with K tokens of context")
    parser.add_argument("--oracle", action="store_true",
                        help="also replay each method with a planner that knows which path the target "
                             "accepts (`specframe.bench.replay.oracle_choice`): what its drafts give at best")
    parser.add_argument("--by-category", action="store_true",
                        help="also print tau and the modelled speedup per suite category")
    parser.add_argument("--price-as", type=price_range, default=None, metavar="A:B",
                        help="price trees of A+1 to B nodes as A nodes (see the module docstring)")
    args = parser.parse_args()
    run = open_run(args.run, args.baseline)
    settings, target, suite, turns = run.settings, run.target, run.suite, run.turns
    category = {p.qid: p.category for p in suite}
    by_category = {}
    methods = resolve_methods(split_parts(args.methods, ","), get_registry())
    measured = measured_tau(args.run / "records.jsonl")
    print(f"{args.run}: {len(turns)} turns of '{args.baseline}', {settings['model']}, "
          f"temperature {settings['temperature']}, {settings['threads']} thread(s)\n")
    print("| method | tau replayed | tau measured | mean tree | modelled speedup | turns < 0.9x "
          "| draft ms/step |")
    print("|---|---|---|---|---|---|---|")
    costs: dict[str, MeasuredCost | None] = {}  # `--price-as` costs by backend
    runs = [(method, oracle) for method in methods for oracle in ((False, True) if args.oracle else (False,))]
    for method, oracle in progress_bar(runs, desc="replay", leave=False):
        if args.price_as and str(method.backend) not in costs:  # one per backend: methods share it
            costs[str(method.backend)] = repriced(target, method.backend, args.price_as)
        cost = costs.get(str(method.backend))
        stats = replay(target, method, turns, cost=cost, oracle=oracle)
        slow = float(np.mean(np.array(stats.by_turn) < 0.9))
        tau = None if oracle else measured.get(method.label)
        label = f"{method.label}, oracle" if oracle else method.label
        print(f"| {label} | {stats.tau:.3f} | {'-' if tau is None else f'{tau:.3f}'} | "
              f"{stats.nodes / stats.steps:.2f} | {stats.speedup:.3f} | {slow:.0%} | "
              f"{stats.draft_s / stats.steps * 1e3:.2f} |", flush=True)
        tallies = defaultdict(lambda: np.zeros(4))  # tokens, steps, plain seconds, modelled seconds
        for turn, steps, seconds in zip(turns, stats.turn_steps, stats.turn_seconds):
            tallies[category[turn.qid]] += (len(turn.tokens), steps, *seconds)
        by_category[label] = tallies
    if args.by_category:
        names = sorted({c for tallies in by_category.values() for c in tallies})
        for title, (top, bottom) in {"tau": (0, 1), "modelled speedup": (2, 3)}.items():
            print(f"\n| {title} by category | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
            for label, tallies in by_category.items():
                cells = (tallies[c][top] / tallies[c][bottom] if c in tallies else 0.0 for c in names)
                print(f"| {label} | " + " | ".join(f"{cell:.2f}" for cell in cells) + " |")
    for k in args.copy_bound:
        print(f"\nsingle-path copy bound, {k} token(s) of context: tau {copy_bound(turns, k):.3f}")


if __name__ == "__main__":
    main()
