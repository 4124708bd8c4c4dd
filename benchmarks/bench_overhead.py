"""Framework overhead per step: everything but the target forward, on the real model's cache shapes.

The target forward is replaced by a stand-in that appends the tree's K/V rows to the real `DynamicCache`
(SmolLM2 shapes: 30 layers, 3 KV heads x 64) and returns preallocated logits (V = 49152) whose argmax
accepts about half of each drafted chain. Drafting (prompt lookup over a ~300-token context), tree
building, verification, commit (gather + crop) and the loop's bookkeeping all run for real.

    pytest benchmarks/bench_overhead.py --benchmark-only
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specframe
from specframe import TargetScores
from specframe_kv import KVCacheBackend

CONTEXT = 300
STEPS = 20


class ForwardFreeBackend(KVCacheBackend):
    """`kv` with the model call replaced: same cache bookkeeping, no matrix multiplies."""

    name = "kv-forward-free"

    def __init__(self, target, **kwargs):
        super().__init__(target, **kwargs)
        config = target.config
        self.kv_shape = (1, config.num_key_value_heads, 0, config.hidden_size // config.num_attention_heads)
        self.logits = torch.zeros(128, target.vocab_size)

    def prefill(self, ids):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self._append(len(ids) - 1)
        self._committed, self._pending = len(ids) - 1, int(ids[-1])

    def _append(self, rows: int) -> None:
        shape = (*self.kv_shape[:2], rows, self.kv_shape[3])
        for layer_idx in range(self.model.config.num_hidden_layers):
            self.cache.update(torch.randn(shape), torch.randn(shape), layer_idx)

    def score(self, tree):
        self._crop(self._committed)
        self._append(len(tree) + 1)
        logits = self.logits[: len(tree) + 1]
        logits.zero_()
        accept = len(tree) // 2  # the target agrees with the first half of the first path
        path = tree.paths[0] if len(tree) else []
        for row, node in enumerate(path[:accept]):
            logits[0 if row == 0 else path[row - 1] + 1, tree.tokens[node]] = 1.0
        return self.issue(TargetScores(logits=logits, tree=tree))  # kv's commit keeps the appended rows


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
