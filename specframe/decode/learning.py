"""What a planner learns from each step of a row, the same alone and in a batch: which nodes the target
accepted (`CutRecord`), how far into a scored tree it accepts (`PositionHits`), what drafting costs
(`DraftingTime`), and from those the draft size of most tokens per second (`best_size`); and from each
step, what a forward of so many rows costs today against the calibration (`ForwardSpeed`).

`AdaptivePlanner`'s rows (`RowPlan`) keep these records, alone or in a batch; what differs is only what
a step costs a row: a step alone, or its share of a batch step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specframe.decode.acceptance import AcceptanceModel, NodeFeatures, matched_outcomes
from specframe.decode.drafting import CHEAP_DRAFT, EMA, DecayedLine
from specframe.terms.records import VerifyResult
from specframe.terms.tree import TokenTree


@dataclass
class CutRecord:
    """One row's step as the acceptance model learns from it: the features of the nodes scored, what the
    model predicted for them where a cut asked (`predict`), and, when a cut dropped nodes, the tree before
    the cut with its features."""

    features: NodeFeatures | None = None  # of the nodes kept (None: the tree is not pruned by features)
    built: TokenTree | None = None  # the tree before the cut, when the cut dropped nodes
    built_features: NodeFeatures | None = None
    predicted: np.ndarray | None = None  # the kept nodes' predicted conditional acceptance, once predicted

    def predict(self, acceptance: AcceptanceModel) -> np.ndarray:
        """The nodes' conditional acceptance as `acceptance` predicts it, kept with the record (and cut
        with its nodes) until `learn`."""
        self.predicted = acceptance.predict(self.features)
        return self.predicted

    def cut(self, tree: TokenTree, keep: np.ndarray) -> TokenTree:
        """Keep the nodes `keep` (ascending, closed under parents) of `tree`, whose features `features`
        holds; the whole tree is remembered for `learn`. Returns the kept subtree."""
        if len(keep) == len(tree):
            return tree
        self.built, self.built_features = tree, self.features
        self.features = self.features.take(keep)
        if self.predicted is not None:
            self.predicted = self.predicted[keep]
        return tree.subtree(keep)

    def learn(self, acceptance: AcceptanceModel, tree: TokenTree, result: VerifyResult,
              matches_draws: bool) -> None:
        """Count which nodes the target accepted, then forget the step. Where the step matched the target's
        draws (`matches_draws`, or a verifier that fell back to sample-and-match), the nodes the cut left
        out count too (`matched_outcomes`): learning only from the nodes it keeps, the model would never
        see that the ones it leaves out pay more than it thinks."""
        if self.built is not None and (matches_draws or result.fallback is not None):
            emitted = [*tree.tokens[result.path].tolist(), result.bonus]
            acceptance.record(self.built_features, *matched_outcomes(
                self.built.tokens, self.built.parents, self.built.depth, emitted))
        elif self.features is not None and len(tree):
            acceptance.update(self.features, tree.parents, result.path)
        self.features = self.built = self.built_features = self.predicted = None


def count_positions(position_hits: np.ndarray, tree: TokenTree, result: VerifyResult) -> None:
    """Add a scored tree to the [accepted, tried] counts by index position (`tokens_by_size` reads them)."""
    if len(tree):
        position_hits[1, :len(tree)] += 1
        position_hits[0, :result.accepted] += 1


@dataclass
class DraftingTime:
    """Running means of drafting's seconds: per drafted step, and per node it proposed."""

    step_s: float = 0.0
    node_s: float = 0.0

    def add(self, seconds: float, proposed: int) -> None:
        """A step drafted `proposed` nodes in `seconds`."""
        self.step_s += EMA * (seconds - self.step_s)
        if proposed:
            self.node_s += EMA * (seconds / proposed - self.node_s)

    def dear(self, plain_s: float) -> bool:
        """Whether drafting costs over `CHEAP_DRAFT` of a plain step of `plain_s` seconds."""
        return self.step_s > CHEAP_DRAFT * plain_s


def best_size(tokens: np.ndarray, seconds: np.ndarray) -> int:
    """The draft size n >= 1 of most tokens per second, given the expected tokens and the seconds of a step
    with n nodes for n = 0 .. cap (size 0 is what not drafting gives; whether to draft is decided apart)."""
    return 1 + int(np.argmax((tokens / seconds)[1:]))


DEPTH_BUCKETS = 8  # depth 8 and deeper share a bucket
CALIBRATION_MEMORY = 0.995  # each step's weight one step later
CALIBRATION_PRIOR = 4.0  # pseudo-nodes at which predictions count as right before any step


