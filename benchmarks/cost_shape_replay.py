"""Replay a run's outputs with the planner believing one step calibration while steps cost another.

    OMP_NUM_THREADS=1 python benchmarks/cost_shape_replay.py results/records/sb-t1 \\
        --methods 'suffix-self@auto' --truth quiet.json --measure-truth 15 \\
        --belief ~/.cache/specframe/costs/kv-....json

Every step is priced by `--truth`, a calibration file as `specframe calibrate` stores it under
`SPECFRAME_HOME/costs/`; `--measure-truth ROUNDS` first measures it here with that many rounds (the
fastest of each, as `calibrate` does with 5) at the run's thread count and writes it there. The planner
weighs each `--belief` instead, and learns the machine's speed from the truth's forward times as a real
decoder learns it from its steps: once with one speed factor for every tree size, once with each size's
own (`AdaptivePlanner(learn_shape=)`). The truth believed is the reference. Replayed outputs
and modelled times, so the machine's noise does not enter the comparison (see `specframe.bench.replay`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specframe.decode.calibration import calibrate, cost_key, read_cost, write_cost
from specframe.bench.methods import resolve_methods, split_parts
from specframe.bench.replay import open_run, replay
from specframe.terms.errors import ConfigurationError
from specframe.plugging.pipeline import assemble
from specframe.plugging.registry import get_registry


def load(path: Path):
    cost = read_cost(path)
    if cost is None:
        raise ConfigurationError(f"{path} is not a step calibration: give a file that `specframe calibrate` "
                                 "stored under SPECFRAME_HOME/costs/, or measure one with --measure-truth")
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a `specframe bench --out` directory")
    parser.add_argument("--methods", required=True, help="as `specframe bench --methods`")
    parser.add_argument("--truth", type=Path, required=True, help="the calibration that prices every step")
    parser.add_argument("--measure-truth", type=int, metavar="ROUNDS",
                        help="measure --truth first, the fastest of ROUNDS rounds, and write it there")
    parser.add_argument("--belief", type=Path, action="append", default=[],
                        help="a calibration the planner weighs instead (repeat for several)")
    args = parser.parse_args()
    run = open_run(args.run)  # the run's target, suite and thread count
    if args.measure_truth:
        backend = assemble(run.target).backend
        write_cost(args.truth, cost_key(backend), calibrate(backend, rounds=args.measure_truth))
    truth = load(args.truth)
    beliefs = {str(path): load(path) for path in args.belief}
    print(f"{args.run}: {len(run.turns)} turns, every step priced by {args.truth}\n")
    print("| method | planner believes | size factors | tau | modelled speedup | nodes per step |")
    print("|---|---|---|---|---|---|")
    for method in resolve_methods(split_parts(args.methods, ","), get_registry()):
        cases = [("the truth", truth, True)] + [(name, cost, learn) for name, cost in beliefs.items()
                                                 for learn in (False, True)]
        for name, belief, learn in cases:
            stats = replay(run.target, method, run.turns, cost=truth, planner_cost=belief, learn_shape=learn)
            print(f"| {method.label} | {name} | {'by size' if learn else 'one for all'} | {stats.tau:.3f} | "
                  f"{stats.speedup:.3f} | {stats.nodes / max(stats.steps, 1):.2f} |", flush=True)


if __name__ == "__main__":
    main()
