"""pytest-benchmark: one `score` call of the packed tree scan (`ssm-tree`) vs the unrolled baseline
(`ssm-unrolled`) on small random Mamba2 and Mamba2 + attention models, full binary trees of depth 3-5.

    pytest benchmarks/bench_ssm_tree.py --benchmark-group-by=param:kind,param:depth
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM, NemotronHConfig, NemotronHForCausalLM

import specframe
from specframe_ssm import full_binary_tree


def small_model(kind: str):
    torch.manual_seed(0)
    dims = dict(vocab_size=1024, hidden_size=256, conv_kernel=4, chunk_size=8, expand=2)
    if kind == "ssm":
        model = Mamba2ForCausalLM(Mamba2Config(**dims, num_hidden_layers=4, num_heads=8, head_dim=64,
                                               state_size=32, n_groups=1))
    else:
        types = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
        config = NemotronHConfig(**dims, layers_block_type=types, mamba_num_heads=8, mamba_head_dim=64,
                                 n_groups=1, ssm_state_size=32, num_attention_heads=4, num_key_value_heads=4,
                                 head_dim=64)
        model = NemotronHForCausalLM(config)
    return specframe.Target(model=model.eval(), tokenizer=None, name=f"small-{kind}")


@pytest.fixture(scope="module", params=["ssm", "hybrid"])
def target(request):
    return small_model(request.param)


@pytest.mark.parametrize("backend", ["ssm-tree", "ssm-unrolled"])
@pytest.mark.parametrize("depth", [3, 4, 5])
def test_score_full_binary_tree(benchmark, target, backend, depth):
    scorer = specframe.get_registry().get("backend", backend)(target)
    rng = np.random.default_rng(0)
    scorer.prefill(rng.integers(0, 1024, 64).tolist())
    parents = full_binary_tree(depth)
    tree = specframe.TokenTree(rng.integers(0, 1024, len(parents)), np.array(parents))
    benchmark.extra_info["nodes"] = len(tree) + 1
    scores = benchmark(scorer.score, tree)
    assert scores.logits.shape == (len(tree) + 1, 1024)
