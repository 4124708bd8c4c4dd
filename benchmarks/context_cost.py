"""What a tree costs next to a plain step as the context grows, measured and as the calibration predicts.

    OMP_NUM_THREADS=2 python benchmarks/context_cost.py --threads 2

Times `score` on flat trees of a few sizes after synthetic prompts of several lengths (the fastest of
`--rounds` rounds, round-robin, as `calibrate` does: `specframe.decode.calibration.round_times`), and
prints each tree's time and its ratio to a plain step at the same context, beside what the stored
calibration predicts there (`MeasuredCost.at_context`: two measured contexts, linear in between and past
them) and what it predicted before it had slopes (the 256-token curve at every context). Run
`specframe calibrate` first, at the same thread count.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from specframe.decode.calibration import round_times, stored_cost
from specframe.plugging.models import load_target
from specframe.plugging.pipeline import assemble
from specframe.support.progress import bar as progress_bar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 4, 8, 16, 24])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backend = assemble(load_target(args.model)).backend
    cost = stored_cost(backend)
    if cost is None:
        parser.error(f"no stored calibration: run `specframe calibrate --threads {args.threads}` first")
    print(f"{args.model}, {args.threads} thread(s), flat trees, fastest of {args.rounds}; "
          f"calibrated at {cost.context} tokens\n")
    print("| context | " + " | ".join(f"{n} nodes: ms, / plain (predicted; without slopes)" if n
                                      else "plain ms (predicted)" for n in args.sizes) + " |")
    print("|---" * (len(args.sizes) + 1) + "|")
    for prompt in progress_bar(args.contexts, desc="contexts", leave=False):
        times = round_times(backend, [(n, "flat") for n in args.sizes], args.rounds, progress=False,
                            prompt_tokens=prompt)
        measured = {n: float(np.min(times[(n, "flat")])) for n in args.sizes}
        here = cost.at_context(prompt + 1)
        cells = [f"{1000 * measured[0]:.1f} ({1000 * here.step_seconds(0):.1f})"]
        for n in args.sizes[1:]:
            now = here.step_seconds(n, 1) / here.step_seconds(0)
            before = cost.step_seconds(n, 1) / cost.step_seconds(0)
            cells.append(f"{1000 * measured[n]:.1f}, {measured[n] / measured[0]:.2f} "
                         f"({now:.2f}; {before:.2f})")
        print(f"| {prompt + 1} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
