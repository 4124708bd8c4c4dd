"""`specframe.bench.replay`: replaying recorded outputs gives exactly the steps a real run took."""

from __future__ import annotations

import pytest

from specframe import SamplingParams, SpeculativeDecoder
from specframe.bench.methods import parse_method
from specframe.bench.replay import Turn, accepted_path, replay
from specframe.cost import PolynomialCost
from specframe.errors import ConfigurationError
from specframe.registry import get_registry
from specframe.testing.targets import repetitive_prompt
from specframe.tree import TokenTree
from tests.conftest import tiny_llama

FLAT = PolynomialCost((0.0, 0.01))  # 10 ms a step whatever the tree


@pytest.fixture(scope="module")
def tiny(one_thread):
    return tiny_llama(seed=3, vocab=64)


@pytest.mark.parametrize("spec, sampling", [
    ("pld+chain+greedy@4", None),
    ("pld+trie+greedy@6", None),
    ("pld+trie+sample-match@6", SamplingParams(temperature=0.5, seed=11)),
])
def test_replay_takes_the_steps_the_real_run_took(tiny, spec, sampling):
    method = parse_method(spec, get_registry())
    drafter, tree, verifier = (c.name for c in method.components[:3])
    decoder = SpeculativeDecoder.from_names(tiny, drafter, tree, verifier, budget=method.budget,
                                            sampling=sampling)
    turns, steps = [], 0
    for seed in (1, 2):
        prompt = repetitive_prompt(64, 64, seed=seed)
        result = decoder.generate(prompt, max_new_tokens=40)
        turns.append(Turn(f"q{seed}", 0, 0, prompt, list(result.tokens)))
        steps += result.metrics.steps
    stats = replay(tiny, method, turns, cost=FLAT)
    assert stats.tokens == sum(len(t.tokens) for t in turns)
    assert stats.steps == steps
    assert sum(stats.turn_steps) == steps and len(stats.turn_steps) == len(stats.by_turn)
    assert stats.tau > 1.0  # the prompts repeat themselves: drafts were accepted
    assert stats.speedup == pytest.approx(stats.tau, rel=0.05)  # flat cost: speed is tau, bar drafting


def test_accepted_path_follows_the_recorded_tokens():
    import numpy as np

    tree = TokenTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 1, 2]))  # 5 | 6 -> 7 -> 8
    assert accepted_path(tree, [6, 7, 9]) == [1, 2]
    assert accepted_path(tree, [6, 7, 8, 1]) == [1, 2, 3]
    assert accepted_path(tree, [4]) == []
    assert accepted_path(TokenTree.empty(), [4]) == []


def test_replay_needs_a_calibration(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))
    method = parse_method("pld@auto", get_registry())
    with pytest.raises(ConfigurationError, match="specframe calibrate"):
        replay(tiny, method, [Turn("q", 0, 0, [1, 2, 3], [4, 5])])


def test_copy_bound_counts_the_longest_earlier_run_after_the_context():
    from specframe.bench.replay import copy_bound

    turn = Turn("q", 0, 0, [1, 2, 3, 4], [1, 2, 3, 4])  # the output repeats the prompt
    assert copy_bound([turn], context=0) == pytest.approx(4 / 1)  # the whole output, copied in one step
    # After the context's last token 4 nothing has followed yet: one token; then 2, 3, 4 follow 1 as in
    # the prompt, copied in a second step.
    assert copy_bound([turn], context=1) == pytest.approx(4 / 2)
    fresh = Turn("q", 0, 0, [7, 8], [5, 6])
    assert copy_bound([fresh], context=0) == pytest.approx(1.0)  # nothing to copy: one token a step
    later = Turn("q", 0, 1, [7, 8], [5, 6])
    assert copy_bound([fresh, later], context=1) == pytest.approx((2 + 2) / (2 + 1))  # copies the 1st output
