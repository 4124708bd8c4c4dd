"""Sampling through the `llamacpp` backend follows the target's law exactly (the exact-law harness of
`specframe.testing.exact`), on a tiny random Llama with a vocabulary of 8 written as a GGUF (`tiny_gguf`).

The law is that of the backend's own logits: its plain-step logits after the prompt and after every
one-token continuation, tabulated once (llama.cpp quantizes activations, so they are not transformers'
logits of the same weights). A draft model whose q `rejection` uses, and a drafter verified by sampling
and matching, must both emit their first two tokens with that law; plain sampling through the backend too.
Skipped where llama-cpp-python is not installed."""

from __future__ import annotations

import pytest
from tiny_gguf import tiny_gguf_target

from specframe import Pipeline, PolynomialCost, SamplingParams, SpeculativeDecoder, TokenTree
from specframe.plugging.registry import get_registry
from specframe.testing.exact import P_PASS, LogitTable, contexts, decoder_counts, exact_law, law_test
from specframe_llamacpp import LlamaCppBackend

SKIP = "llama-cpp-python is not installed: pip install 'specframe[llamacpp]'"
pytest.importorskip("llama_cpp", reason=SKIP)

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


def decoder(setup, drafter: str, tree: str, verifier: str, budget) -> SpeculativeDecoder:
    target, _, workdir = setup
    registry = get_registry()
    cls = registry.get("drafter", drafter)
    pipeline = Pipeline(cls(target, **cls.example_options(target, workdir)),
                        registry.get("tree builder", tree)(), registry.get("verifier", verifier)(),
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
