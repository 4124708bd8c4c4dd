"""Sampling controls: parameter checks, the one temperature/top-k/top-p implementation, seeded draws, and
reproducible seeded decoding (plain and speculative)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe import ConfigurationError, Sampler, SamplingParams, SpeculativeDecoder
from specframe.terms.sampling import argmax, check_draw, samples_drafts
from specframe.testing.exact import law_test

PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 3, 4, 5, 6]


# --- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(temperature=0.7, top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(temperature=0.7, top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(temperature=0.7, top_p=-0.1), "top_p"),
    (dict(temperature=0.7, top_p=float("nan")), "top_p"),
    (dict(temperature=0.7, top_k=-1), "top_k must be an integer >= 0"),
    (dict(temperature=0.7, top_k=2.5), "top_k"),
    (dict(temperature=0.7, seed="42"), "seed must be an integer"),
])
def test_bad_sampling_params_are_refused_with_a_fix(kwargs, match):
    with pytest.raises(ConfigurationError, match=match) as err:
        SamplingParams(**kwargs)
    assert "--" in str(err.value)  # names the CLI flag to change


def test_edge_values_are_accepted():
    SamplingParams(temperature=0, top_p=1.0, top_k=0)
    SamplingParams(temperature=2, top_p=1e-9, top_k=1, seed=-3)


# --- the processed distribution p ----------------------------------------------------------------

def reference_probs(logits: list[float], temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Textbook temperature -> top-k -> top-p, one token at a time in plain Python."""
    scaled = np.array(logits, np.float64) / temperature
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    keep = set(order if not top_k else [i for i in order if scaled[i] >= scaled[order[top_k - 1]]])
    probs = np.where([i in keep for i in range(len(scaled))], np.exp(scaled - scaled.max()), 0.0)
    probs /= probs.sum()
    nucleus, mass = set(), 0.0
    for i in order:
        if i in keep and mass < top_p:
            nucleus.add(i)
            mass += probs[i]
    probs = np.where([i in nucleus for i in range(len(scaled))], probs, 0.0)
    return probs / probs.sum()


@settings(max_examples=60, deadline=None)
@given(ticks=st.lists(st.integers(-40, 40), min_size=2, max_size=20, unique=True),
       temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5]), top_k=st.integers(0, 25),
       top_p=st.sampled_from([1.0, 0.93, 0.81, 0.47, 0.1]))
def test_probs_match_the_textbook_definition(ticks, temperature, top_k, top_p):
    logits = [t / 5 for t in ticks]  # distinct by 0.2: no ties for the filters to break differently
    sampler = Sampler(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    got = sampler.probs(torch.tensor(logits)).double().numpy()
    expected = reference_probs(logits, temperature, min(top_k, len(logits)), top_p)
    np.testing.assert_allclose(got, expected, atol=2e-5)
    # batched rows are processed independently and identically
    batch = sampler.probs(torch.tensor([logits, logits[::-1]]))  # (2, V)
    torch.testing.assert_close(batch[1], torch.tensor(expected[::-1].copy(), dtype=torch.float32), atol=2e-5,
                               rtol=0)


def test_greedy_probs_are_the_argmax_one_hot():
    sampler = Sampler(SamplingParams(temperature=0))
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 2.0, 1.0]])
    assert sampler.probs(logits).tolist() == [[0, 1, 0], [1, 0, 0]]  # ties: the first index, like argmax
    assert sampler.sample(logits[1]) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0, float("inf"), float("-inf"), float("nan")]),
                min_size=1, max_size=12), st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_the_fast_argmax_agrees_with_torch_on_ties_infinities_and_nans(values, dtype):
    logits = torch.tensor(values, dtype=dtype)
    assert argmax(logits) == int(logits.argmax())
    assert argmax(logits[::2]) == int(logits[::2].argmax())  # a strided view


# --- draws -------------------------------------------------------------------------------------------

def draw_check(draw, probs: torch.Tensor, n: int = 20000) -> float:
    """Chi-square p-value of `n` draws against `probs`. A correct sampler passes p >= 1e-4 (false alarm
    1e-4 over seeds; the seed is fixed)."""
    counts = Counter((draw(probs),) for _ in range(n))
    return law_test(counts, {(i,): float(p) for i, p in enumerate(probs) if p > 0}).pvalue


def test_draws_follow_the_distribution_and_a_wrong_sampler_fails():
    probs = torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 0.3, 1.7, -3.0]), -1)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=7))
    assert draw_check(sampler.draw, probs) >= 1e-4
    # Deliberately wrong: draws from p^1.2 (a slightly too cold distribution). The same check fails.
    wrong = Sampler(SamplingParams(temperature=1.0, seed=7))
    assert draw_check(lambda p: wrong.draw(p ** 1.2), probs) < 1e-4


