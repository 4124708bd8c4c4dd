"""The benchmark harness's parts: method specs, suites, the synthetic drafter, peers and the aggregates."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import specframe
from specframe.bench.methods import parse_method, resolve_methods, split_parts, usable_presets
from specframe.bench.peers import parse_peers, truncated_assistant
from specframe.bench.report import method_stats
from specframe.support.prompt_suites import BenchPrompt, load_suite
from specframe.bench.synthetic import SyntheticDrafter
from specframe.terms.errors import ConfigurationError, UnknownComponentError
from specframe.testing import tiny_target


def test_split_parts_ignores_separators_inside_parentheses():
    assert split_parts("rest(w=a+b)+trie+greedy") == ["rest(w=a+b)", "trie", "greedy"]
    assert split_parts("pld,hf-assisted(layers=2,num_tokens=3)", ",") == [
        "pld", "hf-assisted(layers=2,num_tokens=3)"]


def test_pipeline_specs_and_presets_resolve_through_the_registry():
    registry = specframe.get_registry()
    spec = parse_method("pld(max_ngram=4)+trie+sample-match@16", registry)
    assert (spec.drafter.name, spec.drafter.options) == ("pld", {"max_ngram": 4})
    assert [c.name for c in spec.components] == ["pld", "trie", "sample-match", "kv"]
    assert spec.budget == 16 and spec.label == "pld(max_ngram=4)+trie+sample-match@16"
    short = parse_method("pld", registry, default_budget=5)
    assert [c.name for c in short.components] == ["pld", "chain", "greedy", "kv"] and short.budget == 5
    assert "pld" in usable_presets(registry)


def test_bad_method_specs_fail_with_the_known_names():
    registry = specframe.get_registry()
    with pytest.raises(UnknownComponentError, match="Known drafters: .*pld"):
        parse_method("nosuch+chain", registry)
    with pytest.raises(UnknownComponentError, match="unknown verifier 'nosuch'"):
        parse_method("pld+chain+nosuch", registry)
    with pytest.raises(ConfigurationError, match="DRAFTER"):
        parse_method("pld+chain+greedy+kv+extra", registry)
    with pytest.raises(ConfigurationError, match="unique"):
        resolve_methods(["pld", "pld"], registry)
    with pytest.raises(UnknownComponentError, match="unknown peer 'hf-nosuch'. Known peers: .*hf-pld"):
        parse_peers("hf-nosuch")
    with pytest.raises(ConfigurationError, match="takes options"):
        parse_peers("hf-pld(layers=3)")


def test_suites_ship_every_question():
    spec = load_suite("spec-bench")
    categories = {p.category for p in spec}
    assert len(spec) == 480 and len(categories) == 13
    limited = load_suite("spec-bench", limit=5)
    assert len(limited) == 13 * 5 and {p.category for p in limited} == categories
    assert len({p.category for p in limited[:13]}) == 13  # round-robin: a partial run covers every category
    mt = load_suite("mt-bench")
    assert len(mt) == 80 and all(len(p.turns) == 2 and p.chat for p in mt)
    humaneval = load_suite("humaneval", limit=3)
    assert [p.qid for p in humaneval] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert not humaneval[0].chat and humaneval[0].turns[0].startswith("from typing")
    with pytest.raises(ConfigurationError, match="unknown suite"):
        load_suite("nosuch")


def test_synthetic_drafter_keeps_each_token_with_the_given_rate():
    target = tiny_target(vocab_size=64)
    reference = list(np.random.default_rng(0).integers(0, 64, size=4000))
    drafter = SyntheticDrafter(target, acceptance=0.6, seed=1)
    drafter.reference = reference
    prompt = np.arange(5)
    kept = []
    for start in range(0, 3992, 8):
        context = specframe.DraftContext(np.concatenate([prompt, reference[:start]]), 5, 8)
        proposal = drafter.propose(context)
        assert len(proposal) == 8 and list(proposal.parents) == list(range(-1, 7))  # a chain
        kept += list(proposal.tokens == reference[start:start + 8])
    assert abs(np.mean(kept) - 0.6) < 0.03


def test_truncated_assistant_shares_the_target_weights():
    target = tiny_target(layers=3)
    assistant = truncated_assistant(target, 2)
    assert len(assistant.model.layers) == 2 and assistant.config.num_hidden_layers == 2
    assert assistant.model.layers[0] is target.model.model.layers[0]
    assert assistant.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    with pytest.raises(ConfigurationError, match="layers must be"):
        truncated_assistant(target, 3)


def _record(qid, rep, tps, decode_tps, new=10, steps=5, drafted=8, accepted=5, hist=(1, 2, 2)):
    metrics = specframe.DecodeMetrics().to_dict()
    metrics.update(new_tokens=new, steps=steps, draft_tokens=drafted, accepted_draft_tokens=accepted,
                   tokens_per_s=tps, decode_tokens_per_s=decode_tps, acceptance_histogram=list(hist),
                   wall_s=new / tps, prefill_s=0.1, time_s=dict.fromkeys(metrics["time_s"], 0.01))
    return {"qid": qid, "turn": 0, "repeat": rep, "category": "c", "metrics": metrics}


def test_speedup_is_the_mean_of_per_turn_ratios_over_repeats():
    base = {(q, 0, r): _record(q, r, tps, tps) for q, r, tps in
            [("a", 0, 10.0), ("b", 0, 20.0), ("a", 1, 10.0), ("b", 1, 20.0)]}
    mine = [_record("a", 0, 20.0, 30.0), _record("b", 0, 20.0, 20.0),
            _record("a", 1, 30.0, 30.0), _record("b", 1, 20.0, 20.0)]
    stats = method_stats(mine, base)
    # repeat 0: mean(2, 1) = 1.5; repeat 1: mean(3, 1) = 2.0
    assert stats["speedup"]["mean"] == pytest.approx(1.75)
    assert stats["speedup"]["std"] == pytest.approx(np.std([1.5, 2.0], ddof=1))
    assert stats["speedup_excl_prefill"]["mean"] == pytest.approx(np.mean([(3 + 1) / 2, (3 + 1) / 2]))
    assert stats["tau"] == pytest.approx(40 / 20) and stats["alpha"] == pytest.approx(20 / 32)
    assert stats["acceptance_histogram"] == [4, 8, 8]
    assert stats["time_per_step_ms"]["forward"] == pytest.approx(1000 * 0.04 / 20)


def test_fastest_keeps_each_turns_fastest_repeat_of_every_method_baseline_included():
    from specframe.bench.report import summarize
    from specframe.bench.loop import BenchRun

    def rec(method, qid, rep, tps):
        return {**_record(qid, rep, tps, tps), "method": method}

    base = [rec("plain", "a", 0, 10.0), rec("plain", "a", 1, 5.0),  # a stall in repeat 1
            rec("plain", "b", 0, 18.0), rec("plain", "b", 1, 20.0)]
    mine = [rec("m", "a", 0, 12.0), rec("m", "a", 1, 15.0), rec("m", "b", 0, 20.0), rec("m", "b", 1, 10.0)]
    runners = [SimpleNamespace(label="plain", baseline=None), SimpleNamespace(label="m", baseline="plain")]
    run = BenchRun(base + mine, runners, [BenchPrompt("a", "c", ("q",)), BenchPrompt("b", "c", ("q",))])
    fastest = summarize(run, "fastest")["c"]["m"]
    assert fastest["speedup"] == {"mean": pytest.approx((15 / 10 + 20 / 20) / 2), "std": 0.0}
    assert fastest["repeats"] == 1 and fastest["turns"] == 2
    everything = summarize(run, "all")["c"]["m"]  # repeat 0: (1.2 + 20/18) / 2, repeat 1: (3 + 0.5) / 2
    assert everything["speedup"]["mean"] == pytest.approx(((1.2 + 20 / 18) / 2 + 3.5 / 2) / 2)


def test_fastest_of_repeats_is_refused_where_repeats_differ():
    from specframe.bench.harness import check_keep
    from specframe.terms.sampling import SamplingParams

    registry = specframe.get_registry()
    specs = resolve_methods(["pld", "s4c@auto"], registry, "auto")
    check_keep("fastest", SamplingParams(), specs, registry)
    with pytest.raises(ConfigurationError, match="greedy"):
        check_keep("fastest", SamplingParams(temperature=0.7, seed=0), specs, registry)
    with pytest.raises(ConfigurationError, match="--keep must be one of all, fastest"):
        check_keep("min", SamplingParams(), specs, registry)
    pytest.importorskip("arctic_inference")
    remembers = resolve_methods(["pld", "suffix"], registry, "auto")
    check_keep("all", SamplingParams(), remembers, registry)
    with pytest.raises(ConfigurationError, match="'suffix' remembers earlier requests"):
        check_keep("fastest", SamplingParams(), remembers, registry)


def test_shards_split_a_suite_into_disjoint_interleaved_parts():
    from specframe.bench.harness import take_shard

    prompts = [BenchPrompt(str(i), "c", ("q",)) for i in range(7)]
    parts = [take_shard(prompts, f"{i}/3") for i in range(3)]
    assert [[p.qid for p in part] for part in parts] == [["0", "3", "6"], ["1", "4"], ["2", "5"]]
    for bad in ("3/3", "-1/2", "1", "a/b", "1/0"):
        with pytest.raises(ConfigurationError, match="--shard must be I/N"):
            take_shard(prompts, bad)


def test_the_noise_floor_is_the_controls_distance_from_one_at_every_b_or_says_how_to_measure_it():
    from specframe.bench.report import control_line, control_of

    runners = [SimpleNamespace(label="baseline", control=False), SimpleNamespace(label="pld", control=False),
               SimpleNamespace(label="none@1", control=True), SimpleNamespace(label="hf-generate")]
    assert control_of(runners) == "none@1" and control_of(runners[:2]) is None
    line = control_line("none@1", {"coding": 0.97, "writing": 1.02}, "categories")
    assert "`none@1` decodes exactly like its baseline and measured 0.97-1.02x across categories" in line
    assert "within ±3.0 % of 1.00x as noise" in line
    one = control_line("none@1", {2: 1.04}, "batch sizes")
    assert "measured 1.04x: read differences within ±4.0 %" in one
    assert "not measured: no control ran" in control_line(None, {}, "categories")


def test_plain_decoding_as_a_method_is_the_control_and_the_baseline_and_synthetic_runs_are_not():
    from specframe.bench.runner import build_runners
    from specframe.terms.sampling import SamplingParams

    registry = specframe.get_registry()
    specs = resolve_methods(["none@1", "pld@2"], registry, "auto")
    runners = build_runners(tiny_target(seed=0), specs, [], SamplingParams(), registry,
                            synthetic_acceptance=0.5)
    assert {r.label: r.control for r in runners} == {"baseline": False, "none@1": True, "pld@2": False,
                                                     "synthetic(p=0.5)": False}