class DepthCalibration:
    """Realised over predicted acceptance of the nodes a cut kept, by depth, and predictions scaled by it.

    A cut keeps the nodes whose predicted acceptance is highest, so among the nodes it keeps the noisy
    estimates that came out high are over-represented: predictions for kept nodes run high on average (a
    winner's curse), the more so where a node's estimate rests on fewer counts, at the deep tails. Kept nodes
    whose parent was accepted count: their predicted conditional acceptance against whether they were
    accepted, summed by depth with older steps weighing `CALIBRATION_MEMORY` less each step, and
    `CALIBRATION_PRIOR` pseudo-nodes of agreement. `scaled` multiplies a prediction by its depth's ratio,
    at most 1, so a path's probability still never grows from parent to child."""

    def __init__(self):
        self.sums = np.zeros((2, DEPTH_BUCKETS))  # [accepted, predicted] of kept nodes whose parent was

    def ratio(self) -> np.ndarray:
        accepted, predicted = self.sums
        return (accepted + CALIBRATION_PRIOR) / (predicted + CALIBRATION_PRIOR)

    def scaled(self, conditional: np.ndarray, depth: np.ndarray) -> np.ndarray:
        """`conditional` (each node's predicted acceptance given its parent's) times its depth's ratio."""
        return np.minimum(conditional * self.ratio()[_buckets(depth)], 1.0)

    def add(self, conditional: np.ndarray, tree: TokenTree, path: list[int]) -> None:
        """A step scored `tree`, whose nodes were predicted `conditional` (unscaled), and accepted `path`."""
        self.sums *= CALIBRATION_MEMORY
        if not len(tree):
            return
        accepted = np.zeros(len(tree), bool)
        accepted[list(path)] = True
        parents = tree.parents
        tried = (parents < 0) | accepted[np.maximum(parents, 0)]  # the parent was accepted (or is the root)
        buckets = _buckets(tree.depth[tried])
        np.add.at(self.sums[0], buckets, accepted[tried])
        np.add.at(self.sums[1], buckets, conditional[tried])


def _buckets(depth: np.ndarray) -> np.ndarray:
    return np.clip(np.asarray(depth, np.int64), 1, DEPTH_BUCKETS) - 1


# Each size of forward the calibration timed also learns its own realised over calibrated time, beyond the
# machine's speed as a whole: a busy spell slows sizes unevenly (a plain step far more than a 12-node
# tree, on a shared 2-core CPU), so a calibration is off in its shape, not only its level
# ("Each size's own speed" in docs/explanation/adaptive-speculation.md). It learns more slowly than the
# speed: a size is seen on a share of the steps only, and a step's time is noisy.
SHAPE_EMA = 0.05

# How much larger than any forward timed (by query rows) the planner may choose one: see
# `ForwardSpeed.trusted`.
TRUST_GROWTH = 2


class ForwardSpeed:
    """A forward's realised seconds over its calibrated ones, by the query rows it computed: the machine's
    speed today (`level`, a running mean over forwards of sizes the calibration timed), times, for those
    (up to `calibrated_rows`: one sequence's tree of the cap), that size's own ratio to the level
    (a running mean over forwards of that size; 1 for sizes not run, which keep the calibrated shape), and
    past them, a line in the rows beyond (least squares, each forward weighing `memory` as much one
    forward later; at least 0.25, and the last timed size's ratio before any such forward).

    The calibration times one sequence's trees, where a CPU forward is bound by reading the weights; a
    batch's forwards take more rows, where the arithmetic grows with every row, so a factor learned at
    the calibrated sizes would misprice them (at batch 8 in float32 on a CPU a planner with one factor
    kept large trees that cost more than they gained: docs/results/conclusions.md). Within the calibrated
    sizes a line would instead extrapolate the noise of the sizes run to those not run: alone, it priced
    larger trees above what they cost and kept smaller ones (docs/results/conclusions.md)."""

    def __init__(self, calibrated_rows: int, memory: float = 0.97):
        self.calibrated_rows = calibrated_rows
        self.level = 1.0
        self.shape = np.ones(calibrated_rows + 1)  # by rows, up to `calibrated_rows`
        self.beyond = DecayedLine(memory, floor=0.25)  # by rows past `calibrated_rows`, over the level
        self.seen_beyond = False
        self.largest = calibrated_rows  # the most query rows of a forward timed, calibrated or realised

    def trusted(self, rows: int) -> bool:
        """Whether a forward of `rows` query rows is priced from times near its size: at most
        `TRUST_GROWTH` times the largest forward timed. Past it the line in the rows is a guess (at
        batch 16 on a CPU, one fitted on forwards of a few dozen rows priced one of a few hundred far
        below its time: docs/results/conclusions.md), so the planner grows into larger forwards step by
        step, each timed before a larger one is priced."""
        return rows <= TRUST_GROWTH * self.largest

    def add(self, rows: int, ratio: float) -> None:
        """A forward of `rows` query rows took `ratio` times its calibrated seconds."""
        self.largest = max(self.largest, rows)
        if rows <= self.calibrated_rows:
            self.level += EMA * (ratio - self.level)
            self.shape[rows] += SHAPE_EMA * (ratio / max(self.level, 1e-12) - self.shape[rows])
        else:
            self.beyond.add(rows - self.calibrated_rows, ratio / max(self.level, 1e-12))
            self.seen_beyond = True

    def factor(self, rows):
        """The factor for forwards of `rows` query rows (an int or an array of them)."""
        rows = np.asarray(rows).astype(np.int64)
        within = self.shape[np.minimum(rows, self.calibrated_rows)]
        if self.seen_beyond:
            past = self.beyond.at(np.maximum(rows - self.calibrated_rows, 0))
            within = np.where(rows <= self.calibrated_rows, within, past)
        factor = self.level * within
        return float(factor) if factor.ndim == 0 else factor
