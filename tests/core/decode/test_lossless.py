"""Lossless: tree scores equal per-path scores, and speculative greedy output equals plain greedy output."""

import itertools

import numpy as np
import pytest
import torch
from conftest import plain_greedy, tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st

import specframe
from specframe import CapabilityError, SpeculativeDecoder, TokenTree
from specframe.plugging.registry import get_registry

TINY_CONFIGS = [dict(seed=0, kv_heads=2), dict(seed=1, kv_heads=4), dict(seed=2, kv_heads=1, layers=3)]
REPETITIVE_PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 3, 4, 5, 6]


@st.composite
def trees(draw, vocab=96):
    n = draw(st.integers(0, 12))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    return TokenTree(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64))


@pytest.mark.parametrize("config", TINY_CONFIGS, ids=lambda c: f"seed{c['seed']}-kv{c['kv_heads']}")
@settings(max_examples=15, deadline=None)
@given(tree=trees(), prompt_len=st.integers(1, 12), path_pick=st.integers(0, 100))
def test_tree_scores_equal_per_path_scores(config, tree, prompt_len, path_pick):
    target = tiny_llama(**config)
    backend = get_registry().get("backend", "kv")(target)
    prompt = list(range(3, 3 + prompt_len))
    backend.prefill(prompt)
    scores = backend.score(tree)
    with torch.inference_mode():
        for path in tree.paths or [[]]:
            sequence = torch.tensor([prompt + tree.tokens[path].tolist()])
            expected = target.model(sequence).logits[0, prompt_len - 1:]  # root, then the path's nodes
            got = scores.logits[[0] + [i + 1 for i in path]]
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # Commit one path; the next scores equal a fresh sequential run.
    path = tree.paths[path_pick % len(tree.paths)] if len(tree) else []
    backend.commit(scores, path, bonus=11)
    after = backend.score(TokenTree.empty())
    with torch.inference_mode():
        sequence = torch.tensor([prompt + tree.tokens[path].tolist() + [11]])
        torch.testing.assert_close(after.logits[0], target.model(sequence).logits[0, -1],
                                   atol=1e-5, rtol=1e-5)
    assert backend.committed_length == prompt_len + len(path)


def drafter_tree_pairs(target, workdir):
    """Every registered drafter x tree builder pair that fits together at temperature 0."""
    registry = get_registry()
    for d_name, t_name in itertools.product(registry.names("drafter"), registry.names("tree builder")):
        d_cls, t_cls = registry.get("drafter", d_name), registry.get("tree builder", t_name)
        try:
            specframe.plugging.pipeline.check_compatible(
                target, d_cls, t_cls, registry.get("verifier", "greedy"), registry.get("backend", "kv"),
                specframe.SamplingParams())
        except CapabilityError:
            continue
        yield d_name, t_name, d_cls.example_options(target, workdir)


@pytest.mark.parametrize("config", TINY_CONFIGS, ids=lambda c: f"seed{c['seed']}-kv{c['kv_heads']}")
def test_every_drafter_tree_pair_is_lossless_on_tiny_models(config, tmp_path):
    target = tiny_llama(**config)
    expected = plain_greedy(target, REPETITIVE_PROMPT, 40)
    pairs = list(drafter_tree_pairs(target, str(tmp_path)))
    assert {"pld", "none"} <= {d for d, _, _ in pairs}
    for d_name, t_name, options in pairs:
        drafter = specframe.ComponentSpec(d_name, options)
        for budget in (1, 5, 12):
            decoder = SpeculativeDecoder.from_names(target, drafter, t_name, "greedy", "kv", budget=budget)
            got = decoder.generate(REPETITIVE_PROMPT, max_new_tokens=40).tokens
            assert got == expected, f"{d_name}+{t_name} budget {budget} diverged from plain greedy"


def test_pld_tree_proposals_are_lossless_and_accept_drafts():
    target = tiny_llama(seed=3)
    expected = plain_greedy(target, REPETITIVE_PROMPT, 48)
    decoder = SpeculativeDecoder.from_names(target, "pld(matches=4, min_ngram=1)", "chain", "greedy", "kv",
                                            budget=8)
    result = decoder.generate(REPETITIVE_PROMPT, max_new_tokens=48)
    assert result.tokens == expected
    assert result.metrics.steps == len(result.metrics.accepted_per_step)
    assert result.metrics.tau == pytest.approx(48 / result.metrics.steps)


PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n",
]


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS, ids=["fib", "fox", "humaneval0"])
def test_real_model_pld_is_lossless(smollm2, prompt):
    ids = smollm2.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    expected = plain_greedy(smollm2, ids, 48)
    for drafter in ("pld", "pld(matches=3)"):
        decoder = SpeculativeDecoder.from_names(smollm2, drafter, "chain", "greedy", "kv", budget=8)
        assert decoder.generate(ids, max_new_tokens=48).tokens == expected, drafter
