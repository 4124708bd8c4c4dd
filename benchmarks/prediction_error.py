"""How well `budget="auto"` predicts each step's time: predicted over realised, step by step, by tree size.

    OMP_NUM_THREADS=2 python benchmarks/prediction_error.py --threads 2 --categories rag summarization

Decodes Spec-Bench first turns of the given categories (the longest prompts by default) with one
method at `auto`, records every step the planner predicted through the `on_step` hook, and prints,
by tree size and by context length, the median of predicted / realised step time (drafting aside, as
the cost model predicts it) and the mean |log| of that ratio. The decoder's aggregate version of the
same comparison is `prediction_summary()` in `specframe.terms.metrics`.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import specframe
from specframe.support.prompt_suites import encode_turn, load_suite
from specframe.plugging.registry import PluginRegistry


class StepRecorder:
    """Collects (tree size, context tokens, predicted s, realised s) for every predicted step."""

    def __init__(self):
        self.rows: list[tuple[int, int, float, float]] = []
        self.context = 0

    @specframe.hookimpl
    def on_decode_start(self, prompt_ids):
        self.context = len(prompt_ids)

    @specframe.hookimpl
    def on_step(self, event):
        if event.prediction is not None:
            realised = sum(s for phase, s in event.times.items() if phase != "draft")
            self.rows.append((event.tree_size, self.context, event.prediction.seconds, realised))
        self.context += len(event.emitted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", default="rest(live=1)")
    parser.add_argument("--tree", default="trie")
    parser.add_argument("--categories", nargs="+", default=["rag", "summarization"])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    registry, recorder = PluginRegistry(), StepRecorder()
    registry.register_plugin(recorder, name="step-recorder")
    target = specframe.load_target(args.model)
    prompts = [p for p in load_suite("spec-bench") if p.category in args.categories][:args.prompts]
    decoder = specframe.SpeculativeDecoder.from_names(target, args.drafter, args.tree, "greedy",
                                                      budget="auto", registry=registry)
    decoder.generate(encode_turn(target.tokenizer, prompts[0], 0, []), max_new_tokens=16)  # warm up
    recorder.rows.clear()
    for prompt in prompts:
        decoder.generate(encode_turn(target.tokenizer, prompt, 0, []), max_new_tokens=args.max_new_tokens)
    rows = np.array(recorder.rows)  # (steps, 4)
    ratio = rows[:, 2] / rows[:, 3]
    print(f"{args.drafter}+{args.tree}@auto on {', '.join(args.categories)}: {len(rows)} predicted steps, "
          f"context median {np.median(rows[:, 1]):.0f} tokens\n")
    print("| steps with | steps | predicted / realised, median | mean abs log ratio |\n|---|---|---|---|")
    groups = [(f"{lo}-{hi} nodes", (rows[:, 0] >= lo) & (rows[:, 0] <= hi))
              for lo, hi in ((0, 0), (1, 4), (5, 8), (9, 16), (17, 32))]
    groups += [(f"a tree, context {lo}-{hi}", (rows[:, 1] >= lo) & (rows[:, 1] < hi) & (rows[:, 0] > 0))
               for lo, hi in ((0, 600), (600, 100_000))]
    for label, mask in groups:
        if mask.any():
            print(f"| {label} | {mask.sum()} | {np.median(ratio[mask]):.3f} | "
                  f"{np.mean(np.abs(np.log(ratio[mask]))):.3f} |")


if __name__ == "__main__":
    main()
