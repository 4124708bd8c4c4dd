"""`specframe_sdpa`: grouped-query attention without copying the cache gives transformers' `sdpa` results;
the choice of CPU attention by dtype and environment variable."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specframe import TokenTree
from specframe.runtime.attention import (EXACT, NAME, attention_for, chosen_attention, use_attention,
                                         use_cpu_attention)
from specframe.terms.errors import ConfigurationError
from specframe_kv import KVCacheBackend

from conftest import tiny_llama

TREES = {"chain": [-1, 0, 1], "flat": [-1, -1, -1], "branching": [-1, 0, 0, 1, -1, 4]}


@pytest.mark.parametrize("name", TREES)
def test_tree_logits_and_state_match_transformers_sdpa(name):
    parents = np.array(TREES[name])
    tree = TokenTree(np.arange(len(parents)) + 5, parents)
    reference, grouped = tiny_llama(seed=4, kv_heads=2), tiny_llama(seed=4, kv_heads=2)
    assert use_attention(grouped.model, NAME) and grouped.model.config._attn_implementation == NAME
    backends = [KVCacheBackend(t, min_rows=1) for t in (reference, grouped)]
    for backend in backends:
        backend.prefill(list(range(10, 40)))
    for step in range(3):  # score, commit a branch, score again from the new state
        a, b = (backend.score(tree) for backend in backends)
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-6, atol=1e-6)
        path = [int(i) for i in np.flatnonzero(tree.ancestor_mask[-1][1:])]
        for backend, scored in zip(backends, (a, b)):
            backend.commit(scored, path, bonus=step + 3)


def test_calls_it_cannot_serve_go_to_transformers():
    """Without grouped heads (or a mask) the call is transformers' own: same numbers, nothing switched off."""
    target = tiny_llama(seed=5, kv_heads=4)
    ids = torch.arange(3, 20)[None]
    before = target.model(ids).logits
    assert use_attention(target.model, NAME)
    torch.testing.assert_close(target.model(ids).logits, before)


def test_the_environment_variable_turns_it_off_and_is_checked(monkeypatch):
    target = tiny_llama(seed=6)
    monkeypatch.setenv("SPECFRAME_CPU_ATTENTION", "sdpa")
    assert use_cpu_attention(target.model) == "sdpa"
    monkeypatch.setenv("SPECFRAME_CPU_ATTENTION", "flash")
    with pytest.raises(ConfigurationError, match="SPECFRAME_CPU_ATTENTION='flash' is not a CPU attention"):
        chosen_attention()


def test_smollm2_loads_with_the_attention_its_linears_call_for(smollm2):
    """Exact rows where its linears multiply the GGUF's blocks (rows exact end to end), grouped sdpa where
    they run through oneDNN (a CPU without AVX-512)."""
    from specframe.runtime.packed_linear import linear_kernel

    expected = EXACT if linear_kernel(smollm2.model) == "blocks" else NAME
    assert smollm2.model.config._attn_implementation == expected


def test_auto_chooses_by_dtype_and_the_variable_overrides(monkeypatch):
    monkeypatch.delenv("SPECFRAME_CPU_ATTENTION", raising=False)
    assert attention_for(torch.float32) == NAME
    assert attention_for(torch.bfloat16) == attention_for(torch.float16) == EXACT
    monkeypatch.setenv("SPECFRAME_CPU_ATTENTION", "specframe_exact")
    assert attention_for(torch.float32) == EXACT
    target = tiny_llama(seed=7)
    assert use_cpu_attention(target.model) == EXACT
    monkeypatch.setenv("SPECFRAME_CPU_ATTENTION", "specframe_sdpa")
    assert use_cpu_attention(target.model) == NAME  # switches between ours, too
