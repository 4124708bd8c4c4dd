"""Sampling through the `llamacpp` backend follows the target's law exactly (the exact-law harness of
`specframe.testing.exact`), on a tiny random Llama with a vocabulary of 8 written as a GGUF (`tiny_gguf`).

The law is that of the backend's own logits: its plain-step logits after the prompt and after every
one-token continuation, tabulated once (llama.cpp quantizes activations, so they are not transformers'
logits of the same weights). A draft model whose q `rejection` uses, and a drafter verified by sampling
and matching, must both emit their first two tokens with that law; plain sampling through the backend too.
The same harness rejects, by a wide margin, a wrong verifier and a wrong tree builder run through the backend
(mutants of `tests/helpers/lossless_mutants.py`), so its passes are evidence. Skipped where llama-cpp-python
is not installed."""

from __future__ import annotations

import pytest
from lossless_mutants import ByScoreChain, MutantRejection
from llamacpp_tests import require_llama_cpp
from tiny_gguf import tiny_gguf_target

from specframe import Pipeline, PolynomialCost, SamplingParams, SpeculativeDecoder, TokenTree
from specframe.plugging.registry import get_registry
from specframe.testing.exact import P_CATCH, P_PASS, LogitTable, contexts, decoder_counts, exact_law, law_test
from specframe_llamacpp import LlamaCppBackend

require_llama_cpp()

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # repeats, so copying drafters find matches
DEPTH, MAX_NEW = 2, 4
HOT = SamplingParams(temperature=1.0)
FILTERED = SamplingParams(temperature=0.7, top_p=0.9)
CHEAP_NODES = PolynomialCost((0.01, 1.0))  # adaptive trees keep most drafts


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target = tiny_gguf_target(tmp_path_factory.mktemp("gguf"), vocab_size=8)
    backend = LlamaCppBackend(target)
    rows = {}
    for ctx in contexts(target.vocab_size, DEPTH):
        backend.prefill(PROMPT + list(ctx))
        rows[ctx] = backend.score(TokenTree.empty()).logits[0]
    return target, LogitTable(rows, target.vocab_size, DEPTH), str(tmp_path_factory.mktemp("examples"))


def decoder(setup, drafter: str, tree, verifier, budget) -> SpeculativeDecoder:
    """A decoder on a fresh llamacpp backend; `tree` and `verifier` are registered names or instances."""
    target, _, workdir = setup
    registry = get_registry()
    cls = registry.get("drafter", drafter)
    tree = registry.get("tree builder", tree)() if isinstance(tree, str) else tree
    verifier = registry.get("verifier", verifier)() if isinstance(verifier, str) else verifier
    pipeline = Pipeline(cls(target, **cls.example_options(target, workdir)), tree, verifier,
                        LlamaCppBackend(target))
    return SpeculativeDecoder(target, pipeline, budget=budget, cost=CHEAP_NODES)


CASES = [("none", "chain", "sample-match", 1, HOT, 2000),  # plain sampling
         ("draft-model", "chain", "rejection", 3, FILTERED, 1000),  # q used
         ("draft-model", "static", "rejection", "auto:3", HOT, 1000),  # q used, adaptive trees
         ("pld", "chain", "sample-match", 3, HOT, 1000)]  # no q: sample and match


@pytest.mark.parametrize("drafter,tree,verifier,budget,params,runs", CASES,
                         ids=[f"{d}+{t}+{v}@{b}-T{p.temperature}" for d, t, v, b, p, _ in CASES])
def test_sampling_through_llamacpp_follows_the_target_law(setup, drafter, tree, verifier, budget, params,
                                                          runs):
    _, table, _ = setup
    run = decoder(setup, drafter, tree, verifier, budget)
    counts, accepted = decoder_counts(run, PROMPT, DEPTH, runs, params, MAX_NEW)
    result = law_test(counts, exact_law(table, params))
    assert result.pvalue >= P_PASS, f"{drafter}+{tree}+{verifier} on llamacpp at {params}: {result}"
    assert drafter == "none" or accepted > 0, "no draft was ever accepted: the trees were not exercised"


# Each mutant is one fault on the path the passing cases above take (draft-model + chain + rejection), run
# the same way (1,000 requests at T = 1 with seeds 0..999, so the outcome is fixed): both score p below 1e-15,
# and a total variation well above the noise of 1,000 exact draws.
CAUGHT_BY_FAR, RUNS_MUTANT = 1e-12, 1000
MUTANTS = [("bonus drawn from p, not the residual", "chain", MutantRejection("bonus-from-p")),
           ("children chosen by score from sampled drafts", ByScoreChain(), "rejection")]


@pytest.mark.parametrize("label,tree,verifier", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_a_wrong_sampler_through_llamacpp_is_rejected_by_far(setup, label, tree, verifier):
    _, table, _ = setup
    run = decoder(setup, "draft-model", tree, verifier, 3)
    counts, _ = decoder_counts(run, PROMPT, DEPTH, RUNS_MUTANT, HOT, MAX_NEW)
    result = law_test(counts, exact_law(table, HOT))
    assert result.pvalue < CAUGHT_BY_FAR < P_CATCH, f"mutant '{label}' passed through llamacpp: {result}"
    assert result.tv > 2 * result.tv_noise, f"mutant '{label}' is within twice the noise: {result}"
