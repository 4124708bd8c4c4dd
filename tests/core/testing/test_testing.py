"""specframe.testing: the conformance checks catch broken components, the law checks tell lossless
samplers and builders from biased ones, and the tiny targets behave.
tests/core/testing/test_conformance.py runs the suites on the first-party components."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import specframe
from specframe import DrawMethod, TargetScores, TokenTree, Verifier, VerifierCapabilities, VerifyResult
from specframe.testing import check_tree_builder_law, check_verifier_law
from specframe.testing import (
    DrafterConformance, MarkovProblem, VerifierConformance, checks, random_proposal, reference_greedy,
    repetitive_prompt,
)


# --- the checks must fail on broken components ----------------------------------------------------------


class AlwaysFirstChild(Verifier):
    """Wrong on purpose: accepts the first child whatever the target says, then samples the bonus."""

    name = "always-first"
    capabilities = VerifierCapabilities(lossless=True, supports_sampling=True)

    def verify(self, tree, scores, sampling):
        path = [tree.children[0][0]] if tree.children[0] else []
        return VerifyResult(path, sampling.sample(scores.logits[path[-1] + 1 if path else 0]))


class NaiveSampleMatch(Verifier):
    """Right: sample from p at each node and descend if a child carries the sample (lossless)."""

    name = "naive-sample-match"
    capabilities = VerifierCapabilities(lossless=True, supports_sampling=True)

    def verify(self, tree, scores, sampling):
        path, node = [], -1
        while True:
            token = sampling.sample(scores.logits[node + 1])
            child = tree.child(node, token)
            if child is None:
                return VerifyResult(path, token)
            path.append(child)
            node = child


def test_law_check_passes_a_lossless_sampler():
    results = check_verifier_law(NaiveSampleMatch(), runs=3000)
    assert all(r.pvalue >= 1e-4 for r in results.values()) and len(results) >= 3


def test_law_check_catches_a_biased_sampler():
    with pytest.raises(AssertionError, match="does not follow the target's distribution"):
        check_verifier_law(AlwaysFirstChild(), runs=3000)


def test_tree_builder_law_check_passes_chain_and_catches_a_builder_that_picks_by_score():
    from lossless_mutants import ByScoreChain

    check_tree_builder_law(specframe.get_registry().get("tree builder", "chain")(), runs=3000)
    with pytest.raises(AssertionError, match="tree builder 'mutant-chain-by-score' does not follow"):
        check_tree_builder_law(ByScoreChain(), runs=3000)


def test_greedy_check_catches_a_biased_verifier():
    with pytest.raises(AssertionError, match="declared lossless"):
        checks.check_verifier_greedy(AlwaysFirstChild(), np.random.default_rng(0))


class FirstNodeOnly(Verifier):
    """Lossless but not maximal: accepts at most the first node the target agrees with."""

    name = "first-node-only"
    capabilities = VerifierCapabilities(lossless=True)

    def verify(self, tree, scores, sampling):
        best = int(scores.logits[0].argmax())
        child = tree.child(-1, best)
        if child is None:
            return VerifyResult([], best)
        return VerifyResult([child], int(scores.logits[child + 1].argmax()))


def test_a_lossless_verifier_may_accept_less_but_is_not_maximal():
    suite = type("Suite", (VerifierConformance,), {"component": FirstNodeOnly})()
    suite.test_greedy_paths(np.random.default_rng(0))  # lossless: passes
    with pytest.raises(pytest.skip.Exception):
        suite.test_greedy_paths_are_longest(np.random.default_rng(0))  # maximal is opt-in
    with pytest.raises(AssertionError, match="accepted 1 of the [2-9]"):
        checks.check_verifier_greedy(FirstNodeOnly(), np.random.default_rng(0), maximal=True)


class Silent(specframe.Drafter):
    """Proposes nothing, ever: lossless by construction, useless as a drafter."""

    name = "silent"

    def propose(self, context):
        return specframe.DraftProposal.empty()


def test_a_drafter_that_never_proposes_is_flagged(tiny_target, tiny_prompt):
    suite = type("Suite", (DrafterConformance,), {"component": Silent})()
    suite.test_lossless_with_branching_tree(tiny_target, [tiny_prompt])  # passes: nothing to get wrong
    with pytest.raises(AssertionError, match="drafter 'silent' proposed nothing in [0-9]+ steps"):
        suite.test_proposes_drafts(tiny_target, [tiny_prompt])
    opted_out = type("Suite", (DrafterConformance,), {"component": Silent, "proposes": False})()
    with pytest.raises(pytest.skip.Exception):
        opted_out.test_proposes_drafts(tiny_target, [tiny_prompt])


def test_backend_check_catches_a_backend_that_ignores_the_tree_mask(tiny_target, tiny_prompt):
    registry = specframe.get_registry()
    kv, recompute = registry.get("backend", "kv"), registry.get("backend", "recompute")

    class CausalOnly(recompute):  # attends to every earlier packed entry, siblings included: wrong for trees
        name = "causal-only"

        def _mask(self, prefix, tree):
            return None

    checks.check_backend_scores(kv, tiny_target, tiny_prompt, np.random.default_rng(0))
    checks.check_backend_scores(recompute, tiny_target, tiny_prompt, np.random.default_rng(0))
    with pytest.raises(AssertionError, match="differ from a plain forward pass"):
        checks.check_backend_scores(CausalOnly, tiny_target, tiny_prompt, np.random.default_rng(0))


def test_backend_check_catches_scores_without_their_tree_and_stale_commits(tiny_target, tiny_prompt):
    recompute = specframe.get_registry().get("backend", "recompute")  # a one-sequence backend

    class Treeless(recompute):  # forgets to say which tree it scored
        name = "treeless"

        def score(self, tree):
            scores = super().score(tree)
            scores.tree = None
            return scores

    class Forgetful(recompute):  # commits whatever it is given: stale scores would corrupt the state
        name = "forgetful"

        def redeem(self, scored):
            pass

    with pytest.raises(AssertionError, match="must set TargetScores.tree"):
        checks.check_backend_scores(Treeless, tiny_target, tiny_prompt, np.random.default_rng(0))
    with pytest.raises(AssertionError, match="accepted scores of an earlier score"):
        checks.check_backend_scores(Forgetful, tiny_target, tiny_prompt, np.random.default_rng(0))


def test_copy_check_catches_a_backend_whose_copies_share_their_state(tiny_target):
    """A backend that declares `fresh_state_per_copy` but keeps its sequence in an object its copies share
    (the second copy's prefill takes over the first's row) is caught; `recompute` and `kv`, whose prefill
    makes a new state, pass."""
    registry = specframe.get_registry()
    kv, recompute = registry.get("backend", "kv"), registry.get("backend", "recompute")

    def shared(name: str) -> property:
        return property(lambda self: getattr(self.state, name),
                        lambda self, value: setattr(self.state, name, value))

    class OneState(recompute):  # its tokens and pending root live in a helper that shallow copies share
        name = "one-state"
        committed, pending = shared("committed"), shared("pending")

        def __init__(self, target, **options):
            self.state = types.SimpleNamespace()
            super().__init__(target, **options)

    prompts = [repetitive_prompt(tiny_target.vocab_size, n, seed=s) for n, s in ((40, 0), (25, 1))]
    for backend in (kv, recompute):
        checks.check_fresh_state_per_copy(backend, tiny_target, prompts, np.random.default_rng(0))
    with pytest.raises(AssertionError, match="declares fresh_state_per_copy, but copy 0 of 2"):
        checks.check_fresh_state_per_copy(OneState, tiny_target, prompts, np.random.default_rng(0))


def test_tree_check_catches_over_budget_and_invented_paths():
    proposal = random_proposal(np.random.default_rng(0), 16, 10)
    everything = TokenTree.from_proposal(proposal, np.arange(10))
    checks.check_tree(everything, proposal, 10)
    with pytest.raises(AssertionError, match="budget"):
        checks.check_tree(everything, proposal, 4)
    invented = TokenTree(proposal.tokens[:3] + 1, proposal.parents[:3])
    with pytest.raises(AssertionError, match="no path of the proposal"):
        checks.check_tree(invented, proposal, 10)


def test_lossless_check_catches_a_wrong_decoder(tiny_target, tiny_prompt):
    decoder = checks.make_decoder(tiny_target, "pld", "chain", AlwaysFirstChild)
    with pytest.raises(AssertionError, match="not lossless"):
        checks.check_lossless(decoder, [tiny_prompt], 24)


def test_proposal_check_rejects_out_of_vocabulary_tokens():
    bad = specframe.DraftProposal(np.array([3, 200]), np.array([-1, 0]), np.ones(2))
    with pytest.raises(AssertionError, match="outside"):
        checks.check_proposal(bad, 96, "x")


def test_markov_trees_carry_the_q_their_tokens_were_drawn_from():
    problem = MarkovProblem.random(np.random.default_rng(0))
    tree = problem.tree(np.random.default_rng(1), 12, DrawMethod.SAMPLED)
    assert tree.depth.max() <= problem.logits.shape[0]
    for i in range(len(tree)):
        p = int(tree.parents[i])
        q = problem.draft[0, 0] if p < 0 else problem.draft[tree.depth[p], tree.tokens[p]]
        assert torch.equal(tree.draft_probs[i], q)
    scores = problem.scores(tree)
    assert isinstance(scores, TargetScores) and scores.logits.shape == (len(tree) + 1, problem.vocab_size)


def test_the_tiny_target_has_a_tiny_offline_tokenizer(tiny_target):
    tokenizer = tiny_target.tokenizer
    assert len(tokenizer) == tiny_target.vocab_size == 96 and tokenizer.eos_token_id is None
    text = "def fib(n):\n    return n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    decoder = specframe.SpeculativeDecoder.from_names(tiny_target, "pld", budget=4)
    result = decoder.generate(text, max_new_tokens=8, stop=["zzz"])
    assert len(result.tokens) == 8 and result.text == tokenizer.decode(result.tokens)
    assert specframe.testing.tiny_target(seed=0, tokenizer=False).tokenizer is None


def test_reference_greedy_matches_transformers_generate(tiny_target, tiny_prompt):
    ids = torch.tensor([tiny_prompt])
    out = tiny_target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                     do_sample=False)
    assert reference_greedy(tiny_target, tiny_prompt, 16) == out[0, len(tiny_prompt):].tolist()


@pytest.mark.parametrize("kind", ["mamba2", "bamba"])
def test_reference_greedy_matches_generate_on_a_model_that_clamps_dt(kind):
    """Mamba2-type mixers clamp their time steps to `time_step_limit` in a multi-token forward but not in
    the one-token step `generate` feeds each new token to: the reference decodes as `generate` does (a
    recomputation of the whole sequence per token clamps every token and emits other tokens here)."""
    from ssm_models import make_repetitive, tiny_ssm_target

    target = make_repetitive(tiny_ssm_target(kind, dt_max=0.3, seed=3))
    prompt = [5, 9, 3, 7, 11, 2, 8, 9, 3, 7]
    ids = torch.tensor([prompt])
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                                pad_token_id=0)
    assert reference_greedy(target, prompt, 16) == out[0, len(prompt):].tolist()
