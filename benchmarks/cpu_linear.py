"""What one verification step costs with torch's linear kernel, oneDNN-packed weights and `stream_linear`.

Loads the target once per CPU linear kernel (`SPECFRAME_CPU_LINEAR=torch`, `onednn` and, where the CPU
has AVX-512, `stream`: see `specframe/runtime/packed_linear.py`), prefills each `kv` backend with the same 256
random tokens, and times `backend.score` on chains and flat trees of every size, rounds interleaved over
kernels and sizes so a drift of the machine spreads over all of them. `kv` runs with `min_rows=1` (no
padding of small trees), so the table shows the kernels' own costs. Reports the median per size in ms
and as a multiple of the same kernel's plain step (0 nodes), on the process CPU clock (`--clock cpu`, for
a shared machine) or wall time.

    OMP_NUM_THREADS=1 python benchmarks/cpu_linear.py --threads 1 --clock cpu --out results/cpu-linear
"""

from __future__ import annotations

import os

import numpy as np
import torch

import specframe
from specframe.decode.calibration import probe_tree
from specframe.runtime.packed_linear import linear_kernel
from specframe.plugging.pipeline import assemble
from specframe.support.progress import bar as progress_bar
from specframe.terms.metrics import CLOCKS
from specframe_kernels import stream_linear

from step_timing import medians, report, time_scores, timing_parser, warm_up

SIZES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
KERNELS = ("torch", "onednn", "stream") if stream_linear.available() else ("torch", "onednn")


def backend_for(model: str, kernel: str):
    os.environ["SPECFRAME_CPU_LINEAR"] = kernel
    target = specframe.load_target(model, device="cpu")
    assert linear_kernel(target.model) == kernel, f"this machine cannot run the {kernel} kernel"
    return assemble(target, backend="kv(min_rows=1)").backend


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    backends = {kernel: backend_for(args.model, kernel) for kernel in KERNELS}
    ids = np.random.default_rng(0).integers(0, 49152, args.prompt + 1)
    trees = {(n, shape): probe_tree(n, shape, ids) for n in SIZES for shape in ("chain", "flat")}
    warm_up(backends, ids.tolist(), trees)
    total = args.rounds * len(backends) * len(trees)
    with progress_bar(total=total, desc="timing steps", unit="forward") as bar:
        return medians(time_scores(backends, trees, args.rounds, CLOCKS[args.clock], bar))


def table(medians: dict) -> str:
    lines = ["| kernel | tree | " + " | ".join(str(n) for n in SIZES) + " |",
             "|---|---|" + "---|" * len(SIZES)]
    for kernel in KERNELS:
        plain = medians[f"{kernel} 0 chain"]
        for shape in ("chain", "flat"):
            ms = [medians[f"{kernel} {n} {shape}"] * 1e3 for n in SIZES]
            lines.append(f"| {kernel} | {shape} ms | " + " | ".join(f"{t:.1f}" for t in ms) + " |")
            lines.append(f"| {kernel} | {shape} / plain | "
                         + " | ".join(f"{t / (plain * 1e3):.2f}" for t in ms) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = timing_parser(__doc__.splitlines()[0], rounds=7)
    parser.add_argument("--prompt", type=int, default=256, help="tokens in the cache the tree attends to")
    args = parser.parse_args()
    measured = measure(args)
    text = (f"{args.model}, kv(min_rows=1), {args.threads} thread(s), {args.clock} clock, median of "
            f"{args.rounds}, {args.prompt} cached tokens, tree sizes in nodes (0 = a plain step)\n\n"
            + table(measured))
    report(text, measured, args.out)


if __name__ == "__main__":
    main()
