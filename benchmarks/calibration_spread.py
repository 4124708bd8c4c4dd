"""How much step-cost calibrations move between runs: the median of 3 rounds against the fastest of 5.

    OMP_NUM_THREADS=1 python benchmarks/calibration_spread.py --threads 1 --calibrations 4

Runs `--calibrations` calibrations of the `kv` backend in a row, each timing flat trees of every size of
the calibration grid for 5 rounds (`specframe.decode.calibration.round_times`, as `calibrate` does), and
summarises each calibration two ways: the median of its first 3 rounds (the rule before) and the fastest
of its 5 (the rule now). What the planner weighs is t(N) - t(0), so the table shows, for each N, the
standard deviation of t(N) - t(0) across the calibrations under each rule.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from specframe.decode.calibration import SIZES, round_times
from specframe.plugging.models import load_target
from specframe.plugging.pipeline import assemble
from specframe.support.progress import bar as progress_bar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calibrations", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backend = assemble(load_target(args.model)).backend
    rules = {"median of 3": [], "fastest of 5": []}
    for _ in progress_bar(range(args.calibrations), desc="calibrations"):
        times = round_times(backend, [(n, "flat") for n in SIZES], rounds=5, progress=False)
        rounds = np.array([times[(n, "flat")] for n in SIZES]).T  # (5, sizes)
        rules["median of 3"].append(np.median(rounds[:3], axis=0))
        rules["fastest of 5"].append(rounds.min(axis=0))
    print(f"{args.model}, {args.threads} thread(s), {args.calibrations} calibrations: "
          "sd across calibrations of t(N) - t(0), ms\n")
    print("| rule | " + " | ".join(f"N={n}" for n in SIZES[1:]) + " | mean |")
    print("|---|" + "---|" * len(SIZES))
    for rule, curves in rules.items():
        curves = np.array(curves) * 1e3
        sd = (curves[:, 1:] - curves[:, :1]).std(axis=0)
        print(f"| {rule} | " + " | ".join(f"{s:.1f}" for s in sd) + f" | {sd.mean():.1f} |")


if __name__ == "__main__":
    main()