def test_draws_never_pick_tokens_without_mass():
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=0))
    probs = sampler.probs(torch.tensor([5.0, -2.0, 4.0, 1.0]))
    assert {sampler.draw(probs) for _ in range(2000)} == {0, 2}
    assert sampler.draw(torch.tensor([0.0, 0.0, 1e-30, 0.0])) == 2


def test_seeded_draws_repeat_and_the_initial_seed_replays_an_unseeded_sampler():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))

    def draws(sampler):
        return [sampler.sample(logits) for _ in range(30)] + [sampler.uniform()]

    assert draws(Sampler(SamplingParams(1.0, seed=3))) == draws(Sampler(SamplingParams(1.0, seed=3)))
    assert draws(Sampler(SamplingParams(1.0, seed=3))) != draws(Sampler(SamplingParams(1.0, seed=4)))
    unseeded = Sampler(SamplingParams(temperature=1.0))
    assert draws(Sampler(SamplingParams(temperature=1.0, seed=unseeded.initial_seed))) == draws(unseeded)


def test_draft_draws_merge_in_first_drawn_order_and_leave_the_verifier_stream_alone():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 1.0]])
    plain, drafting = Sampler(SamplingParams(1.0, seed=5)), Sampler(SamplingParams(1.0, seed=5))
    rows = drafting.draw_drafts(probs, 6)
    assert all(len(set(row)) == len(row) for row in rows) and rows[1] == [3]
    assert 3 not in rows[0]  # no mass, never drawn
    assert [plain.uniform() for _ in range(5)] == [drafting.uniform() for _ in range(5)]
    firsts = Counter(Sampler(SamplingParams(1.0, seed=s)).draw_drafts(probs[:1], 3)[0][0]
                     for s in range(3000))
    law = {(0,): 0.5, (1,): 0.3, (2,): 0.2}
    assert law_test(Counter((t,) for t in firsts.elements()), law).pvalue >= 1e-4


def test_draft_draw_option_is_checked_and_auto_follows_the_request():
    assert samples_drafts("auto", Sampler(SamplingParams(0.8))) and not samples_drafts("auto", Sampler())
    assert not samples_drafts("top-k", Sampler(SamplingParams(0.8))) and not samples_drafts("auto", None)
    with pytest.raises(ConfigurationError, match="draw must be one of auto, top-k, sample"):
        check_draw("s4c", "nucleus")


def test_uniforms_are_uniform():
    sampler = Sampler(SamplingParams(temperature=1.0, seed=1))
    values = [sampler.uniform() for _ in range(4000)]
    assert 0 <= min(values) and max(values) < 1
    assert abs(np.mean(values) - 0.5) < 4 * math.sqrt(1 / 12 / 4000)


# --- decoding -------------------------------------------------------------------------------------------

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


SAMPLED_SETTINGS = [SamplingParams(temperature=0.2, seed=1), SamplingParams(0.7, top_p=0.5, seed=1),
                    SamplingParams(temperature=1.0, top_k=2, seed=1)]


@pytest.mark.parametrize("params", SAMPLED_SETTINGS, ids=lambda p: f"T{p.temperature}-p{p.top_p}-k{p.top_k}")
def test_a_seeded_run_is_reproducible_and_sample_match_replays_plain_sampling(target, params):
    """Every emitted token of sample-match is one draw, so with the same seed it emits what plain
    sampling (drafter `none`, one token per step) emits."""
    plain = SpeculativeDecoder.from_names(target, "none", "chain", "sample-match", sampling=params)
    spec = SpeculativeDecoder.from_names(target, "pld(min_ngram=1)", "chain", "sample-match", sampling=params,
                                         budget=8)  # a fixed budget: trees every step, whatever they cost
    first = plain.generate(PROMPT, max_new_tokens=40)
    assert plain.generate(PROMPT, max_new_tokens=40).tokens == first.tokens
    result = spec.generate(PROMPT, max_new_tokens=40)
    assert result.tokens == first.tokens
    assert result.metrics.steps < first.metrics.steps  # drafts were accepted, so this tested trees too
    other = SamplingParams(params.temperature, params.top_p, params.top_k, seed=params.seed + 1)
    assert SpeculativeDecoder.from_names(target, "none", "chain", "sample-match", sampling=other).generate(
        PROMPT, max_new_tokens=40).tokens != first.tokens



@pytest.mark.parametrize("flags,match", [(["--temperature", "-1"], "temperature"),
                                         (["--top-p", "0"], "top_p"), (["--top-k", "-2"], "top_k")])
def test_cli_refuses_bad_sampling_flags_before_loading_a_model(monkeypatch, capsys, flags, match):
    from specframe.cli import main

    monkeypatch.setattr("sys.argv", ["specframe", "generate", "hi", "--model", "no-such-model", *flags])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert f"error: sampling: {match}" in capsys.readouterr().err
