"""Verifiers: greedy equivalence at temperature 0, end-to-end sampling runs through `SpeculativeDecoder`,
capability checks and warnings, and bad input. Exact distribution checks are in
test_verifiers_distribution.py."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import plain_greedy, tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st
from verifier_kit import (
    KeepAllTreeBuilder, LogitTable, TinyModelDrafter, chi_square_pvalue, exact_distribution, tiny_target,
)

import specframe
from specframe import (
    CapabilityError, ConfigurationError, DraftProposal, DrawMethod, Pipeline, Sampler, SamplingParams,
    SpecframeError, SpeculativeDecoder, TargetScores, TokenTree,
)
from specframe.errors import SpecframeWarning
from specframe.registry import get_registry

SAMPLING_VERIFIERS = ["sample-match", "rejection", "typical"]
HOT = SamplingParams(temperature=0.7, seed=0)
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 3, 4, 5, 6]


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def verifier(name: str, **options):
    return get_registry().get("verifier", name)(**options)


def pipeline(target, drafter, verifier_name: str, tree=None) -> Pipeline:
    backend = get_registry().get("backend", "kv")(target)
    return Pipeline(drafter, tree or KeepAllTreeBuilder(), verifier(verifier_name), backend)


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
    tree = TokenTree.from_proposal(proposal, np.arange(len(proposal)))
    # Give the target a strong preference for draft tokens, so that long paths are accepted.
    logits = torch.randn(len(tree) + 1, vocab, generator=gen)  # (N + 1, V)
    for i, parent in enumerate(tree.parents.tolist()):
        if draw(st.booleans()):
            logits[parent + 1, tree.tokens[i]] += 6
    return tree, TargetScores(logits=logits)


@settings(max_examples=60, deadline=None)
@given(case=scored_trees(), name=st.sampled_from(SAMPLING_VERIFIERS), seed=st.integers(0, 100))
def test_temperature_zero_equals_the_greedy_verifier(case, name, seed):
    tree, scores = case
    greedy = verifier("greedy").verify(tree, scores, Sampler(SamplingParams()))
    got = verifier(name).verify(tree, scores, Sampler(SamplingParams(temperature=0, seed=seed)))
    assert (got.path, got.bonus) == (greedy.path, greedy.bonus)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def greedy_reference(target):
    return plain_greedy(target, PROMPT, 40)


@pytest.mark.parametrize("name", ["sample-match", "typical"])
def test_greedy_decoding_through_sampling_verifiers_is_lossless(target, greedy_reference, name):
    result = SpeculativeDecoder.from_names(target, "pld", "chain", name).generate(PROMPT, max_new_tokens=40)
    assert result.tokens == greedy_reference
    assert result.metrics.accepted_draft_tokens > 0


@pytest.mark.parametrize("draw", ["sampled", "top-k"])
def test_greedy_decoding_through_rejection_is_lossless(target, greedy_reference, draw):
    drafter = TinyModelDrafter(target, draft=tiny_llama(seed=1), count=3, length=3, draw=draw)
    decoder = SpeculativeDecoder(target, pipeline(target, drafter, "rejection"))
    result = decoder.generate(PROMPT, max_new_tokens=40)
    assert result.tokens == greedy_reference


# --- sampling end to end: the first two tokens follow the target ---------------------------------

E2E_RUNS = 600


@pytest.fixture(scope="module")
def vocab12():
    target = tiny_target(0)
    return target, LogitTable(target, [1, 2, 3, 4], 2)


@pytest.mark.parametrize("draw,params", [("sampled", SamplingParams(temperature=1.0)),
                                         ("top-k", SamplingParams(temperature=0.8, top_p=0.9))],
                         ids=["sampled-T1", "top-k-T0.8-p0.9"])
def test_rejection_end_to_end_matches_the_target_distribution(vocab12, draw, params):
    """Through the real decode loop, KV backend and Sampler: false-alarm rate 1e-4 (see the
    distribution test module); runs use seeds 0..E2E_RUNS-1, so the result is deterministic."""
    target, table = vocab12
    # q: the target itself at temperature 1.6, a real q that differs from p and still gets accepted.
    drafter = TinyModelDrafter(target, draft=target, count=3, length=2, temperature=1.6, draw=draw, seed=0)
    decoder = SpeculativeDecoder(target, pipeline(target, drafter, "rejection"), budget=6)
    counts: Counter = Counter()
    accepted = 0
    for seed in range(E2E_RUNS):
        decoder.sampling = SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed)
        result = decoder.generate([1, 2, 3, 4], max_new_tokens=4)  # room for a 3-node tree at step 1
        key = tuple(result.tokens[:2])
        counts[key] += 1
        accepted += result.metrics.accepted_draft_tokens
    assert accepted > E2E_RUNS / 4  # drafts were really accepted, so the tree path was exercised
    assert chi_square_pvalue(counts, exact_distribution(table, params)) >= 1e-4


@pytest.mark.parametrize("drafter_spec", ["draft-model(layers=1, num_tokens=2, topk=2)", "s4c(heads={heads}, widths=2, topk=2)"],
                         ids=["draft-model", "s4c"])
def test_drafters_with_real_q_sample_their_drafts_and_stay_lossless(vocab12, tmp_path, drafter_spec):
    """`draw=auto` drafters sample from their processed q when the request samples, and `trie` keeps the
    whole (budget-sized) proposal, so the rejection verifier sees sampled drafts and uses q itself."""
    from specframe_s4c.heads import S4CHeads

    target, table = vocab12
    heads = tmp_path / "heads.safetensors"
    torch.manual_seed(0)
    S4CHeads(target, 3).save(heads)
    seen: set[DrawMethod] = set()

    class Recording(get_registry().get("verifier", "rejection")):
        def verify(self, tree, scores, sampler):
            if len(tree):
                seen.add(tree.draw)
            return super().verify(tree, scores, sampler)

    params = SamplingParams(temperature=0.9, top_k=8)
    template = specframe.assemble(target, drafter_spec.format(heads=repr(str(heads))), "trie", "rejection", "kv",
                                  sampling=params)
    decoder = SpeculativeDecoder(target, Pipeline(template.drafter, template.tree_builder, Recording(),
                                                  template.backend), budget=6)
    counts: Counter = Counter()
    accepted = 0
    for seed in range(E2E_RUNS):
        decoder.sampling = SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed)
        result = decoder.generate([1, 2, 3, 4], max_new_tokens=4)
        counts[tuple(result.tokens[:2])] += 1
        accepted += result.metrics.accepted_draft_tokens
    assert seen == {DrawMethod.SAMPLED}
    assert accepted > E2E_RUNS / 10  # drafts were really accepted
    assert chi_square_pvalue(counts, exact_distribution(table, params)) >= 1e-4


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
    for name, needs_q in [("sample-match", False), ("rejection", True)]:
        caps = registry.get("verifier", name).capabilities
        assert caps.lossless and caps.supports_sampling and caps.needs_draft_probs == needs_q


def test_capability_errors_name_the_fix(target):
    with pytest.raises(CapabilityError, match="'rejection' needs draft probabilities.*'sample-match'"):
        SpeculativeDecoder.from_names(target, "pld", "chain", "rejection", sampling=HOT)
    with pytest.raises(CapabilityError, match="'greedy' is greedy only"):
        SpeculativeDecoder.from_names(target, "pld", "chain", "greedy", sampling=HOT)


def test_rejection_refuses_a_draft_token_its_q_could_not_have_drawn():
    proposal = DraftProposal(np.array([2]), np.array([-1]), np.zeros(1),
                             draft_probs=torch.tensor([[0.5, 0.5, 0.0, 0.0]]), draw=DrawMethod.SAMPLED)
    tree = TokenTree.from_proposal(proposal, [0])
    with pytest.raises(SpecframeError, match="rejection.*draft probability 0"):
        verifier("rejection").verify(tree, TargetScores(torch.zeros(2, 4)), Sampler(HOT))


@pytest.mark.parametrize("options", [dict(threshold=0), dict(threshold=1.5), dict(alpha=-1)])
def test_typical_bad_options(options):
    with pytest.raises(ConfigurationError, match="typical"):
        verifier("typical", **options)


def test_from_proposal_keeps_sampled_draws_only_when_no_sibling_was_picked_by_score():
    proposal = DraftProposal.from_sequences([[1, 2], [3], [1, 4]])  # nodes: 1, 2, 3, 4
    proposal.draw = DrawMethod.SAMPLED
    assert TokenTree.from_proposal(proposal, [0, 1, 2, 3]).draw is DrawMethod.SAMPLED  # everything kept
    assert TokenTree.from_proposal(proposal, [0, 2]).draw is DrawMethod.RETRIEVED  # picked
    assert TokenTree.from_proposal(proposal, [0, 1], draw_order_prefix=True).draw is DrawMethod.SAMPLED
    proposal.draw = DrawMethod.TOPK
    assert TokenTree.from_proposal(proposal, [0, 2]).draw is DrawMethod.TOPK  # deterministic: any shape
