"""Per-step speculation plans: how many nodes to build, which to keep, and whether to draft at all.

`FixedPlanner` is the classic behaviour: fill the budget. `AdaptivePlanner` (`budget="auto"`, the
budget then a cap) keeps, every step, the subtree with the most expected tokens per second
(`selection.choose_subtree`) under a calibrated acceptance model and a measured cost model. When
drafting itself is expensive, it skips drafting while drafted steps emit more slowly than plain steps;
when, besides, drafting time grows with the budget (a draft model:
`DrafterCapabilities.drafting_grows_with_budget`), it sizes the draft before drafting from the
acceptance realised by position. Both
planners record what they predicted, so the metrics can show predicted against realised tokens and
step time.

Lossless by construction: every decision uses the proposal and earlier steps only. When the tree is
sampled and the verifier uses the draft probabilities, the kept nodes must not depend on the drawn
tokens at all (`specframe.terms.tree.draw_order_prefix`); the planner then picks the budget before the build
from earlier steps alone and prunes nothing. Whether that holds depends on the request's sampling, so it
is decided for each request (`plans_blind`, passed to `start_request`), never once per planner.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from specframe.decode.acceptance import AcceptanceModel, NodeFeatures
from specframe.decode.drafting import (
    EMA, PROBE_ALLOWANCE, DraftingDecision, DraftingGain, ProbeBudget, tokens_by_size,
)
from specframe.decode.learning import CutRecord, DraftingTime, best_size, count_positions
from specframe.decode.selection import choose_subtree
from specframe.terms.cost import CostModel, ScaledCost
from specframe.terms.proposal import DraftProposal
from specframe.terms.records import Prediction, VerifyResult
from specframe.terms.sampling import SamplingParams
from specframe.terms.tree import TokenTree

# The cost model moves to the step's context every 16 tokens (16 more cached tokens change a tree's cost by
# less than the noise of a step): tree selection then reuses one model for several steps.
CONTEXT_STEP = 16
# Each tree size also learns its own realised forward over the calibrated one, beyond the machine's speed
# as a whole: a busy spell slows sizes unevenly (a plain step far more than a 12-node tree, on a shared
# 2-core CPU), so a calibration is off in its shape, not only its
# level ("Each size's own speed" in docs/explanation/adaptive-speculation.md). It learns more slowly: a
# size is seen on a share of the steps only, and a step's time is noisy.
SHAPE_EMA = 0.05
SHAPE_LEARNING = True  # the default of `AdaptivePlanner(learn_shape=)`; False: one factor for every size


class CostAtContext:
    """The cost of a step at the step's context: `calibrated` holds the model over all contexts, `cost`
    the model at the current step's (`CostModel.at_context`), moved every `CONTEXT_STEP` tokens."""

    def __init__(self, cost: CostModel | None):
        self.calibrated = self.cost = cost
        self._context: int | None = None  # the context `cost` is at

    def start_step(self, context: int) -> None:
        """A step begins whose tree attends to `context` tokens (prompt and output so far): a tree costs
        more next to a plain step the longer the context."""
        if self.calibrated is not None and (self._context is None
                                            or abs(context - self._context) >= CONTEXT_STEP):
            self._context, self.cost = context, self.calibrated.at_context(context)


class StepPlanner(ABC):
    """What the decode loop asks of a planner, alone or in a batch: a plan for each row it admits (`row`,
    whose `start_request`, `start_step`, `should_draft`, `build_budget`, `choose` and `observe`
    `RequestRow` calls), and for every step the trees the rows built, to keep what pays with every row in
    view (`cut`), then how the step went (`observe_step`).

    `FixedPlanner` and `AdaptivePlanner` plan a row on its own: a row's `choose` already kept its tree, so
    their `cut` keeps every tree as it is. The batch planner (`specframe.decode.batch_planner`) keeps the
    nodes of every row's tree that pay together in one forward."""

    @abstractmethod
    def row(self):
        """The plan of a row the loop admits."""

    def cut(self, trees: dict[int, TokenTree], plans: dict, rows) -> dict[int, tuple[TokenTree, Prediction]]:
        """The trees to score, by row, where they differ from what each row's plan chose (none here); `rows`
        is the loop's `BatchBackend`, which prices the forward."""
        return {}

    def observe_step(self, forward_s: float, step_s: float, drafting_s: float) -> None:
        """The step's shared forward took `forward_s` of its `step_s` seconds, its rows drafting for
        `drafting_s` in all."""


class FixedPlanner(CostAtContext, StepPlanner):
    """Fill the budget every step; predict nothing. `cost` (the backend's, if any) goes to builders."""

    def __init__(self, budget: int, cost: CostModel | None = None):
        super().__init__(cost)
        self.budget = budget

    def row(self) -> FixedPlanner:
        """A copy of its own: each row's cost follows its own context."""
        return copy.copy(self)

    def start_request(self, blind: bool = False) -> None:
        pass

    def should_draft(self) -> bool:
        return True

    def build_budget(self, room: int) -> int:
        return min(self.budget, room)

    def choose(self, proposal: DraftProposal, tree: TokenTree) -> tuple[TokenTree, Prediction | None]:
        return tree, None

    def observe(self, tree: TokenTree, result: VerifyResult, times: dict[str, float]) -> None:
        pass


