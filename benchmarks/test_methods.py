"""pytest-benchmark comparison of decoding methods on a fixed small prompt set (the first HumanEval prompts).

Each benchmark decodes every prompt once per round, greedy, on the real model; its `extra_info` holds the
tokens, tau and tokens/s. The outputs of every method are checked identical to plain decoding.

    pytest benchmarks/test_methods.py --benchmark-autosave            # save a run
    pytest benchmarks/test_methods.py --benchmark-compare             # compare with the last saved run
    pytest benchmarks/test_methods.py -k "pld or baseline"            # a subset

Settings: SPECFRAME_BENCH_MODEL (default smollm2-135m), SPECFRAME_BENCH_TOKENS (new tokens per prompt,
default 48), SPECFRAME_BENCH_PROMPTS (default 3), SPECFRAME_BENCH_THREADS (torch threads, default unchanged).
Methods whose plugin is not installed, or that cannot be built for the model, are skipped.
"""

from __future__ import annotations

import os

import pytest
import torch

import specframe
from specframe.bench.methods import baseline_spec, parse_method
from specframe.bench.peers import PeerRunner, parse_peers
from specframe.bench.runner import PipelineRunner
from specframe.support.prompt_suites import encode_turn, load_suite
from specframe.terms.errors import SpecframeError
from specframe.plugging.specs import ComponentSpec

MODEL = os.environ.get("SPECFRAME_BENCH_MODEL", "smollm2-135m")
NEW_TOKENS = int(os.environ.get("SPECFRAME_BENCH_TOKENS", "48"))
PROMPTS = int(os.environ.get("SPECFRAME_BENCH_PROMPTS", "3"))
METHODS = ["baseline", "pld", "pld-trie", "rest-live", "rest", "draft-model", "s4c",
           "hf-generate", "hf-pld", "hf-assisted"]


@pytest.fixture(scope="module")
def target():
    if os.environ.get("SPECFRAME_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["SPECFRAME_BENCH_THREADS"]))
    return specframe.load_target(MODEL)


@pytest.fixture(scope="module")
def prompts(target):
    return [encode_turn(target.tokenizer, p, 0, []) for p in load_suite("humaneval", limit=PROMPTS)]


@pytest.fixture(scope="module")
def reference(target, prompts):
    """Plain decoding's outputs: what every lossless method must reproduce."""
    runner = PipelineRunner(target, baseline_spec(ComponentSpec("kv", {})), specframe.SamplingParams(),
                            specframe.get_registry(), None)
    return [runner.generate(ids, NEW_TOKENS)[0] for ids in prompts]


def make_runner(target, method: str):
    registry, sampling = specframe.get_registry(), specframe.SamplingParams()
    try:
        if method == "baseline":
            return PipelineRunner(target, baseline_spec(ComponentSpec("kv", {}), greedy=sampling.greedy),
                                  sampling, registry, None)
        if method.startswith("hf-"):
            return PeerRunner(target, parse_peers(method)[0], sampling)
        return PipelineRunner(target, parse_method(method, registry), sampling, registry, "baseline")
    except SpecframeError as err:
        pytest.skip(f"{method}: {err}")


@pytest.mark.parametrize("method", METHODS)
def test_method(benchmark, target, prompts, reference, method):
    runner = make_runner(target, method)
    outputs: list[list[int]] = []
    stats = {"tokens": 0, "steps": 0, "wall_s": 0.0}

    def decode_all():
        outputs.clear()
        for ids in prompts:
            tokens, metrics = runner.generate(ids, NEW_TOKENS)
            outputs.append(tokens)
            stats["tokens"] += metrics["new_tokens"]
            stats["steps"] += metrics["steps"]
            stats["wall_s"] += metrics["wall_s"]

    benchmark.pedantic(decode_all, rounds=3, warmup_rounds=1, iterations=1)
    benchmark.extra_info.update(method=method, new_tokens_per_round=sum(len(o) for o in outputs),
                                tau=stats["tokens"] / stats["steps"],
                                tokens_per_s=stats["tokens"] / stats["wall_s"])
    assert outputs == reference, f"{method} is not lossless: its greedy output differs from plain decoding"
