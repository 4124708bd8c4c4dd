"""The `forced` drafter: the tokens a constraint forces, then the proposal of the drafter it fuses with."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from specframe import ConfigurationError, DraftContext, Sampler, get_registry
from specframe.testing.constrained import TokenAutomaton
from specframe.testing.targets import tiny_target


def chain_then_free(vocab: int = 8) -> TokenAutomaton:
    """State 0 allows only token 3, state 1 only token 5, state 2 (after them) every token."""
    allowed = np.zeros((3, vocab), bool)
    allowed[0, 3] = allowed[1, 5] = True
    allowed[2] = True
    next_state = np.array([[1] * vocab, [2] * vocab, [2] * vocab])
    return TokenAutomaton(allowed, next_state)


@functools.cache
def tiny():
    return tiny_target(vocab_size=8)


def propose(then: str, budget: int, constrained: bool = True):
    drafter = get_registry().get("drafter", "forced")(tiny(), then=then)
    sampler = Sampler(constraint=chain_then_free().start() if constrained else None)
    tokens = np.array([3, 5, 2, 4, 1, 6, 3], np.int64)  # after "3 5" came "2 4"
    return drafter.propose(DraftContext(tokens, 2, budget, None, sampler))


def test_forced_tokens_come_first_and_the_fused_drafter_continues_after_them():
    proposal = propose("pld(min_ngram=1)", budget=5)
    assert proposal.tokens[:2].tolist() == [3, 5]
    assert proposal.parents[:2].tolist() == [-1, 0]
    # pld read "... 3 5" as if emitted: its match "3 5" was followed by "2 4 ..."
    assert proposal.tokens[2:4].tolist() == [2, 4] and proposal.parents[2] == 1
    assert proposal.scores[0] > proposal.scores[1] > proposal.scores[2:].max()
    assert proposal.group[:2].tolist() == [7, 7] and len(proposal) <= 5


def test_the_budget_caps_the_forced_tokens_and_no_constraint_leaves_the_fused_drafter():
    assert propose("pld", budget=1).tokens.tolist() == [3]
    assert propose("none", budget=4).tokens.tolist() == [3, 5]
    free = propose("pld(min_ngram=1)", budget=3, constrained=False)
    assert free.tokens.tolist() == [5, 2, 4]  # pld's own proposal after "... 6 3"


@pytest.mark.parametrize("then,message", [("forced", "another drafter"), ("s4c", "hidden states")])
def test_forced_refuses_what_it_cannot_fuse_with(then, message):
    with pytest.raises(ConfigurationError, match=message):
        get_registry().get("drafter", "forced")(tiny(), then=then)