class AdaptivePlanner(CostAtContext, StepPlanner):
    """Speculate only what pays: see the module docstring. `cap` bounds the tree size. Plans one row at a
    time (the decoder's requests alone, B = 1), each its own plan (`row` is the planner itself), learning
    across them; a batch's rows are planned together by `specframe.decode.batch_planner`, which starts
    from what this planner learned."""

    def __init__(self, cost: CostModel, cap: int, acceptance: AcceptanceModel | None = None,
                 drafting_grows_with_budget: bool = True, learn_speed: bool = True,
                 matches_draws: bool = False, learn_shape: bool = SHAPE_LEARNING):
        super().__init__(cost)  # `self.cost`: the cost at this step's context (`start_step`)
        self.cap = cap
        self.learn_speed = learn_speed  # scale `cost` to the realised forward (False: take it as given)
        self.acceptance = acceptance or AcceptanceModel()
        self.matches_draws = matches_draws  # `VerifierCapabilities.matches_draws`: learn from cut nodes
        self.draw_order_only = False  # this request's sampled trees are verified with q: choose sizes blind
        self.per_token_drafting = drafting_grows_with_budget  # dear drafting: size the budget first
        self.position_hits = np.zeros((2, cap))  # [accepted, tried] by index position in the scored tree
        self.speed = 1.0  # realised forward time over the calibrated one, running mean (the machine today)
        self.shape = np.ones(cap + 1)  # by tree size: its realised over calibrated forward, over `speed`
        self.learn_shape = learn_shape  # False: `speed` alone scales every size alike
        self.overhead_s = 0.0  # realised step time besides drafting and the forward, running mean
        self.drafting_time = DraftingTime()  # drafting seconds per drafted step and per node
        self.gain = DraftingGain()  # realised speed of drafted steps over plain steps
        self.probes = ProbeBudget()  # what probes may still lose in this request
        self.drafting = DraftingDecision(self.gain, self.probes)  # whether dear drafting pays
        self._proposed = 0
        self._record = CutRecord()  # this step's nodes, for learning acceptance
        self._prediction: Prediction | None = None

    def row(self) -> AdaptivePlanner:
        return self

    # --- before the step -----------------------------------------------------------------------------

    def start_request(self, blind: bool = False) -> None:
        """A new request: its drafter has read none of it, its probes have earned nothing yet, and what
        earlier requests showed of drafting's gain is a prior of `REQUEST_PRIOR` steps.
        `blind` (`plans_blind` of the request's sampling): its sampled trees are verified with their q,
        so sizes are chosen before drafting and nothing is pruned."""
        self.draw_order_only = blind
        self.drafting.start_request()

    def start_step(self, context: int) -> None:
        super().start_step(context)
        self.drafting.start_step(context)

    def build_budget(self, room: int) -> int:
        """Nodes the drafter and tree builder may use: the cap, unless the size must be chosen before
        drafting, in blind mode or when drafting is expensive and pays per token (a draft model).
        Then the size with the most tokens per second by earlier steps, from the acceptance by index
        position, the calibrated forward, the step overhead and the drafting time per node. Whether to
        draft at all is `should_draft`'s call, so the size is at least 1 and probes keep learning."""
        if not (self.draw_order_only or (self.per_token_drafting and self._expensive())):
            return min(self.cap, room)
        tokens = tokens_by_size(self.position_hits)  # (cap + 1,)
        sizes = np.arange(self.cap + 1)
        seconds = self._cost().many(sizes, sizes) + self.overhead_s + sizes * self.drafting_time.node_s
        best = best_size(tokens, seconds)
        self._prediction = Prediction(float(tokens[best]), float(seconds[best]))
        return min(best, room)

    def should_draft(self) -> bool:
        """Draft unless drafting is expensive (over `CHEAP_DRAFT` of a plain step) and drafted steps have
        emitted more slowly than plain ones; then probe (`DraftingDecision.decide`)."""
        return self.drafting.decide(self._expensive(), PROBE_ALLOWANCE * self._seconds(0, 0))

    def choose(self, proposal: DraftProposal, tree: TokenTree) -> tuple[TokenTree, Prediction | None]:
        """The subtree of `tree` worth scoring, with its predicted tokens and seconds."""
        self._proposed = len(proposal)
        if self.draw_order_only or tree.origin is None:
            self._record = CutRecord()
            return tree, self._prediction if self.draw_order_only else None
        self._record = CutRecord(NodeFeatures.of(proposal, tree.origin, tree.depth))
        p = self.acceptance.predict(self._record.features)
        choice = choose_subtree(tree.parents, tree.depth, p, self._cost(), overhead_s=self.overhead_s)
        tree = self._record.cut(tree, choice.keep)
        self._prediction = Prediction(choice.expected_tokens, choice.expected_seconds)
        return tree, self._prediction

    # --- after the step ------------------------------------------------------------------------------

    def observe(self, tree: TokenTree, result: VerifyResult, times: dict[str, float]) -> None:
        """Learn acceptance, the machine's speed, the step overhead, the drafting cost and whether
        drafting paid. `times` holds the step's seconds by phase ("draft", "forward", the rest)."""
        self._record.learn(self.acceptance, tree, result, self.matches_draws)
        count_positions(self.position_hits, tree, result)
        calibrated = self.cost.step_seconds(len(tree), int(tree.depth.max()) if len(tree) else 0)
        # The forward as timed, or as calibrated where the speed is not learned (see make_adaptive_planner)
        forward = times.get("forward", calibrated) if self.learn_speed else calibrated
        if self.learn_speed and calibrated > 0:
            self.speed += EMA * (forward / calibrated - self.speed)
            size = min(len(tree), self.cap)
            self.shape[size] += SHAPE_EMA * (forward / calibrated / self.speed - self.shape[size])
        step = sum(s for phase, s in times.items() if phase != "draft")
        self.overhead_s += EMA * (max(step - forward, 0.0) - self.overhead_s)
        drafting = times.get("draft", 0.0) if self.drafting.drafted else 0.0
        if self.drafting.drafted:
            self.drafting_time.add(drafting, self._proposed)
        # did the step emit faster than a plain one?
        self.drafting.record(result.accepted + 1, step + drafting, self._seconds(0, 0), drafting)
        self._prediction = None
        self._proposed = 0

    def _expensive(self) -> bool:
        return self.drafting_time.dear(self._seconds(0, 0))

    def _cost(self) -> CostModel:
        """The calibrated forward cost at the speed realised steps show, and each size's own ratio to that
        speed where the size has run (a calibration taken on a busier or quieter machine than today's is
        off by a factor, and not the same factor for every size)."""
        return ScaledCost(self.cost, self.speed, self.shape if self.learn_shape else np.ones(0))

    def _seconds(self, nodes: int, depth: int) -> float:
        """Predicted seconds of a step on `nodes` nodes, drafting aside."""
        return self._cost().step_seconds(nodes, depth) + self.overhead_s


