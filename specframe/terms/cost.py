"""Cost models: the predicted time of one verification step, which tree builders weigh against gains.

A `StateBackend` may offer one (`StateBackend.cost_model`); the decode loop passes it to the tree
builder in its `BuildContext`. Builders that fill a fixed budget ignore it; builders that size trees by
what pays use `step_seconds`. The measured CPU costs behind the defaults are in
`docs/explanation/metrics-and-costs.md`.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

import numpy as np


class CostModel(ABC):
    """Predicted wall-clock seconds of one step (`score` on the tree, then verify and commit)."""

    @abstractmethod
    def step_seconds(self, nodes: int, depth: int = 0) -> float:
        """Seconds of a step on a tree of `nodes` nodes (the root not counted) and `depth` levels."""

    def many(self, nodes: np.ndarray, depths: np.ndarray) -> np.ndarray:
        """`step_seconds` for arrays of sizes and depths; (K,), (K,) -> (K,). Override when it can be
        computed at once (tree selection calls it every step)."""
        return np.array([self.step_seconds(int(n), int(d)) for n, d in zip(nodes, depths)])

    def at_context(self, context: int) -> CostModel:
        """This model for a step whose tree attends to `context` tokens (the prompt and the output so
        far). A model that does not depend on the context returns itself."""
        return self


@dataclass(frozen=True)
class PolynomialCost(CostModel):
    """t = polyval(coefficients, nodes + 1): a polynomial in the packed size (root included).

    Degree 1 fits a model whose every layer is linear in the tree size (pure SSM targets, or attention
    while the prefix dominates); degree 2 adds the tree's quadratic attention block.
    """

    coefficients: tuple[float, ...]  # highest power first

    def step_seconds(self, nodes: int, depth: int = 0) -> float:
        return float(max(np.polyval(self.coefficients, nodes + 1), 0.0))

    @classmethod
    def fit(cls, packed_sizes, seconds, degree: int) -> PolynomialCost:
        """Least-squares fit of a degree-`degree` polynomial in the packed size."""
        return cls(tuple(float(c) for c in np.polyfit(np.asarray(packed_sizes, float),
                                                      np.asarray(seconds, float), degree)))


@dataclass(frozen=True)
class MeasuredCost(CostModel):
    """Step times measured at a grid of tree sizes, for flat trees (every node a child of the root) and
    chains, interpolated in size and, by depth, between the two shapes; and, when measured at a second
    context length too, linear in the context.

    Measured, not a formula: on a CPU a forward over 2 tokens can be slower than over 4 (a matrix-multiply
    kernel choice), and a chain can be cheaper than a flat tree of the same size (no tree mask). Sizes past
    the grid extrapolate the last segment. The rest of a step (verify, commit, the loop) is not in
    it: the adaptive planner learns that from realised steps.

    Every node of a tree attends to every cached token, so a tree's extra cost over a plain step grows
    with the context: for SmolLM2 on two CPU threads a 16-node tree costs 1.37 plain steps at 129 tokens
    and about 1.8 at 2,049 (docs/explanation/metrics-and-costs.md). Attention's work is linear in the context,
    so `at_context` moves each size's time along its measured slope (seconds per context token).
    """

    sizes: tuple[int, ...]  # tree nodes, increasing, starting at 0
    flat_s: tuple[float, ...]  # seconds of `score` on a flat tree of each size, at `context` tokens
    chain_s: tuple[float, ...]  # seconds of `score` on a chain of each size, at `context` tokens
    context: int = 0  # tokens the trees attended to (cached ones and the root); 0: not recorded
    flat_slope: tuple[float, ...] = ()  # extra seconds per context token, by size (empty: no slope)
    chain_slope: tuple[float, ...] = ()
    min_rows: int = 1  # rows the backend padded every forward to while measured (1: none)
    # A plain step's seconds alone and padded to `specframe.runtime.devices.CPU_MIN_ROWS` rows, where the
    # calibration measured both to choose `min_rows` (`specframe.runtime.devices.padded_rows`); empty: not
    # measured.
    padding_s: tuple[float, ...] = ()

    def at_context(self, context: int) -> MeasuredCost:
        """The curves at `context` tokens, along the measured slopes (itself without slopes)."""
        if not self.flat_slope or context == self.context:
            return self
        shift = max(context, 0) - self.context  # below the measured context: at most halve (noisy slopes)
        flat = tuple(max(t + shift * k, t / 2) for t, k in zip(self.flat_s, self.flat_slope))
        chain = tuple(max(t + shift * k, t / 2) for t, k in zip(self.chain_s, self.chain_slope))
        return replace(self, flat_s=flat, chain_s=chain, context=context)

    def step_seconds(self, nodes: int, depth: int = 0) -> float:
        # In plain Python: the planner asks for single sizes several times a step, and numpy's
        # per-call setup would cost tens of microseconds each time.
        flat, chain = (_interpolate_one(self.sizes, ys, nodes) for ys in (self.flat_s, self.chain_s))
        weight = min(max((depth - 1) / max(nodes - 1, 1), 0.0), 1.0)
        return max(flat + weight * (chain - flat), 0.0)

    def many(self, nodes: np.ndarray, depths: np.ndarray) -> np.ndarray:
        flat, chain = (_interpolate(self.sizes, ys, nodes) for ys in (self.flat_s, self.chain_s))
        weight = np.clip((depths - 1) / np.maximum(nodes - 1, 1), 0.0, 1.0)  # 0: flat, 1: chain
        return np.maximum(flat + weight * (chain - flat), 0.0)


@dataclass(frozen=True)
class ScaledCost(CostModel):
    """`base` times `factor`, and times `by_size[n]` for a tree of n nodes (sizes past its end take its
    last entry; empty: 1): a calibrated cost brought to the speed the machine shows now (the adaptive
    planner's running ratio of realised to calibrated forward time, and each size's own ratio to that)."""

    base: CostModel
    factor: float
    by_size: np.ndarray = field(default_factory=lambda: np.ones(0), compare=False)

    def step_seconds(self, nodes: int, depth: int = 0) -> float:
        return self.factor * self._size_factor(nodes) * self.base.step_seconds(nodes, depth)

    def many(self, nodes: np.ndarray, depths: np.ndarray) -> np.ndarray:
        shape = self.by_size[np.minimum(nodes, len(self.by_size) - 1)] if len(self.by_size) else 1.0
        return self.factor * shape * self.base.many(nodes, depths)

    def at_context(self, context: int) -> CostModel:
        return ScaledCost(self.base.at_context(context), self.factor, self.by_size)

    def _size_factor(self, nodes: int) -> float:
        return float(self.by_size[min(nodes, len(self.by_size) - 1)]) if len(self.by_size) else 1.0


@dataclass(frozen=True)
class PaddedCost(CostModel):
    """`base` for a forward that a backend pads with throwaway rows up to `rows` rows (root included; see
    `specframe.runtime.devices.forward_min_rows`): a tree of fewer nodes costs what `rows - 1` nodes cost. For
    models fitted or measured without padding, such as `specframe_ssm.cost`'s reference fits."""

    base: CostModel
    rows: int

    def step_seconds(self, nodes: int, depth: int = 0) -> float:
        return self.base.step_seconds(max(nodes, self.rows - 1), depth)

    def many(self, nodes: np.ndarray, depths: np.ndarray) -> np.ndarray:
        return self.base.many(np.maximum(nodes, self.rows - 1), depths)

    def at_context(self, context: int) -> CostModel:
        return PaddedCost(self.base.at_context(context), self.rows)


def _interpolate_one(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """`_interpolate` at one point."""
    if len(xs) < 2 or x <= xs[0]:
        return float(ys[0])
    i = min(bisect.bisect_right(xs, x), len(xs) - 1)  # the segment [xs[i - 1], xs[i]], the last past it
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _interpolate(xs, ys, x: np.ndarray) -> np.ndarray:
    """Piecewise-linear through (xs, ys), extended linearly past the last point."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    inside = np.interp(x, xs, ys)
    if len(xs) < 2:
        return inside
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), inside)
