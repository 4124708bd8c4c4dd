"""`budget="auto"` at batch B: every row's tree sized at once for the batch's most tokens per second.

Alone, a step over a subtree S emits E(S) = 1 + sum of P_i over its nodes and takes t(|S|) seconds
(`specframe.decode.selection`). In a batch of R rows, one forward scores every row's root and kept nodes,
so the step emits R + sum of P_i over all kept nodes of all rows and takes T(R + k) seconds for k kept
nodes in all. The k nodes of largest P, over all rows (parents before children within a row: P never
grows from a parent to a child), maximise the tokens for that k; the planner keeps the k of most
tokens per second. So a row whose drafts are unlikely keeps nothing (a plain step for it) while a row
in a long copied span keeps a deep chain, and as B grows each node must be likelier to pay: the rows
already fill the forward's matrix products, and a node adds nearly a full row's cost.

T prices the forwards the batch runs for those trees (`BatchBackend.forward_rows`: `kv` pads every row of a
forward to its widest tree, so nodes that fill a row up to the widest are free, and RowByRow runs one
forward per row) with the backend's calibrated single-sequence cost: a forward of n query rows costs what
a tree of n - 1 nodes costs alone, times a factor learned from the realised forwards as a line in their
rows (`SpeedByRows`: attention over R contexts, and products of more rows than the calibration timed),
plus the step's overhead besides the forward. Acceptance is one
`AcceptanceModel` for every row, as alone. Rows draft to the cap (drafting is per row and not sized first
here) and sampled trees verified with their q (`plans_blind`) are kept whole, their size being the cap.
"""

from __future__ import annotations

import numpy as np

from specframe.decode.acceptance import AcceptanceModel, NodeFeatures, matched_outcomes
from specframe.decode.planner import EMA, CostAtContext, DecayedLine
from specframe.decode.selection import path_probabilities
from specframe.contract.interfaces import BatchBackend
from specframe.terms.cost import CostModel
from specframe.terms.proposal import DraftProposal
from specframe.terms.records import Prediction, VerifyResult
from specframe.terms.tree import TokenTree


class RowPlan:
    """A row's side of the batch planner, with the interface `RequestRow` calls (as a planner's): it
    drafts to the cap and defers the cut to `BatchPlanner.cut`, then learns acceptance from its row."""

    def __init__(self, planner: BatchPlanner):
        self.planner = planner
        self.blind = False
        self.proposal = DraftProposal.empty()
        self.built: TokenTree | None = None  # the tree before the cut, when it was cut
        self.built_features: NodeFeatures | None = None
        self.features: NodeFeatures | None = None  # of the kept nodes

    @property
    def cost(self) -> CostModel | None:
        return self.planner.cost

    def start_request(self, blind: bool = False) -> None:
        self.blind = blind

    def start_step(self, context: int) -> None:
        self.planner.contexts.append(context)

    def should_draft(self) -> bool:
        return True

    def build_budget(self, room: int) -> int:
        return min(self.planner.cap, room)

    def choose(self, proposal: DraftProposal, tree: TokenTree) -> tuple[TokenTree, Prediction | None]:
        self.proposal, self.built, self.built_features = proposal, None, None
        prunable = not self.blind and tree.origin is not None and len(tree) > 0
        self.features = NodeFeatures.of(proposal, tree.origin, tree.depth) if prunable else None
        return tree, None  # cut with every row's tree in view: `BatchPlanner.cut`

    def observe(self, tree: TokenTree, result: VerifyResult, times: dict[str, float]) -> None:
        """Learn which nodes the target accepted (also those the cut left out, where the step matched the
        target's draws: `AdaptivePlanner` learns the same way)."""
        acceptance = self.planner.acceptance
        if self.built is not None and (self.planner.matches_draws or result.fallback is not None):
            emitted = [*tree.tokens[result.path].tolist(), result.bonus]
            acceptance.record(self.built_features, *matched_outcomes(
                self.built.tokens, self.built.parents, self.built.depth, emitted))
        elif self.features is not None and len(tree):
            acceptance.update(self.features, tree.parents, result.path)
        self.features = self.built = self.built_features = None


class SpeedByRows(DecayedLine):
    """The realised forward over the calibrated one as a + b * rows (the query rows the forward computed),
    least squares over batch steps, each weighing `memory` as much one step later; at least 0.25, and 1
    before any step.

    The calibration times one sequence's trees, up to a few dozen rows, where a CPU forward is bound by
    reading the weights; a batch's forwards take more rows, where the arithmetic grows with every row,
    so a single factor learned at one size would misprice the others (at batch 8 in float32 on the
    development CPU a planner with one factor kept large trees that cost more than they gained)."""

    def __init__(self, memory: float = 0.97):
        super().__init__(memory, floor=0.25, empty=1.0)

    def factor(self, rows) -> np.ndarray | float:
        return self.at(rows)


