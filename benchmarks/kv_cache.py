"""What a verification step costs with a cache that appends in place and with transformers' `torch.cat`.

Loads the target once and builds two `kv` backends on it, `kv` (the cache appends into preallocated
buffers, `specframe/runtime/kv_cache.py`) and `kv(cache='concat')` (transformers' `DynamicLayer`, which copies
the layer's whole cache at every append). For each context length it prefills both with the same random
tokens and times `backend.score` on a plain step and on flat trees, rounds interleaved over caches and
sizes so a drift of the machine spreads over both. A score drops the previous step's rows and appends its
own, as every step of a decode does. Reports the median per cell in ms and the buffered cache's time
over the concatenating one's, on the process CPU clock (`--clock cpu`, for a shared machine) or wall
time.

    OMP_NUM_THREADS=2 python benchmarks/kv_cache.py --threads 2 --clock wall --out results/kv-cache
"""

from __future__ import annotations

import numpy as np
import torch

import specframe
from specframe.decode.calibration import probe_tree
from specframe.plugging.pipeline import assemble
from specframe.support.progress import bar as progress_bar
from specframe.terms.metrics import CLOCKS

from step_timing import medians, report, time_scores, timing_parser, warm_up

CACHES = {"buffer": "kv", "concat": "kv(cache='concat')"}
SIZES = (0, 4, 8, 16)


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    target = specframe.load_target(args.model, device="cpu")
    backends = {name: assemble(target, backend=spec).backend for name, spec in CACHES.items()}
    ids = np.random.default_rng(0).integers(0, target.config.vocab_size, max(args.contexts) + 1)
    times = {}
    total = args.rounds * len(backends) * len(args.contexts) * len(SIZES)
    with progress_bar(total=total, desc="timing steps", unit="forward") as bar:
        for context in args.contexts:
            trees = {(context, n): probe_tree(n, "flat", ids) for n in SIZES}
            warm_up(backends, ids[:context + 1].tolist(), trees)
            times.update(time_scores(backends, trees, args.rounds, CLOCKS[args.clock], bar))
    return medians(times)


def table(medians: dict, contexts: list[int]) -> str:
    lines = ["| cached tokens | tree nodes | concat ms | buffer ms | buffer / concat |",
             "|---|---|---|---|---|"]
    for context in contexts:
        for n in SIZES:
            concat, buffer = medians[f"concat {context} {n}"], medians[f"buffer {context} {n}"]
            lines.append(f"| {context} | {n} | {concat * 1e3:.2f} | {buffer * 1e3:.2f} "
                         f"| {buffer / concat:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = timing_parser(__doc__.splitlines()[0], rounds=15)
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 2048, 4096],
                        help="tokens in the cache the step attends to")
    args = parser.parse_args()
    measured = measure(args)
    text = (f"{args.model}, {args.threads} thread(s), {args.clock} clock, median of {args.rounds}, "
            f"flat trees (0 nodes = a plain step), `kv` (buffer) against `kv(cache='concat')`\n\n"
            + table(measured, args.contexts))
    report(text, measured, args.out)


if __name__ == "__main__":
    main()
