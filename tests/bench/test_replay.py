"""`specframe.bench.replay`: replaying recorded outputs gives exactly the steps a real run took."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specframe import SamplingParams, SpeculativeDecoder
from specframe.bench.methods import parse_method
from specframe.bench.replay import Turn, accepted_path, oracle_choice, recorded_turns, replay
from specframe.bench.store import RECORD_METRICS
from specframe.support.prompt_suites import BenchPrompt
from specframe.terms.cost import MeasuredCost, PolynomialCost
from specframe.terms.errors import ConfigurationError
from specframe.plugging.registry import get_registry
from specframe.testing.targets import repetitive_prompt
from specframe.terms.tree import TokenTree
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
    plain, modelled = np.sum(stats.turn_seconds, axis=0)  # per turn: what the tables by category add up
    assert len(stats.turn_seconds) == len(turns) and plain / modelled == pytest.approx(stats.speedup)
    assert stats.tau > 1.0  # the prompts repeat themselves: drafts were accepted
    # Flat cost: the modelled forwards alone give a speed of exactly tau; the real drafting time (which a
    # busy machine stretches, so it is not compared with a figure) can only take from it.
    assert stats.plain_s / (stats.modelled_s - stats.draft_s) == pytest.approx(stats.tau, rel=1e-6)
    assert 0.0 < stats.draft_s and stats.speedup < stats.tau


class CharTokenizer:
    """Characters as token ids: enough for `encode_turn` on prompts without a chat template."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_recorded_turns_skip_a_line_cut_short(tmp_path):
    runs = (("baseline", [7, 8]), ("other", [9]))
    rows = [{"method": m, "qid": "q0", "category": "c", "turn": 0, "repeat": 0, "tokens": tokens,
             "metrics": dict.fromkeys(RECORD_METRICS, 0)} for m, tokens in runs]
    text = "".join(json.dumps(r) + "\n" for r in rows) + json.dumps(rows[0])[:25]  # a write cut short
    (tmp_path / "records.jsonl").write_text(text)
    prompts = [BenchPrompt("q0", "c", ("ab",), chat=False)]
    turns = recorded_turns(tmp_path / "records.jsonl", prompts, CharTokenizer())
    assert [(t.qid, t.prompt_ids, t.tokens) for t in turns] == [("q0", [97, 98], [7, 8])]


def test_accepted_path_follows_the_recorded_tokens():
    tree = TokenTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 1, 2]))  # 5 | 6 -> 7 -> 8
    assert accepted_path(tree, [6, 7, 9]) == [1, 2]
    assert accepted_path(tree, [6, 7, 8, 1]) == [1, 2, 3]
    assert accepted_path(tree, [4]) == []
    assert accepted_path(TokenTree.empty(), [4]) == []


def test_the_oracle_keeps_the_accepted_path_in_the_cheapest_tree_that_holds_it():
    tree = TokenTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 1, 2]))  # 5 | 6 -> 7 -> 8
    kept, seconds = oracle_choice(tree, [6, 7, 9], PolynomialCost((0.1, 0.9)), cap=8)
    assert kept.tokens.tolist() == [6, 7] and kept.parents.tolist() == [-1, 0]
    assert seconds == pytest.approx(1.2)  # two nodes
    kept, seconds = oracle_choice(tree, [4], PolynomialCost((0.1, 0.9)), cap=8)
    assert len(kept) == 0 and seconds == pytest.approx(1.0)  # nothing accepted: a plain step
    dear_single_rows = MeasuredCost((0, 1, 4, 8), (1.0, 0.95, 0.9, 1.5), (1.0, 0.95, 0.9, 1.5))
    kept, seconds = oracle_choice(tree, [4], dear_single_rows, cap=8)
    assert len(kept) == 0 and seconds == pytest.approx(0.9)  # a 4-node tree of throwaway nodes is cheaper


def test_the_oracle_bounds_what_the_planner_gets_from_the_same_drafts(tiny):
    """Knowing the accepted path, the oracle accepts at least what the planner's tree accepts, for a
    forward no dearer than one over that path: its tau and speed are upper bounds."""
    method = parse_method("pld+trie+greedy@auto", get_registry())
    decoder = SpeculativeDecoder.from_names(tiny, "none")
    turns = []
    for seed in (1, 2):
        prompt = repetitive_prompt(64, 64, seed=seed)
        turns.append(Turn(f"q{seed}", 0, 0, prompt, list(decoder.generate(prompt, max_new_tokens=40).tokens)))
    cost = PolynomialCost((0.002, 0.008))  # a node costs a fifth of a plain step: the planner cuts
    planned, oracle = (replay(tiny, method, turns, cost=cost, oracle=o) for o in (False, True))
    assert oracle.tau >= planned.tau and oracle.speedup > planned.speedup
    assert oracle.nodes < planned.nodes  # it keeps only what the target accepts


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


def test_replayed_features_are_the_ones_decoding_passes(tiny):
    """A drafter that needs hidden states gets, in a replay, the feature a real decode passes it."""
    import torch

    from specframe import Drafter, DrafterCapabilities, DraftProposal
    from specframe.bench.replay import teacher_forced_features
    from specframe.testing import reference_greedy

    prompt = repetitive_prompt(64, 32, seed=4)
    expected = reference_greedy(tiny, prompt, 24)
    seen = []

    class Oracle(Drafter):  # drafts the next 3 tokens of the known output: every step accepts several
        name = "oracle"
        capabilities = DrafterCapabilities(needs_hidden_states=True)

        def propose(self, context):
            seen.append((len(context.tokens), context.hidden))
            done = len(context.tokens) - len(prompt)
            ahead = expected[done:done + min(3, context.budget)]
            chain = np.arange(len(ahead))
            return DraftProposal(np.array(ahead), chain - 1, -chain.astype(float))

    decoder = SpeculativeDecoder.from_names(tiny, Oracle, "chain", "greedy", budget=3)
    assert decoder.generate(prompt, max_new_tokens=24).tokens == expected
    features = teacher_forced_features(tiny, Turn("q", 0, 0, prompt, expected))
    assert seen[0][1] is None and len(seen) > 2  # the first step has no feature yet
    for length, hidden in seen[1:]:
        torch.testing.assert_close(hidden, features[length - 2], atol=1e-4, rtol=1e-4)


def test_a_drafter_with_heads_replays_the_steps_the_real_run_took(tiny, tmp_path):
    from specframe_s4c.drafter import S4CDrafter

    heads = S4CDrafter.example_options(tiny, str(tmp_path))["heads"]
    method = parse_method(f"s4c(heads={heads!r}, topk=3)+trie+greedy@6", get_registry())
    decoder = SpeculativeDecoder.from_names(tiny, method.drafter, "trie", "greedy", budget=6)
    prompt = repetitive_prompt(64, 64, seed=5)
    result = decoder.generate(prompt, max_new_tokens=40)
    stats = replay(tiny, method, [Turn("q", 0, 0, prompt, list(result.tokens))], cost=FLAT)
    assert stats.steps == result.metrics.steps and stats.nodes == sum(result.metrics.tree_sizes)


def test_open_run_names_a_directory_that_is_not_a_bench_run(tmp_path):
    from specframe.bench.replay import open_run

    with pytest.raises(ConfigurationError, match="not a `specframe bench --out` directory"):
        open_run(tmp_path)
