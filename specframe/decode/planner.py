"""Per-step speculation plans: the interface the decode loop asks of a planner (`StepPlanner`), the
fixed budget (`FixedPlanner`: fill the budget every step, predict nothing) and what both plan with.

`budget="auto"` is `specframe.decode.adaptive.AdaptivePlanner`: every row's tree sized for the most
tokens per second under a calibrated acceptance model and a measured cost model, drafting skipped where
it does not pay. Both record what they predicted, so the metrics can show predicted against realised
tokens and step time.

Lossless by construction: every decision uses the proposal and earlier steps only. When the tree is
sampled and the verifier uses the draft probabilities, the kept nodes must not depend on the drawn
tokens at all (`specframe.terms.tree.draw_order_prefix`); the planner then picks the budget before the
build from earlier steps alone and prunes nothing. Whether that holds depends on the request's sampling,
so it is decided for each request (`plans_blind`, passed to `start_request`), never once per planner.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

from specframe.terms.cost import CostModel
from specframe.terms.proposal import DraftProposal
from specframe.terms.records import Prediction, VerifyResult
from specframe.terms.sampling import SamplingParams
from specframe.terms.tree import TokenTree

# The cost model moves to the step's context every 16 tokens (16 more cached tokens change a tree's cost by
# less than the noise of a step): tree selection then reuses one model for several steps.
CONTEXT_STEP = 16


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

    `FixedPlanner` plans a row on its own: a row's `choose` already kept its tree, so its `cut` keeps every
    tree as it is. `specframe.decode.adaptive.AdaptivePlanner` keeps the nodes of every row's tree that pay
    together in one step."""

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


def make_fixed_planner(pipeline, budget: int) -> FixedPlanner:
    """A `FixedPlanner` of `budget` nodes whose builders receive the backend's cost model
    (`StateBackend.cost_model`), else the cost the backend was handed at assembly, stored for it by
    `specframe calibrate` (`StateBackend.calibration`), else no cost."""
    backend = pipeline.backend
    cost = backend.cost_model()
    return FixedPlanner(budget, cost if cost is not None else backend.calibration.cost)


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
