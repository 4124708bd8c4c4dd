"""What the planner gains from costing trees at the step's context: a replay with and without the slopes.

    OMP_NUM_THREADS=2 python benchmarks/context_replay.py results/i14n/specbench-t2 \\
        --methods 'pld@auto,suffix@auto,rest-live@auto' --shift 0 1000 3000 --repeat 0

Replays a `specframe bench` run's recorded outputs (`specframe.bench.replay`) twice per method: with the
planner weighing the stored calibration at each step's context (`MeasuredCost.at_context`, what
decoding does), and with it weighing the calibration's own context at every step, as before the
calibration measured slopes (its speed factor still learns the average mismatch from the steps). Either
way the modelled forward costs what the calibration says at the step's context plus `--shift` tokens: a
shift plays the same outputs after a longer prompt (documents, a long system prompt, earlier turns),
where a tree costs more next to a plain step. Run `specframe calibrate` at the run's thread count first.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from pathlib import Path

import numpy as np

from specframe.decode.calibration import stored_cost
from specframe.bench.methods import resolve_methods, split_parts
from specframe.bench.replay import open_run, replay
from specframe.terms.cost import CostModel, MeasuredCost
from specframe.plugging.pipeline import assemble
from specframe.plugging.registry import get_registry


@dataclasses.dataclass(frozen=True)
class Deeper(CostModel):
    """`cost`, with every step `shift` tokens deeper in the context than the replayed prompt puts it."""

    cost: MeasuredCost
    shift: int

    def step_seconds(self, nodes: int, depth: int = 0) -> float:
        return self.cost.step_seconds(nodes, depth)

    def at_context(self, context: int) -> CostModel:
        return self.cost.at_context(context + self.shift)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a `specframe bench --out` directory")
    parser.add_argument("--methods", required=True, help="as `specframe bench --methods`")
    parser.add_argument("--shift", type=int, nargs="+", default=[0], help="extra context tokens")
    parser.add_argument("--repeat", type=int, default=None, help="replay only this repeat of each turn")
    args = parser.parse_args()
    run = open_run(args.run)
    settings, target, suite = run.settings, run.target, run.suite
    turns = [t for t in run.turns if args.repeat is None or t.repeat == args.repeat]
    category = {p.qid: p.category for p in suite}
    cost = stored_cost(assemble(target).backend)
    if cost is None or not cost.flat_slope:
        parser.error(f"no stored calibration with context slopes: run `specframe calibrate --threads "
                     f"{settings['threads']}` first")
    blind = dataclasses.replace(cost, flat_slope=(), chain_slope=())  # the calibration's context only
    prompts = [len(t.prompt_ids) for t in turns]
    print(f"{args.run}: {len(turns)} turns, prompts of {min(prompts)}-{max(prompts)} tokens (median "
          f"{np.median(prompts):.0f}); calibrated at {cost.context} tokens, "
          f"{settings['threads']} thread(s)\n")
    print("| extra context | method | tau (blind; at context) | nodes per step | modelled speedup "
          "| at context / blind | lowest category ratio |")
    print("|---|---|---|---|---|---|---|")
    for shift in args.shift:
        truth = Deeper(cost, shift)
        for method in resolve_methods(split_parts(args.methods, ","), get_registry()):
            runs = {name: replay(target, method, turns, cost=truth, planner_cost=believed)
                    for name, believed in (("blind", blind), ("context", truth))}
            by_category = {}
            for name, stats in runs.items():
                speed = defaultdict(list)
                for turn, ratio in zip(turns, stats.by_turn):
                    speed[category[turn.qid]].append(ratio)
                by_category[name] = {c: float(np.mean(v)) for c, v in speed.items()}
            gains = {k: by_category["context"][k] / by_category["blind"][k] for k in by_category["blind"]}
            lowest = min(gains, key=gains.get)
            b, c = runs["blind"], runs["context"]
            print(f"| {shift} | {method.label} | {b.tau:.3f}; {c.tau:.3f} | {b.nodes / b.steps:.2f}; "
                  f"{c.nodes / c.steps:.2f} | {b.speedup:.3f}; {c.speedup:.3f} | {c.speedup / b.speedup:.3f} "
                  f"| {lowest} {gains[lowest]:.3f} |",
                  flush=True)


if __name__ == "__main__":
    main()
