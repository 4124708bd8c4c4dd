"""What a backend's own batch saves over `RowByRow`: one step of B rows scored in one forward, against the
same rows scored one after the other.

Loads the target once, adds the same B prompts (random tokens, of different lengths) to the backend's
batch (`StateBackend.batch()`: `SSMRows` for `ssm-tree`, `KVRows` for `kv`) and to `RowByRow` of the same
backend, then times steps of both, alternating: each step scores every row's chain (of different
lengths, a plain step among them) and commits it whole with a bonus token, so the states grow as in
decoding. Prints the median step of each, their ratio, and the largest difference between the two
batches' logits (a row's scores together and alone).

    OMP_NUM_THREADS=1 python benchmarks/batch_rows.py --model smollm2-135m-hybrid --backend ssm-tree
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import specframe
from specframe import TokenTree
from specframe.contract.interfaces import RowByRow
from specframe.plugging.pipeline import assemble
from specframe.terms.metrics import CLOCKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-hybrid")
    parser.add_argument("--backend", default="ssm-tree")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    parser.add_argument("--steps", type=int, default=12, help="steps timed per batch")
    parser.add_argument("--prompts", default="40,90,15,64", help="prompt lengths, one per row")
    parser.add_argument("--trees", default="0,3,6,8", help="chain lengths, one per row")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    target = specframe.load_target(args.model, device="cpu")
    backend = assemble(target, backend=args.backend).backend
    rng = np.random.default_rng(0)
    lengths, sizes = ([int(n) for n in text.split(",")] for text in (args.prompts, args.trees))
    prompts = [rng.integers(0, target.vocab_size, n).tolist() for n in lengths]
    batches = {type(backend.batch()).__name__: backend.batch(), "RowByRow": RowByRow(backend)}
    rows = {name: [batch.add(p) for p in prompts] for name, batch in batches.items()}
    times = {name: [] for name in batches}
    worst = 0.0
    for step in range(args.steps + 2):
        trees = [TokenTree(rng.integers(0, target.vocab_size, n), np.arange(n) - 1) for n in sizes]
        bonus = [int(rng.integers(0, target.vocab_size)) for _ in sizes]
        scores = {}
        for name, batch in batches.items():
            start = clock()
            scored = batch.score(dict(zip(rows[name], trees)))
            batch.commit({row: (scored[row], list(range(len(tree))), b)
                          for row, tree, b in zip(rows[name], trees, bonus)})
            if step >= 2:  # the first steps warm the kernels up
                times[name].append(clock() - start)
            scores[name] = [scored[row].logits for row in rows[name]]
        together, alone = scores.values()
        worst = max(worst, max(float((a - b).abs().max()) for a, b in zip(together, alone)))
    (fast, one), (slow, rest) = ((name, float(np.median(t)) * 1e3) for name, t in times.items())
    print(f"{args.model} on `{args.backend}`, {len(prompts)} rows (prompts {args.prompts}, chains "
          f"{args.trees}), {args.threads} thread(s), {args.clock} clock, median of {args.steps} steps "
          f"(score + commit), alternating\n\n| batch | ms per step |\n|---|---|\n| `{fast}` | {one:.1f} |\n"
          f"| `{slow}` | {rest:.1f} |\n| {slow} / {fast} | {rest / one:.2f} |\n\n"
          f"largest |logit difference| between the two: {worst:.2e}")

if __name__ == "__main__":
    main()