class BatchPlanner(CostAtContext):
    """Sizes the trees of a batch's rows together (see the module docstring); `cap` bounds each row's."""

    def __init__(self, cost: CostModel, cap: int, acceptance: AcceptanceModel | None = None,
                 matches_draws: bool = False, learn_speed: bool = True):
        super().__init__(cost)
        self.cap = cap
        self.acceptance = acceptance or AcceptanceModel()
        self.matches_draws = matches_draws
        self.learn_speed = learn_speed
        self.speed = SpeedByRows()  # realised batch forward over the calibrated cost, by rows
        self.overhead_s = 0.0  # a batch step's seconds besides the forward, running mean
        self.contexts: list[int] = []  # this step's rows' contexts
        self._calibrated_s = 0.0  # the calibrated forward of the step's chosen rows
        self._rows = 0  # the query rows of the step's chosen forwards

    def row(self) -> RowPlan:
        return RowPlan(self)

    def cut(self, trees: dict[int, TokenTree], plans: dict[int, RowPlan],
            batch: BatchBackend) -> dict[int, tuple[TokenTree, Prediction]]:
        """Every row's kept subtree and its prediction (its expected tokens; the batch step's seconds),
        the forward priced as `batch` runs it (`BatchBackend.forward_rows`)."""
        if self.contexts:
            self.start_step(int(np.mean(self.contexts)))
            self.contexts.clear()
        sizes = {key: len(tree) if plans[key].features is None else 0 for key, tree in trees.items()}
        owners, nodes, probs = [], [], []
        for key, tree in trees.items():
            if plans[key].features is not None:
                owners += [key] * len(tree)
                nodes.append(np.arange(len(tree)))
                probs.append(path_probabilities(tree.parents, self.acceptance.predict(plans[key].features)))
        owners = np.asarray(owners, np.int64)
        nodes, probs = (np.concatenate(x) if x else np.zeros(0) for x in (nodes, probs))
        order = np.lexsort((nodes, -probs))  # best first; parents first (lower index, P at least the child's)
        tokens = len(trees) + np.concatenate([[0.0], np.cumsum(probs[order])])
        calibrated, rows = np.empty(len(order) + 1), np.empty(len(order) + 1, np.int64)
        for k in range(len(order) + 1):  # the k likeliest nodes kept, in the forwards `batch` would run
            if k:
                sizes[int(owners[order[k - 1]])] += 1
            forwards = batch.forward_rows(sizes)
            calibrated[k] = sum(self.cost.step_seconds(n - 1, 1) for n in forwards)
            rows[k] = sum(forwards)
        seconds = self.speed.factor(rows) * calibrated + self.overhead_s
        best = int(np.argmax(tokens / np.maximum(seconds, 1e-12)))
        self._calibrated_s, self._rows = float(calibrated[best]), int(rows[best])
        chosen = order[:best]
        out = {}
        for key, tree in trees.items():
            plan = plans[key]
            if plan.features is None:
                out[key] = (tree, Prediction(1.0, float(seconds[best])))
                continue
            mine = chosen[owners[chosen] == key]
            keep = np.sort(nodes[mine]).astype(np.int64)
            if len(keep) < len(tree):
                plan.built, plan.built_features = tree, plan.features
                plan.features, tree = plan.features.take(keep), tree.subtree(keep)
            out[key] = (tree, Prediction(1.0 + float(probs[mine].sum()), float(seconds[best])))
        return out

    def observe(self, forward_s: float, step_s: float) -> None:
        """Learn the machine's speed at batch shapes and the step's overhead from one batch step."""
        if self.learn_speed and self._calibrated_s > 0:
            self.speed.add(self._rows, forward_s / self._calibrated_s)
        self.overhead_s += EMA * (max(step_s - forward_s, 0.0) - self.overhead_s)


def batch_planner_of(planner) -> BatchPlanner:
    """A batch planner with what `planner` (the decoder's `AdaptivePlanner`) has: its calibrated cost, its
    cap, its acceptance counts (shared, so single requests and batches learn together) and settings."""
    return BatchPlanner(planner.calibrated, planner.cap, planner.acceptance,
                        matches_draws=planner.matches_draws, learn_speed=planner.learn_speed)
