"""The llama.cpp peers of `specframe bench` (`specframe_llamacpp.peers`), on a tiny random Llama
written as a GGUF (`tiny_gguf`): llama.cpp's own greedy decoding, with and without its prompt lookup,
emits what plain decoding through the `llamacpp` backend emits here, where the prompt fits one
micro-batch of both; steps and tau are counted; refusals say what to do. Skipped without llama-cpp-python."""

from __future__ import annotations

import pytest
from llamacpp_tests import gguf_target, require_llama_cpp  # noqa: F401 (the target fixture)

from specframe import ConfigurationError, SamplingParams, SpeculativeDecoder
from specframe.bench.peers import parse_peers, peer_runner
from specframe.testing.targets import repetitive_prompt, tiny_target

require_llama_cpp()

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def test_all_means_the_transformers_peers_and_llamacpp_ones_are_named():
    assert [p.name for p in parse_peers("all")] == ["hf-generate", "hf-pld", "hf-assisted"]
    named = parse_peers("llamacpp-generate,llamacpp-pld(num_tokens=4)")
    assert [(p.name, p.options) for p in named] == [("llamacpp-generate", {"context": 4096}),
                                                    ("llamacpp-pld", {"num_tokens": 4, "context": 4096})]
    with pytest.raises(ConfigurationError, match="takes options"):
        parse_peers("llamacpp-generate(num_tokens=4)")


@pytest.mark.parametrize("peer", ["llamacpp-generate", "llamacpp-pld(num_tokens=4)"])
def test_llama_cpp_greedy_decoding_emits_plain_decoding_through_the_backend(target, peer):
    runner = peer_runner(target, parse_peers(peer)[0], SamplingParams(), baseline="baseline")
    assert not runner.lossless  # in general llama.cpp's own batches round differently: not compared
    plain = SpeculativeDecoder.from_names(target, "none", "chain", "greedy", "llamacpp", budget=1)
    for seed in range(2):
        prompt = repetitive_prompt(target.vocab_size, 40, seed=seed)
        for _ in range(2):  # a second request reads its prompt afresh
            tokens, record = runner.generate(prompt, max_new_tokens=24)
            assert tokens == plain.generate(prompt, max_new_tokens=24).tokens
            assert record["new_tokens"] == 24 and record["tau"] == pytest.approx(24 / record["steps"])
            assert record["steps"] == 24 if peer == "llamacpp-generate" else 1 <= record["steps"] <= 24


def test_refusals_say_what_to_do(target):
    spec = parse_peers("llamacpp-generate")[0]
    with pytest.raises(ConfigurationError, match="greedily only"):
        peer_runner(target, spec, SamplingParams(temperature=1.0), baseline="baseline")
    with pytest.raises(ConfigurationError, match="--model path/to/model.gguf"):
        peer_runner(tiny_target(), spec, SamplingParams(), baseline="baseline")


def test_llama_cpp_peers_are_measured_against_plain_decoding_through_the_backend(target):
    from specframe.bench.methods import parse_method
    from specframe.bench.runner import build_runners
    from specframe.plugging.registry import get_registry

    registry = get_registry()
    peers = parse_peers("hf-generate,llamacpp-generate")
    with_backend = build_runners(target, [parse_method("pld+chain+greedy+llamacpp@4", registry)], peers,
                                 SamplingParams(), registry)
    assert {r.label: r.baseline for r in with_backend[-2:]} == {"hf-generate": "baseline",
                                                                "llamacpp-generate": "baseline[llamacpp]"}
    without = build_runners(target, [], peers[1:], SamplingParams(), registry)
    assert without[-1].baseline == "baseline"


def test_a_request_longer_than_the_peers_context_is_refused_naming_the_option(target):
    peer = parse_peers("llamacpp-generate(context=64)")[0]
    runner = peer_runner(target, peer, SamplingParams(), "baseline")
    with pytest.raises(ConfigurationError, match=r"llamacpp-generate\(context=N\)"):
        runner.generate(list(range(1, 90)) * 3, max_new_tokens=16)  # llama.cpp rounds 64 up to 256


def test_prompt_lookup_keeps_logits_for_every_position_of_its_context(target, monkeypatch):
    """llama-cpp-python reads a prompt in batches (512 tokens) and its prompt lookup writes every
    position's logits into a buffer it sizes by `logits_all` as passed: without it the buffer holds one
    batch, and a Spec-Bench prompt longer than that failed inside llama-cpp-python. Batches of 128 here
    make a 300-token prompt longer than one, within the tiny model's 512 positions."""
    import functools

    import llama_cpp

    monkeypatch.setattr(llama_cpp, "Llama", functools.partial(llama_cpp.Llama, n_batch=128))
    peer = parse_peers("llamacpp-pld(num_tokens=4)")[0]
    runner = peer_runner(target, peer, SamplingParams(), "baseline")
    assert runner.llm.scores.shape[0] == runner.llm.n_ctx()
    tokens, _ = runner.generate(repetitive_prompt(target.vocab_size, 300), max_new_tokens=8)
    assert len(tokens) == 8
