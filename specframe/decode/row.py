"""One request in flight: its tokens, its drafter and planner, and what one step does for it.

`SpeculativeDecoder` decodes a request alone, or several together (a batch): either way each request is a
`RequestRow`, and a step is the same four moves for every row: `draft` (propose and build its tree),
the backend scores the trees (alone, or every row's in one forward), `verify`, then `advance` (commit
bookkeeping, the drafter's and planner's feedback, the stop checks). Only the scoring and the commit are
shared between rows, so a row decodes exactly as its request would alone, given the same scores.

Under a constraint (structured output) the row keeps the constraint's state at its root (on its sampler,
where drafters read it) and, each step, the states of the paths under the root (`PathStates`): `draft`
drops the proposal's and the tree's nodes the constraint forbids on their own path, `verify` masks the
target's logits at the root and at every node by the state of that node's path before the verifier sees
them (so every lossless verifier verifies against the constrained law unchanged, the bonus included), and
`advance` moves the state along the emitted tokens only (docs/explanation/structured-output.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from specframe.contract.interfaces import BuildContext
from specframe.plugging.pipeline import Pipeline
from specframe.terms.constraint import Constraint, ConstraintError, PathStates, mask_logits
from specframe.terms.errors import DrafterError, SpecframeError
from specframe.terms.metrics import DecodeMetrics, PhaseTimer
from specframe.terms.proposal import DraftContext, DraftProposal
from specframe.terms.records import Prediction, StepEvent, StepOutcome, TargetScores, VerifyResult
from specframe.terms.sampling import Sampler, SamplingParams
from specframe.terms.stopping import StopStrings
from specframe.terms.target import Target
from specframe.terms.tree import TokenTree


class RequestRow:
    """The decoding state of one request between steps (see the module docstring).

    `drafter` is the pipeline's own for a request decoded alone, a `Drafter.spawn` of it for a row of a
    batch; `planner` is the row's plan (`FixedPlanner`, or `AdaptivePlanner`'s `RowPlan`), already made."""

    def __init__(self, target: Target, pipeline: Pipeline, drafter, planner, prompt_ids: list[int],
                 max_new_tokens: int, stop: Sequence[str], sampling: SamplingParams, *, blind: bool,
                 hook, phase_timing: bool = True, logprobs: bool = False,
                 constraint: Constraint | None = None):
        self.target, self.pipeline, self.drafter, self.planner = target, pipeline, drafter, planner
        self.prompt_ids, self.max_new_tokens = prompt_ids, max_new_tokens
        self.constraint = constraint
        self.sampler = Sampler(sampling, device=target.device,
                               constraint=None if constraint is None else constraint.start())
        self.stops = StopStrings(target.tokenizer, stop)
        self.metrics = DecodeMetrics(prompt_tokens=len(prompt_ids), phase_timing=phase_timing)
        self.hook = hook
        self.tokens = np.array(prompt_ids, dtype=np.int64)
        self.new: list[int] = []
        self.hidden = None  # the target's feature at the last emitted token, for drafters that want it
        self.reason: str | None = None  # why decoding ended: "eos", "stop", "length"; None while it runs
        self.logprob = 0.0 if logprobs else None  # the target's log-probability of `new`, when wanted
        self._blind = blind
        # What `draft` chose this step, for `verify` and `advance`
        self._proposal = DraftProposal.empty()
        self._tree = TokenTree.empty()
        self._predicted: Prediction | None = None
        self._drafting = self._skipped = False
        self._paths: PathStates | None = None  # this step's constraint states by path, when constrained
        self._seen: TargetScores | None = None  # the scores the verifier saw (masked, when constrained)

    def start(self) -> None:
        """Before the request's prefill: a fresh drafter state and planner request."""
        self.drafter.reset()
        self.planner.start_request(blind=self._blind)

    def draft(self, timer: PhaseTimer) -> TokenTree:
        """Propose and build this step's tree (the empty tree when the planner skips drafting or no node
        fits), timed as the "draft" and "tree" phases."""
        planner = self.planner
        room = min(self.max_new_tokens - len(self.new) - 1, self.target.max_context - len(self.tokens) - 1)
        planner.start_step(len(self.tokens))
        with timer("draft"):
            self._paths = self._step_paths()
            self._drafting = room > 0 and planner.should_draft()
            budget = planner.build_budget(room) if self._drafting else 0
            context = DraftContext(self.tokens, len(self.prompt_ids), budget, self.hidden, self.sampler)
            with self._drafter_failure():
                self._proposal = self.drafter.propose(context) if self._drafting else DraftProposal.empty()
            self._proposal = self._allowed_proposal(self._proposal)
        with timer("tree"):
            tree = (self.pipeline.tree_builder.build(self._proposal, BuildContext(budget, planner.cost))
                    if len(self._proposal) else TokenTree.empty())
            if self._paths is not None:  # builders may add nodes of their own (from q): drop forbidden ones
                tree = tree.subtree(self._paths.keep(tree))
            self._tree, self._predicted = planner.choose(self._proposal, tree)
        self._skipped = room > 0 and not self._drafting  # the planner judged drafting not worth it
        return self._tree

    def _step_paths(self) -> PathStates | None:
        """This step's constraint states by path (None when unconstrained); refuses a dead end."""
        state = self.sampler.constraint
        if state is None:
            return None
        paths = PathStates(state, self.target.vocab_size)
        if not paths.entry(())[1].any():
            raise ConstraintError(
                f"constraint {self.constraint.describe()}: no token of model '{self.target.name}' may follow "
                f"the {len(self.new)} tokens generated (the constraint is complete and the model has no "
                "end-of-sequence token it allows, or no tokenization reaches it): check the schema or "
                "grammar")
        return paths

    def _allowed_proposal(self, proposal: DraftProposal) -> DraftProposal:
        """`proposal` without the nodes the constraint forbids on their own path. The dropping looks at the
        drawn tokens, so a sampled proposal is verified by sampling and matching after it (`RETRIEVED`),
        which is lossless for any tree (`TokenTree.from_proposal`)."""
        if self._paths is None or not len(proposal):
            return proposal
        return proposal.subtree(self._paths.keep(proposal))

    @contextmanager
    def _drafter_failure(self) -> Iterator[None]:
        """Turn an exception of the drafter into a `DrafterError` saying how many tokens were decoded;
        the decoder adds them to it (`partial`). A specframe error raised before any token was decoded
        (a store refused at the first draft) has nothing to keep and stays as it is."""
        try:
            yield
        except Exception as err:
            if isinstance(err, SpecframeError) and not self.new:
                raise
            name = getattr(self.drafter, "name", type(self.drafter).__name__)
            raise DrafterError(
                f"drafter '{name}' failed after {len(self.new)} new tokens ({type(err).__name__}: {err}); "
                "the tokens decoded until then are kept (the error's `partial` result, printed above it by "
                "`specframe generate`): fix what it names, or decode without it (--drafter none)") from err

    def keep(self, tree: TokenTree, predicted: Prediction) -> None:
        """The planner of a batch cut this step's tree to `tree` (a subtree of it), predicting `predicted`."""
        self._tree, self._predicted = tree, predicted

    def verify(self, scores: TargetScores, timer: PhaseTimer) -> VerifyResult:
        """What the target accepts of this step's tree, timed as the "verify" phase."""
        with timer("verify"):
            self._seen = self.masked(scores)
            return self.pipeline.verifier.verify(self._tree, self._seen, self.sampler)

    def masked(self, scores: TargetScores) -> TargetScores:
        """`scores` with the logits of the root and of every node masked to what the constraint allows
        after that node's path (the scores themselves when unconstrained): the constrained law."""
        if self._paths is None:
            return scores
        return replace(scores, logits=mask_logits(scores.logits, self._paths.masks(self._tree)))

    def advance(self, scores: TargetScores, result: VerifyResult, timer: PhaseTimer) -> None:
        """After the backend committed `result`: emit its tokens (cut at EOS, a stop string or the length
        limit, which end decoding), tell the drafter, the planner, the metrics and the observers."""
        tree = self._tree
        emitted = [int(t) for t in tree.tokens[result.path]] + [result.bonus]
        path = scores.hidden[[0, *(i + 1 for i in result.path)]] if scores.hidden is not None else None
        self.hidden = path[-1] if path is not None else None  # (H,) the feature that predicted the bonus
        with self._drafter_failure():
            self.drafter.observe(StepOutcome(self._proposal, len(tree), emitted[:-1], result.bonus,
                                             self.hidden, path, scores.prompt_hidden))
        if self._paths is not None:
            before_bonus = self._paths.entry(tuple(emitted[:-1]))
            if before_bonus is not None and not before_bonus[1].any():  # complete, nothing may follow
                emitted = emitted[:-1]
            self.sampler.constraint = self.constrained_state(emitted)
        emitted, self.reason = self._cut(emitted)
        if self.reason is None and self._paths is not None and not self.sampler.constraint.allowed().any():
            self.reason = "constraint"  # complete, and the target has no end-of-sequence token it allows
        if self.logprob is not None:  # of the law sampled: the constrained one, when constrained
            seen = self._seen if self._seen is not None else scores
            self.logprob += _logprob(seen.logits, [0, *(i + 1 for i in result.path)], emitted)
        self.new += emitted
        self.tokens = np.concatenate([self.tokens, np.asarray(emitted, dtype=np.int64)])
        times = timer.close()
        self.planner.observe(tree, result, times)
        self.metrics.record_step(len(tree), result.accepted, times, result.fallback, self._predicted,
                                 self._skipped)
        self.hook.on_step(event=StepEvent(self.metrics.steps, len(tree), result.accepted, emitted, times,
                                          self._predicted, not self._skipped))

    def constrained_state(self, emitted: list[int]):
        """The constraint's state after this step's `emitted` tokens (the accepted path, then the bonus):
        the root's state moved along them only, never along a rejected branch."""
        found = self._paths.entry(tuple(emitted))
        if found is None:
            raise ConstraintError(
                f"verifier '{self.pipeline.verifier.name}' emitted tokens {emitted} that constraint "
                f"{self.constraint.describe()} forbids: it did not sample from the masked logits it was "
                "given")
        return found[0]

    def _cut(self, emitted: list[int]) -> tuple[list[int], str | None]:
        """`emitted` cut at EOS, a stop string or the length limit, and why decoding ends, if it does."""
        for i, tok in enumerate(emitted):
            if tok in self.target.eos_token_ids:
                return emitted[: i + 1], "eos"
        if len(self.new) + len(emitted) >= self.max_new_tokens:
            return emitted[: self.max_new_tokens - len(self.new)], "length"
        hit = self.stops.first_hit(self.new, emitted)
        if hit is not None:
            return emitted[: hit + 1], "stop"
        return emitted, None


def _logprob(logits, rows: list[int], tokens: list[int]) -> float:
    """The sum of log softmax(logits[rows[i]])[tokens[i]]: token i was emitted after row i's token."""
    import torch

    rows = rows[: len(tokens)]
    picked = torch.log_softmax(logits[rows].double(), dim=-1)[torch.arange(len(rows)), tokens]
    return float(picked.sum())
