"""Runtime models of one `score` call against the packed tree size N, for tree builders that size trees.

As in the STree paper's analysis: a pure SSM target costs t = k N + C (every layer is linear in N), a
hybrid with attention costs t = a N^2 + b N + c (the tree's attention block is quadratic). `fit` fits
either form to timings; `calibrate` times a backend on the current machine and model; `default_cost_model`
returns per-layer coefficients measured on this project's reference CPU (2 cores, benchmarks/
bench_ssm_tree.py, Mamba2-2.7B layer dimensions), scaled by layer counts and layer width. Those defaults
only rank tree sizes roughly; calibrate for decisions that matter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

# Seconds per layer at Mamba2-2.7B layer dims (d_model 2560, 80x64 heads, N 128), float32, 2 CPU cores.
# Polynomial coefficients in N (packed nodes, root included), highest power first. Measured with
# `python benchmarks/measure_ssm_tree.py` (docs/results/ssm-tree.md).
REFERENCE_PER_LAYER = {
    "ssm-tree": {"ssm": (1.0e-3, 8.0e-3), "attention": (0.0, 4.0e-4, 4.0e-3)},
    "ssm-unrolled": {"ssm": (3.0e-3, 8.0e-3), "attention": (0.0, 1.0e-3, 4.0e-3)},
}
REFERENCE_WIDTH = 2560 * 10576  # d_model x in_proj outputs of one Mamba2-2.7B layer


@dataclass(frozen=True)
class RuntimeModel:
    """t(N) = polyval(coefficients, N) seconds; linear for SSM targets, quadratic for hybrids."""

    coefficients: tuple[float, ...]  # highest power first

    def predict(self, nodes: int | np.ndarray) -> float | np.ndarray:
        return np.polyval(self.coefficients, nodes)

    def __call__(self, nodes):
        return self.predict(nodes)

    @classmethod
    def fit(cls, nodes, seconds, degree: int) -> RuntimeModel:
        """Least-squares fit of a degree-`degree` polynomial (1: k N + C, 2: a N^2 + b N + c)."""
        return cls(tuple(float(c) for c in np.polyfit(np.asarray(nodes, float), np.asarray(seconds, float),
                                                       degree)))


def layer_counts(model) -> tuple[int, int, float]:
    """(Mamba2 layers, attention layers, width ratio vs a Mamba2-2.7B layer) of a transformers model."""
    from specframe_ssm.layout import ATTENTION_TYPES, SSM_TYPE

    types = list(model.config.layer_types)
    mixer = next(m for m in model.modules() if hasattr(m, "A_log"))
    width = mixer.in_proj.in_features * mixer.in_proj.out_features / REFERENCE_WIDTH
    return types.count(SSM_TYPE), sum(t in ATTENTION_TYPES for t in types), width


def default_cost_model(backend: str, model=None) -> RuntimeModel:
    """The reference per-layer coefficients, summed over the model's layers (one SSM layer if no model)."""
    per_layer = REFERENCE_PER_LAYER[backend]
    ssm, attention, width = (1, 0, 1.0) if model is None else layer_counts(model)
    coeffs = ssm * width * np.array((0.0, *per_layer["ssm"])) + attention * width * np.array(per_layer["attention"])
    if attention == 0:
        coeffs = coeffs[1:]  # t = k N + C
    return RuntimeModel(tuple(float(c) for c in coeffs))


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


def calibrate(backend, prompt: list[int], depths=(2, 3, 4, 5), repeats: int = 3) -> RuntimeModel:
    """Time `backend.score` on full binary trees after prefilling `prompt`; fit the paper's model form.

    The degree is 2 when the target has attention layers, else 1. N counts the root.
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
    return RuntimeModel.fit(sizes, seconds, 2 if backend.layout.hybrid else 1)


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start
