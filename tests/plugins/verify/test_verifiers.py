"""Verifiers: greedy equivalence at temperature 0, capability checks, fallbacks and warnings, and bad
input. Exact distribution checks are in test_lossless_power.py (verifiers and tree builders called
directly, with mutants) and test_lossless_e2e.py (every assembled combination through the decoder)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from conftest import plain_greedy, tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe import (
    CapabilityError, ConfigurationError, DraftProposal, DrawMethod, Pipeline, Sampler, SamplingParams,
    SpecframeError, SpeculativeDecoder, TargetScores, TokenTree,
)
from specframe.terms.errors import SpecframeWarning
from specframe.plugging.registry import get_registry
from specframe.testing import FirstNodesTreeBuilder
from specframe.testing.drafts import TinyModelDrafter

SAMPLING_VERIFIERS = ["sample-match", "rejection", "typical"]
HOT = SamplingParams(temperature=0.7, seed=0)
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 3, 4, 5, 6]


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def verifier(name: str, **options):
    return get_registry().get("verifier", name)(**options)


def pipeline(target, drafter, verifier_name: str, tree=None) -> Pipeline:
    backend = get_registry().get("backend", "kv")(target)
    return Pipeline(drafter, tree or FirstNodesTreeBuilder(), verifier(verifier_name), backend)


# --- temperature 0 through every verifier equals the greedy verifier --------------------------------

@st.composite
def scored_trees(draw, vocab=16):
    """A trie of random sequences with random target logits and draft rows, under any draw method."""
    sequences = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4), max_size=5))
    proposal = DraftProposal.from_sequences(sequences)
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    proposal.draft_probs = torch.softmax(3 * torch.randn(len(proposal), vocab, generator=gen), -1)  # (N, V)
    proposal.draw = draw(st.sampled_from(list(DrawMethod)))
    tree = TokenTree.from_proposal(proposal, np.arange(len(proposal)), draw_order_prefix=draw(st.booleans()))
    # Give the target a strong preference for draft tokens, so that long paths are accepted.
    logits = torch.randn(len(tree) + 1, vocab, generator=gen)  # (N + 1, V)
    for i, parent in enumerate(tree.parents.tolist()):
        if draw(st.booleans()):
            logits[parent + 1, tree.tokens[i]] += 6
    return tree, TargetScores(logits=logits)


@settings(max_examples=60, deadline=None)
@given(case=scored_trees(), name=st.sampled_from([*SAMPLING_VERIFIERS, "block", "traversal"]),
       seed=st.integers(0, 100))
def test_temperature_zero_equals_the_greedy_verifier(case, name, seed):
    tree, scores = case
    greedy = verifier("greedy").verify(tree, scores, Sampler(SamplingParams()))
    try:
        got = verifier(name).verify(tree, scores, Sampler(SamplingParams(temperature=0, seed=seed)))
    except SpecframeError:  # a sampled tree whose token has q = 0: refused, never answered otherwise
        assert name in ("rejection", "block", "traversal")
        return
    assert (got.path, got.bonus) == (greedy.path, greedy.bonus)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def greedy_reference(target):
    return plain_greedy(target, PROMPT, 40)


@pytest.mark.parametrize("name", ["sample-match", "typical"])
def test_greedy_decoding_through_sampling_verifiers_is_lossless(target, greedy_reference, name):
    # A fixed budget: under `auto` the planner may (rightly, on a random model) stop drafting after a few
    # rejections, and timing decides when, which would leave the check below to chance.
    decoder = SpeculativeDecoder.from_names(target, "pld", "chain", name, budget=4)
    result = decoder.generate(PROMPT, max_new_tokens=40)
    assert result.tokens == greedy_reference
    assert result.metrics.accepted_draft_tokens > 0


@pytest.mark.parametrize("draw", ["sampled", "top-k"])
def test_greedy_decoding_through_rejection_is_lossless(target, greedy_reference, draw):
    drafter = TinyModelDrafter(target, draft=tiny_llama(seed=1), count=3, length=3, draw=draw)
    decoder = SpeculativeDecoder(target, pipeline(target, drafter, "rejection"))
    result = decoder.generate(PROMPT, max_new_tokens=40)
    assert result.tokens == greedy_reference


# --- capability checks, warnings, bad input --------------------------------------------------------

def test_typical_is_declared_lossy_and_warns_when_sampling(target):
    cls = get_registry().get("verifier", "typical")
    assert not cls.capabilities.lossless and "LOSSY" in cls.__doc__
    with pytest.warns(SpecframeWarning, match="'typical' is lossy"):
        SpeculativeDecoder.from_names(target, "pld", "chain", "typical", sampling=HOT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SpeculativeDecoder.from_names(target, "pld", "chain", "typical")  # temperature 0: exact, no warning


def test_lossless_sampling_verifiers_are_declared():
    registry = get_registry()
    for name, uses_q in [("sample-match", False), ("rejection", True)]:
        caps = registry.get("verifier", name).capabilities
        assert caps.lossless and caps.supports_sampling and not caps.needs_draft_probs
        assert caps.uses_draft_probs == uses_q


def test_capability_errors_name_the_fix(target):
    with pytest.raises(CapabilityError, match="'greedy' is greedy only"):
        SpeculativeDecoder.from_names(target, "pld", "chain", "greedy", sampling=HOT)
    drafter = "draft-model(layers=1, topk=2)"
    for tree in ("beam", "dynamic"):
        with pytest.raises(CapabilityError,
                           match=f"tree builder '{tree}' chooses among the drafts.*draw-order "
                                 "prefix, such as 'chain'.*'trie'.*'sample-match'"):
            SpeculativeDecoder.from_names(target, drafter, tree, "rejection", sampling=HOT)
        # lossless: allowed
        SpeculativeDecoder.from_names(target, drafter, tree, "sample-match", sampling=HOT)
        SpeculativeDecoder.from_names(target, drafter, tree, "rejection")  # greedy: drafts are top-k, allowed


def test_rejection_falls_back_to_sample_match_for_drafts_without_q_and_counts_it(target):
    """pld has no q: `rejection` verifies its trees by sampling and matching, so with the same seed it
    emits exactly what `sample-match` emits, and every step with a tree is counted as a fallback."""
    runs = {name: SpeculativeDecoder.from_names(target, "pld(min_ngram=1)", "chain", name, sampling=HOT,
                                                budget=4)  # fixed: under `auto` timing decides the trees
            .generate(PROMPT, max_new_tokens=30) for name in ("rejection", "sample-match")}
    assert runs["rejection"].tokens == runs["sample-match"].tokens
    metrics = runs["rejection"].metrics
    with_tree = sum(size > 0 for size in metrics.tree_sizes)
    assert with_tree > 0 and metrics.fallbacks == {"no draft q": with_tree}
    assert metrics.to_dict()["fallback_steps"] == with_tree
    assert runs["sample-match"].metrics.fallback_steps == 0  # it never uses q: nothing to fall back from


def test_rejection_uses_q_of_sampled_drafts_without_fallback(target):
    decoder = SpeculativeDecoder.from_names(target, "draft-model(layers=1, topk=2)", "trie", "rejection",
                                            sampling=HOT, budget=4)
    metrics = decoder.generate(PROMPT, max_new_tokens=30).metrics
    assert metrics.fallback_steps == 0 and metrics.draft_tokens > 0


def test_rejection_refuses_a_draft_token_its_q_could_not_have_drawn():
    proposal = DraftProposal(np.array([2]), np.array([-1]), np.zeros(1),
                             draft_probs=torch.tensor([[0.5, 0.5, 0.0, 0.0]]), draw=DrawMethod.SAMPLED)
    tree = TokenTree.from_proposal(proposal, [0], draw_order_prefix=True)
    with pytest.raises(SpecframeError, match="rejection.*draft probability 0"):
        verifier("rejection").verify(tree, TargetScores(torch.zeros(2, 4)), Sampler(HOT))


@pytest.mark.parametrize("options", [dict(threshold=0), dict(threshold=1.5), dict(alpha=-1)])
def test_typical_bad_options(options):
    with pytest.raises(ConfigurationError, match="typical"):
        verifier("typical", **options)


def test_from_proposal_keeps_sampled_draws_only_when_the_builder_kept_a_draw_order_prefix():
    proposal = DraftProposal.from_sequences([[1, 2], [3], [1, 4]])  # nodes: 1, 2, 3, 4
    proposal.draft_probs = torch.full((4, 8), 1 / 8)
    proposal.draw = DrawMethod.SAMPLED
    # Keeping every node is no evidence: whether everything fits depends on the drawn tokens.
    assert TokenTree.from_proposal(proposal, [0, 1, 2, 3]).draw is DrawMethod.RETRIEVED
    assert TokenTree.from_proposal(proposal, [0, 2]).draw is DrawMethod.RETRIEVED
    kept = TokenTree.from_proposal(proposal, [0, 1], draw_order_prefix=True)
    assert kept.draw is DrawMethod.SAMPLED and kept.sampled
    proposal.draw = DrawMethod.TOPK
    assert TokenTree.from_proposal(proposal, [0, 2]).draw is DrawMethod.TOPK  # deterministic: any shape
