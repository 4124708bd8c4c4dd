"""Framework overhead per step: everything but the target forward, on the real model's cache shapes.

The target forward is replaced by a stand-in that writes the tree's K/V rows to `kv`'s real cache
(SmolLM2 shapes: 30 layers, 3 KV heads x 64) and returns logits (V = 49152) whose argmax accepts about
half of each drafted chain. Drafting (prompt lookup over a ~300-token context), tree
building, verification, commit (gather + crop) and the loop's bookkeeping all run for real.

    pytest benchmarks/bench_overhead.py --benchmark-only
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specframe
from specframe.kit.backend import buffered_cache
from specframe_kv import KVCacheBackend
from specframe_kv.rows import KVRows

CONTEXT = 300
STEPS = 20


class ForwardFreeRows(KVRows):
    """`kv`'s rows with the model call replaced: the same cache bookkeeping, no matrix multiplies. Each
    forward writes random keys and values for its rows to every layer and returns zero logits, which
    `score` then makes agree with the first half of each tree's first path."""

    def __init__(self, backend):
        super().__init__(backend)
        config = self.model.config
        self.heads, self.dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
        self.layers, self.vocab = config.num_hidden_layers, backend.target.vocab_size

    def _read(self, ids):
        cache = buffered_cache(self.model.config)
        for layer in range(self.layers):
            cache.update(*(torch.randn(1, self.heads, len(ids) - 1, self.dim) for _ in "kv"), layer)
        return cache

    def _forward(self, rows, ids, positions, mask, start, end):
        states = [self.rows[row] for row in rows]
        self.cache.select([state.slot for state in states], [state.length + start for state in states],
                          end - start, self.device)
        shape = (len(rows), self.heads, end - start, self.dim)
        for layer in range(self.layers):
            self.cache.update(torch.randn(shape), torch.randn(shape), layer)
        return torch.zeros(len(rows), end - start, self.vocab), None

    @torch.inference_mode()
    def score(self, trees):
        scores = super().score(trees)
        for row, tree in trees.items():
            logits, accept = scores[row].logits, len(tree) // 2  # agree with half of the first path
            path = tree.paths[0] if len(tree) else []
            for depth, node in enumerate(path[:accept]):
                logits[0 if depth == 0 else path[depth - 1] + 1, tree.tokens[node]] = 1.0
        return scores


class ForwardFreeBackend(KVCacheBackend):
    """`kv` whose rows are `ForwardFreeRows`."""

    name = "kv-forward-free"

    def batch(self):
        return ForwardFreeRows(self)


@pytest.fixture(scope="module")
def target():
    return specframe.load_target("smollm2-135m")


@pytest.mark.parametrize("tree_size", [4, 16, 32])
def test_step_overhead(benchmark, target, tree_size):
    rng = np.random.default_rng(0)
    prompt = np.tile(rng.integers(100, 40000, 50), CONTEXT // 50).tolist()  # repetitive: pld always drafts
    registry = specframe.get_registry()
    pipeline = specframe.Pipeline(
        drafter=registry.get("drafter", "pld")(target, num_tokens=tree_size),
        tree_builder=registry.get("tree builder", "chain")(),
        verifier=registry.get("verifier", "greedy")(),
        backend=ForwardFreeBackend(target),
    )
    decoder = specframe.SpeculativeDecoder(target, pipeline, budget=tree_size)
    max_new = STEPS * (tree_size // 2 + 1)
    result = benchmark(decoder.generate, prompt, max_new_tokens=max_new)
    steps = result.metrics.steps
    per_step = {k: round(v, 4) for k, v in result.metrics.time_per_step_ms.items() if k != "forward"}
    benchmark.extra_info.update(steps=steps, tree_size=tree_size, per_step_ms_without_forward=per_step,
                                forward_stub_ms=round(result.metrics.time_per_step_ms["forward"], 4))
    print(f"\ntree {tree_size}: {steps} steps, overhead per step (ms) {per_step}, "
          f"total {sum(per_step.values()):.3f} ms")
