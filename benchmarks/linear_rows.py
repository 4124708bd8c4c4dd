"""Where a tree's seventh row gets expensive on the CPU: each of SmolLM2's linear shapes, by row count.

A verification step on the CPU costs about the same for 1 to 6 rows (root included) and jumps at 7
(`docs/explanation/metrics-and-costs.md`). This times the products alone, per layer shape, weighted by
how often one forward runs each (30 layers: q and o, k and v, gate and up, down; the LM head once), on
random float32 weights, to tell whether another way to multiply would move that jump:

- `onednn`: the weight packed once for oneDNN, as `specframe.runtime.packed_linear` runs it;
- `onednn@16`: packed with a hint of 16 rows (`torch.ops.mkldnn._reorder_linear_weight`'s batch size);
- `blocks of 6`: the rows multiplied 6 at a time by the packed weight (each block streams the weights);
- `mkl`: MKL's packed product (`torch.ops.mkl._mkl_linear`), packed for 16 rows;
- `stream`: specframe's own kernel for up to 12 rows (`specframe_kernels.stream_linear`, AVX-512 CPUs
  only; `SPECFRAME_CPU_LINEAR=stream`), which reads each weight once for all rows.

Each shape runs over as many distinct layers as fit in 600 MB, so weights come from memory as in a real
forward. Wall clock, best of `--repeats`; run it on an otherwise idle machine.

    OMP_NUM_THREADS=1 python benchmarks/linear_rows.py --threads 1 --out results/linear-rows
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specframe.support.progress import bar as progress_bar
from specframe_kernels import stream_linear

# name -> (inputs, outputs, products per forward)
SHAPES = {"q, o": (576, 576, 60), "k, v": (576, 192, 60), "gate, up": (576, 1536, 60),
          "down": (1536, 576, 30), "LM head": (576, 49152, 1)}
ROWS = (1, 2, 4, 6, 7, 8, 10, 12, 16)
WAYS = ("onednn", "onednn@16", "blocks of 6", "mkl") + (("stream",) if stream_linear.available() else ())


def product(way: str, weight: torch.Tensor):
    """A function of x computing x @ weight.T the way `way` says."""
    if way == "stream":  # 16 rows: the kernel's 12, then 4
        streamed = stream_linear.pack(weight)
        return lambda x: torch.cat([stream_linear.linear(x[start:start + stream_linear.MAX_ROWS], streamed)
                                    for start in range(0, len(x), stream_linear.MAX_ROWS)])
    if way == "mkl":
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, 16)
        return lambda x: torch.ops.mkl._mkl_linear(x, packed, weight, None, 16)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 16 if way == "onednn@16" else None)
    one = lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")  # noqa: E731
    if way == "blocks of 6":
        return lambda x: torch.cat([one(x[start:start + 6]) for start in range(0, len(x), 6)])
    return one


def measure(repeats: int) -> dict[str, dict[str, list[float]]]:
    """way -> shape -> ms per forward at each of `ROWS`."""
    out = {way: {} for way in WAYS}
    with torch.no_grad(), progress_bar(total=len(WAYS) * len(SHAPES), desc="timing", unit="shape") as bar:
        for name, (inputs, outputs, per_forward) in SHAPES.items():
            layers = max(1, min(per_forward, int(600e6 / (inputs * outputs * 4))))
            weights = [torch.randn(outputs, inputs) for _ in range(layers)]
            for way in WAYS:
                products = [product(way, w) for w in weights]
                ms = []
                for rows in ROWS:
                    x = torch.randn(rows, inputs)
                    for f in products:  # warm-up
                        f(x)
                    best = float("inf")
                    for _ in range(repeats):
                        start = time.perf_counter()
                        for f in products:
                            f(x)
                        best = min(best, (time.perf_counter() - start) / layers)
                    ms.append(best * per_forward * 1e3)
                out[way][name] = ms
                bar.update()
    return out


def table(times: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| way | shape | " + " | ".join(f"{r} rows" for r in ROWS) + " |",
             "|---|---|" + "---|" * len(ROWS)]
    for way, shapes in times.items():
        for name, ms in shapes.items():
            lines.append(f"| {way} | {name} | " + " | ".join(f"{t:.1f}" for t in ms) + " |")
        total = [sum(ms[i] for ms in shapes.values()) for i in range(len(ROWS))]
        lines.append(f"| **{way}** | **all** | " + " | ".join(f"**{t:.1f}**" for t in total) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    times = measure(args.repeats)
    text = (f"ms per forward of SmolLM2-135M's linear products, float32, {args.threads} thread(s), wall "
            f"clock, best of {args.repeats}\n\n" + table(times))
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"threads-{args.threads}.md").write_text(text + "\n")
        (args.out / f"threads-{args.threads}.json").write_text(json.dumps(times, indent=1))


if __name__ == "__main__":
    main()
