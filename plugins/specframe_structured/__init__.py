"""`forced`: under a constraint (structured output), draft the tokens the constraint forces, then whatever
another drafter proposes after them: `forced(then=suffix)`, `forced(then=pld)`, or `forced` alone.

Where a JSON schema or a grammar allows one continuation (a key, its quotes and colon, a closing brace) the
constraint knows the next tokens without a guess: `ConstraintState.forced` gives them (llguidance's
tokenizing of the forced text). They are drafts like any other, verified against the constrained law, so
the output is what constrained plain decoding gives. After them the drafter `then` (a retrieval drafter:
one that needs neither the target's hidden states nor draft probabilities) drafts from the text as it
will read once they are accepted, and its proposal hangs under the last forced token. Without a
constraint the drafter is `then` alone.
"""

from __future__ import annotations

import copy

import numpy as np

import specframe
from specframe import (
    ComponentSpec, ConfigurationError, DraftContext, DraftProposal, Drafter, DrafterCapabilities, ScoreKind,
)

FORCED_GROUP = 7  # adaptive speculation learns the forced nodes' acceptance apart (`DraftProposal.group`)


class ForcedDrafter(Drafter):
    name = "forced"
    capabilities = DrafterCapabilities(proposes_trees=True, score_kind=ScoreKind.RANK)

    def __init__(self, target, *, then: str = "none"):
        super().__init__(target)
        spec = ComponentSpec.parse(str(then))
        if spec.name == self.name:
            raise ConfigurationError("forced: then names another drafter, e.g. forced(then=suffix)")
        cls = specframe.get_registry().get("drafter", spec.name)
        caps = cls.capabilities
        if caps.needs_hidden_states or caps.provides_draft_probs:
            raise ConfigurationError(
                f"forced: then={spec.name!r} needs the target's hidden states or drafts with probabilities, "
                "which forced does not pass on; fuse it with a retrieval drafter such as suffix, pld or rest")
        self.then = cls(target, **spec.options)

    @classmethod
    def example_options(cls, target, workdir: str) -> dict:
        return {"then": "pld"}  # drafts without a constraint too, as pld

    def propose(self, context: DraftContext) -> DraftProposal:
        state = getattr(context.sampler, "constraint", None)
        forced = state.forced(context.budget) if state is not None and context.budget > 0 else []
        k = len(forced)
        rest = context.budget - k
        inner = DraftProposal.empty()
        if rest > 0:
            tokens = np.concatenate([context.tokens, np.asarray(forced, np.int64)])
            inner = self.then.propose(DraftContext(tokens, context.prompt_len, rest, None, context.sampler))
        if not k:
            return inner if not len(inner) else _ranked(inner)
        top = float(inner.scores.max()) + 1.0 if len(inner) else 1.0
        inner_groups = np.minimum(inner.group, FORCED_GROUP - 1) if inner.group is not None else \
            np.zeros(len(inner), np.int64)
        return DraftProposal(
            np.concatenate([np.asarray(forced, np.int64), inner.tokens]),
            np.concatenate([np.arange(-1, k - 1), np.where(inner.parents < 0, k - 1, inner.parents + k)]),
            np.concatenate([top + np.arange(k, 0, -1, dtype=np.float64), inner.scores]),
            score_kind=ScoreKind.RANK,
            group=np.concatenate([np.full(k, FORCED_GROUP), inner_groups]))

    def observe(self, outcome) -> None:
        self.then.observe(outcome)

    def reset(self) -> None:
        self.then.reset()

    def spawn(self) -> ForcedDrafter:
        twin = copy.copy(self)
        twin.then = self.then.spawn()
        return twin

    def finish(self, prompt, response) -> None:
        self.then.finish(prompt, response)

    def remember(self, prompt, response) -> None:
        self.then.remember(prompt, response)


def _ranked(proposal: DraftProposal) -> DraftProposal:
    """`proposal` labelled with rank scores (its own scores keep their order)."""
    group = None if proposal.group is None else np.minimum(proposal.group, FORCED_GROUP - 1)
    return DraftProposal(proposal.tokens, proposal.parents, proposal.scores, score_kind=ScoreKind.RANK,
                         group=group)


@specframe.hookimpl
def register_drafters(register):
    register(ForcedDrafter)
