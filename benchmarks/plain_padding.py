"""What padding a plain step to 4 rows saves: a backend's plain step, one row against four.

A plain step (the root alone, no draft) is one row. On the CPUs measured, oneDNN multiplies one row
more slowly than four (`plugins/specframe_kv/__init__.py`), so `kv` and `ssm-tree` can pad every
forward, plain steps included, to `min_rows` rows with throwaway rows (on the CPU where the calibration
measured that no slower for the model: `specframe.runtime.devices.forward_min_rows`). This loads the target
once,
prefills two backends, `B(min_rows=1)` and `B(min_rows=4)`, with the same random tokens, and times
plain steps of both, alternating, on the process CPU clock (`--clock cpu`, for a shared machine) or wall
time. Each step is committed, so the cache grows as in decoding. Prints the median step of each and
their ratio.

    OMP_NUM_THREADS=1 python benchmarks/plain_padding.py --threads 1 --clock cpu
    OMP_NUM_THREADS=1 python benchmarks/plain_padding.py --model smollm2-135m-hybrid --backend ssm-tree
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import specframe
from specframe import TokenTree
from specframe.plugging.pipeline import assemble
from specframe.support.progress import bar as progress_bar
from specframe.terms.metrics import CLOCKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="kv", help="a backend with a min_rows option: kv or ssm-tree")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    parser.add_argument("--steps", type=int, default=60, help="plain steps timed per backend")
    parser.add_argument("--prompt", type=int, default=256, help="tokens in the cache before the first step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    target = specframe.load_target(args.model, device="cpu")
    specs = (f"{args.backend}(min_rows=1)", f"{args.backend}(min_rows=4)")
    backends = {spec: assemble(target, backend=spec).backend for spec in specs}
    ids = np.random.default_rng(0).integers(0, target.vocab_size, args.prompt + 1).tolist()
    times = {spec: [] for spec in backends}
    for backend in backends.values():
        backend.prefill(ids)
    for step in progress_bar(range(args.steps + 3), desc="plain steps", unit="step"):
        for spec, backend in backends.items():
            start = clock()
            scored = backend.score(TokenTree.empty())
            elapsed = clock() - start
            backend.commit(scored, [], int(ids[step % len(ids)]))
            if step >= 3:  # the first steps warm the kernels up
                times[spec].append(elapsed)
    one, four = (float(np.median(times[spec])) * 1e3 for spec in backends)
    print(f"{args.model} on `{args.backend}`, {args.threads} thread(s), {args.clock} clock, median of "
          f"{args.steps} plain steps from {args.prompt} cached tokens\n\n| plain step | ms |\n|---|---|\n"
          f"| one row (`{specs[0]}`) | {one:.1f} |\n| padded to 4 rows (`{specs[1]}`) | {four:.1f} |\n"
          f"| padded / one row | {four / one:.3f} |")


if __name__ == "__main__":
    main()
