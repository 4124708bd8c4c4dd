"""Cost models of one step against the packed tree size N (root included), for tree builders that size trees.

As in the STree paper's analysis: a pure SSM target costs t = k N + C (every layer is linear in N), a
hybrid with attention costs t = a N^2 + b N + c (the tree's attention block is quadratic). Both are the
core's `PolynomialCost`, whose variable is that packed size. `calibrate` times a backend on the current
machine and model and fits the form; `default_cost_model` (what `SSMTreeBackend.cost_model()` returns)
scales the fits measured on this project's reference CPU by the model's layer count and layer width.
It pads them as the backend pads small trees (`min_rows`). Those defaults only rank tree sizes
roughly; calibrate for decisions that matter.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from specframe import CostModel, PolynomialCost

if TYPE_CHECKING:
    import torch

# Fits of one `score` call (process CPU seconds, 1 thread, float32) measured by a one-off script
# (`benchmarks/measure_ssm_tree.py`, no longer kept: git history has it)
# on random models with Mamba2-2.7B layer dims (d_model 2560, 80 x 64 heads, N 128, vocab 50288), full
# binary trees of N = 3..63 packed nodes after a 128-token prefix (docs/results/conclusions.md).
# kind -> (coefficients, highest power first; layers of the measured model)
REFERENCE_FITS = {
    "ssm-tree": {"ssm": ((6.442e-3, 1.384e-1), 4), "hybrid": ((8.633e-5, 7.029e-3, 2.849e-1), 10)},
    "ssm-unrolled": {"ssm": ((6.230e-2, -1.667e-1), 4), "hybrid": ((3.096e-4, 8.047e-2, 1.361e-2), 10)},
}
REFERENCE_WIDTH = 2560 * 10576  # d_model x in_proj outputs of one Mamba2-2.7B layer


def layer_counts(model) -> tuple[int, int, float]:
    """(recurrent layers, attention layers, width ratio vs a Mamba2-2.7B layer) of a transformers model."""
    from specframe_ssm.layout import ATTENTION_TYPES, PARALLEL_TYPE, RECURRENT_TYPES, recurrent_layers

    types = list(model.config.layer_types)
    mixer = recurrent_layers(model)[0][1]
    width = input_width(mixer) / REFERENCE_WIDTH
    recurrent = sum(t in RECURRENT_TYPES or t == PARALLEL_TYPE for t in types)
    return recurrent, sum(t in ATTENTION_TYPES or t == PARALLEL_TYPE for t in types), width


def input_width(mixer: torch.nn.Module) -> int:
    """Weights of a recurrent layer's input projections (Mamba2's in_proj; gated DeltaNet's q, k, v, gate,
    a and b projections, fused or not): every linear map but the output projection."""
    import torch

    return sum(m.weight.numel() for name, m in mixer.named_children()
               if isinstance(m, torch.nn.Linear) and name not in ("out_proj", "o_proj"))


def default_cost_model(backend: str, model, min_rows: int = 1) -> CostModel:
    """The reference fit of backend `backend` for the model's kind (ssm or hybrid), scaled by its layers
    and layer width; with `min_rows` > 1, priced as the backend runs it: a tree of fewer rows (root
    included) is padded up to `min_rows`, so it costs what that many rows cost (the fits were measured
    unpadded)."""
    from specframe.kit.backend import PaddedCost  # imports torch: only when a cost is asked for

    ssm, attention, width = layer_counts(model)
    coefficients, layers = REFERENCE_FITS[backend]["hybrid" if attention else "ssm"]
    scale = (ssm + attention) / layers * width
    fit = PolynomialCost(tuple(c * scale for c in coefficients))
    return fit if min_rows <= 1 else PaddedCost(fit, min_rows)


def full_binary_tree(depth: int) -> list[int]:
    """Parents of the nodes of a full binary tree of `depth` levels counting the root, as the STree paper
    counts them: depth 4, 5, 6 give 15, 31, 63 packed nodes (root included), i.e. 14, 30, 62 tree nodes."""
    parents: list[int] = []
    level = [-1]
    for _ in range(depth - 1):
        nxt = []
        for p in level:
            for _ in range(2):
                parents.append(p)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def calibrate(backend, prompt: list[int], depths=(2, 3, 4, 5), repeats: int = 3) -> PolynomialCost:
    """Time `backend.score` on full binary trees after prefilling `prompt`; fit the paper's model form.

    The degree is 2 when the target has attention layers, else 1 (in the packed size, root included).
    """
    from specframe import TokenTree

    backend.prefill(prompt)
    sizes, seconds = [], []
    for depth in depths:
        parents = full_binary_tree(depth)
        tree = TokenTree(np.zeros(len(parents), np.int64) + prompt[-1], np.array(parents))
        backend.score(tree)  # warm-up
        best = min(_timed(backend.score, tree) for _ in range(repeats))
        sizes.append(len(tree) + 1)
        seconds.append(best)
    return PolynomialCost.fit(sizes, seconds, 2 if backend.layout.hybrid else 1)


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start
