"""Deliberately wrong constrained decoding (mutants) that the exact-law tests of structured output must
reject (tests/core/decode/test_structured_law.py), each a fault that serving engines have shipped:

- `unmasked-nodes`: the verifier sees the mask at the root only, not at the drafted nodes (a tree mask
  and a grammar mask that disagree), so tokens after an accepted draft follow the unconstrained law;
- `not-rolled-back`: the constraint state was advanced along the drafted chain while drafting and not
  rolled back after a rejection: after each step it has consumed every drafted token, then the bonus;
- `bonus-unmasked`: the bonus token is drawn from the target's unmasked logits.

The mutant rows advance their state with the automaton's raw transitions (`AutomatonState.follow`), so a
wrong state or a forbidden token shows in the law instead of stopping the run.
"""

from __future__ import annotations

from dataclasses import replace

from specframe import SpeculativeDecoder, TargetScores
from specframe.decode.row import RequestRow
from specframe.terms.constraint import mask_logits

FAULTS = ("unmasked-nodes", "not-rolled-back", "bonus-unmasked")


class MutantRow(RequestRow):
    fault: str = ""

    def masked(self, scores: TargetScores) -> TargetScores:
        if self._paths is None or self.fault != "unmasked-nodes":
            return super().masked(scores)
        masks = self._paths.masks(self._tree)
        masks[1:] = True  # (N, V): drafted nodes unmasked
        return replace(scores, logits=mask_logits(scores.logits, masks))

    def verify(self, scores, timer):
        result = super().verify(scores, timer)
        if self.fault == "bonus-unmasked":
            last = result.path[-1] + 1 if result.path else 0
            result = replace(result, bonus=self.sampler.sample(scores.logits[last]))
        return result

    def constrained_state(self, emitted):
        state = self.sampler.constraint
        if self.fault == "not-rolled-back":
            node, drafted = -1, []
            while self._tree.children[node + 1]:  # the first drafted chain, accepted or not
                node = self._tree.children[node + 1][0]
                drafted.append(int(self._tree.tokens[node]))
            emitted = drafted + emitted[-1:]
        for token in emitted:
            state = state.follow(token)
        return state


class MutantDecoder(SpeculativeDecoder):
    """A decoder whose rows carry `fault`."""

    def __init__(self, *args, fault: str, **kwargs):
        super().__init__(*args, **kwargs)
        assert fault in FAULTS, fault
        self.fault = fault

    def make_row(self, drafter, planner, prompt_ids, max_new_tokens, stop, sampling, logprobs=False,
                 constraint=None):
        row = super().make_row(drafter, planner, prompt_ids, max_new_tokens, stop, sampling, logprobs,
                               constraint)
        row.__class__ = MutantRow
        row.fault = self.fault
        return row
