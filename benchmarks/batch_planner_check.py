"""Where `budget="auto"` stands against a fixed budget at batch B, and why: both decode the same HumanEval
prompts B rows at a time, taking turns chunk by chunk in one process, and the batch planner's predictions
are compared with what happened.

Prints, per method, throughput (CPU clock), forward ms per batched step and tokens per step; for `auto`,
how well the acceptance model's path probabilities P of the nodes it kept were calibrated (predicted
against realised acceptance, by bin of P) and its predicted against realised forward seconds by the query
rows of the forward. A planner whose predictions are right in aggregate can still choose badly if they
are wrong at the tails: that is what the bins show.

    OMP_NUM_THREADS=1 python benchmarks/batch_planner_check.py --batch 4 --prompts 16 --budget 4
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import specframe
from specframe.decode import batch_planner
from specframe.decode.selection import path_probabilities
from specframe.support.prompt_suites import encode_turn, load_suite

P_BINS = (0.0, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 1.01)
ROW_BINS = ((1, 8), (9, 16), (17, 24), (25, 36), (37, 60), (61, 10_000))


class Recorder:
    """Wraps the batch planner's cut and observe, and its rows' observe, to keep predictions beside
    outcomes: (P, accepted) per kept node, (rows, predicted forward s, realised forward s) per step."""

    def __init__(self):
        self.nodes: list[tuple[float, float]] = []
        self.steps: list[list[float]] = []
        cut, observe, row_observe = (batch_planner.BatchPlanner.cut, batch_planner.BatchPlanner.observe,
                                     batch_planner.RowPlan.observe)
        recorder = self

        def recorded_cut(planner, trees, plans, batch):
            out = cut(planner, trees, plans, batch)
            seconds = next(iter(out.values()))[1].seconds if out else 0.0
            recorder.steps.append([planner._rows, seconds - planner.overhead_s])
            return out

        def recorded_observe(planner, forward_s, step_s, drafting_s=0.0):
            if recorder.steps and len(recorder.steps[-1]) == 2:
                recorder.steps[-1].append(forward_s)
            return observe(planner, forward_s, step_s, drafting_s)

        def recorded_row(plan, tree, result, times):
            if plan.features is not None and len(tree):
                p = path_probabilities(tree.parents, plan.planner.acceptance.predict(plan.features))
                accepted = np.zeros(len(tree))
                accepted[list(result.path)] = 1.0
                recorder.nodes.extend(zip(p.tolist(), accepted.tolist()))
            return row_observe(plan, tree, result, times)

        batch_planner.BatchPlanner.cut = recorded_cut
        batch_planner.BatchPlanner.observe = recorded_observe
        batch_planner.RowPlan.observe = recorded_row

    def report(self) -> None:
        nodes = np.array(self.nodes).reshape(-1, 2)
        print(f"\nauto's kept nodes: {len(nodes)}; predicted accepted {nodes[:, 0].sum():.0f}, "
              f"realised {nodes[:, 1].sum():.0f}")
        for lo, hi in zip(P_BINS, P_BINS[1:]):
            inside = (nodes[:, 0] >= lo) & (nodes[:, 0] < hi)
            if inside.any():
                print(f"  P in [{lo:.2f}, {min(hi, 1.0):.2f}): {inside.sum():5d} nodes, "
                      f"predicted {nodes[inside, 0].mean():.3f}, realised {nodes[inside, 1].mean():.3f}")
        steps = np.array([s for s in self.steps if len(s) == 3]).reshape(-1, 3)
        print(f"auto's steps: {len(steps)}; predicted forward {steps[:, 1].sum():.1f} s, "
              f"realised {steps[:, 2].sum():.1f} s")
        for lo, hi in ROW_BINS:
            inside = (steps[:, 0] >= lo) & (steps[:, 0] <= hi)
            if inside.any():
                predicted, realised = 1e3 * steps[inside, 1].mean(), 1e3 * steps[inside, 2].mean()
                print(f"  {lo}-{hi} query rows: {inside.sum():4d} steps, predicted {predicted:.0f} ms, "
                      f"realised {realised:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16, help="HumanEval problems 0..N-1")
    parser.add_argument("--budget", type=int, default=4, help="the fixed budget set beside auto")
    parser.add_argument("--drafter", default="suffix")
    parser.add_argument("--tree", default="trie")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    recorder = Recorder()
    target = specframe.load_target("smollm2-135m")
    decoders = {label: specframe.SpeculativeDecoder.from_names(target, drafter=args.drafter, tree=args.tree,
                                                               budget=budget)
                for label, budget in (("auto", "auto"), (f"@{args.budget}", args.budget))}
    prompts = [encode_turn(target.tokenizer, p, 0, []) for p in load_suite("humaneval", limit=args.prompts)]
    totals = {label: dict(tokens=0, seconds=0.0, forward=0.0, steps=0) for label in decoders}
    chunk = max(2 * args.batch, 8)
    for index, first in enumerate(range(0, len(prompts), chunk)):
        labels = list(decoders)[index % 2:] + list(decoders)[:index % 2]  # who goes first alternates
        for label in labels:
            decoder = decoders[label]
            start = time.process_time()
            results = decoder.generate_batch(prompts[first:first + chunk], args.max_new_tokens,
                                             batch_size=args.batch)
            split = decoder.batch_metrics.to_dict()
            total = totals[label]
            total["seconds"] += time.process_time() - start
            total["tokens"] += sum(len(r.tokens) for r in results)
            total["forward"] += split["time_s"]["forward"]
            total["steps"] += split["batch_steps"]
        print(f"chunk {index}: " + ", ".join(f"{label} {t['tokens'] / t['seconds']:.2f} tok/s"
                                             for label, t in totals.items()), flush=True)
    for label, t in totals.items():
        print(f"{label}: {t['tokens'] / t['seconds']:.2f} tok/s (CPU clock), forward "
              f"{1e3 * t['forward'] / t['steps']:.0f} ms per batched step, "
              f"{t['tokens'] / t['steps']:.2f} tokens per step, {t['steps']} steps")
    recorder.report()


if __name__ == "__main__":
    main()