def make_fixed_planner(pipeline, budget: int) -> FixedPlanner:
    """A `FixedPlanner` of `budget` nodes whose builders receive the backend's cost model
    (`StateBackend.cost_model`), else the cost the backend was handed at assembly, stored for it by
    `specframe calibrate` (`StateBackend.calibration`), else no cost."""
    backend = pipeline.backend
    cost = backend.cost_model()
    return FixedPlanner(budget, cost if cost is not None else backend.calibration.cost)


def make_adaptive_planner(pipeline, cap: int, cost: CostModel | None = None,
                          acceptance_file: Path | None = None, progress: bool = True,
                          phase_timing: bool = True) -> AdaptivePlanner:
    """An `AdaptivePlanner` for `pipeline` with `cost`, by default the backend's measured cost
    (calibrated on first use and stored, the pipeline's backend then rebuilt with it:
    `specframe.plugging.pipeline.calibrate_pipeline`), and the
    acceptance counts stored in `acceptance_file` when given (a missing file, or one in another version's
    format, starts afresh; a file specframe did not write is refused rather than overwritten).
    The stored calibration is scaled to the speed that real steps show, when the decoder times its
    phases apart (`phase_timing`: without it, an accelerator's forward phase holds only launch time); a
    `cost` passed in is taken as given (tests and simulations state costs in their own units).

    The planner serves requests of any sampling: whether one is planned blind is `plans_blind`'s call,
    made for each request.
    """
    from specframe.plugging.pipeline import calibrate_pipeline

    d, v = (c.capabilities for c in (pipeline.drafter, pipeline.verifier))
    measured = cost is None and phase_timing
    cost = cost or calibrate_pipeline(pipeline, progress=progress)
    acceptance = AcceptanceModel.load(acceptance_file) if acceptance_file is not None else None
    return AdaptivePlanner(cost, cap, acceptance, drafting_grows_with_budget=d.drafting_grows_with_budget,
                           learn_speed=measured, matches_draws=v.matches_draws)


def plans_blind(pipeline, sampling: SamplingParams) -> bool:
    """Whether a request with `sampling` through `pipeline` must be planned blind (sizes chosen before the
    build, nothing pruned): it samples, the drafter samples its drafts and the verifier uses their q
    through a builder that keeps draw order. Pruning such a tree by its drawn tokens' scores would bias
    what the verifier accepts; pruning it by earlier steps alone would still be lossless
    (`TokenTree.subtree` relabels it for sample-and-match), but would lose what rejection sampling with q
    gains. Decided per request, from that request's sampling: a decoder's sampling may change between
    requests."""
    d, t, v = (c.capabilities for c in (pipeline.drafter, pipeline.tree_builder, pipeline.verifier))
    return not sampling.greedy and d.samples_drafts and v.uses_draft_probs and t.keeps_draw_order
