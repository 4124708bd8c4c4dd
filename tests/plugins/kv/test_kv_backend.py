"""The `kv` backend's padding of small trees and plain steps (CPU): the same logits and the same state as
without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specframe import ConfigurationError, TokenTree
from specframe_kv import KVCacheBackend

from conftest import tiny_llama

TREES = {  # parents of a plain step (no nodes), trees of 1 and 2 nodes, chains and not, plus a bigger one
    "plain": [], "one": [-1], "chain": [-1, 0], "siblings": [-1, -1], "wide": [-1, -1, 0, 1, 1],
}


@pytest.mark.parametrize("name", TREES)
def test_padding_changes_neither_logits_nor_the_committed_state(name):
    target = tiny_llama(seed=3)
    parents = np.array(TREES[name], np.int64)
    tree = TokenTree(np.arange(len(parents), dtype=np.int64) + 7, parents)
    prompt = list(range(20, 40))
    plain, padded = KVCacheBackend(target, min_rows=1), KVCacheBackend(target, min_rows=8)
    for backend in (plain, padded):
        backend.prefill(prompt)
    for step in range(3):  # score, commit the last node's path, and score again from the new state
        a, b = plain.score(tree), padded.score(tree)
        assert a.logits.shape == b.logits.shape == (len(tree) + 1, 96)
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
        path = [int(i) for i in np.flatnonzero(tree.ancestor_mask[-1][1:])]  # root to the last node
        plain.commit(a, path, bonus=step + 1)
        padded.commit(b, path, bonus=step + 1)
        assert plain.committed_length == padded.committed_length  # and the next step's logits agree


def test_forwards_are_padded_only_where_measured_or_asked():
    """Uncalibrated, a plain step is one row, as transformers' `generate` computes it."""
    target = tiny_llama(seed=3)
    assert KVCacheBackend(target).min_rows == 1 and KVCacheBackend(target, min_rows=4).min_rows == 4


@pytest.mark.parametrize("rows", [0, -2, 2.5, True, "4"])
def test_min_rows_that_is_not_a_positive_integer_is_refused(rows):
    with pytest.raises(ConfigurationError, match="backend 'kv': min_rows must be an integer >= 1"):
        KVCacheBackend(tiny_llama(seed=3), min_rows=rows)


def test_with_a_fixed_budget_builders_get_the_stored_calibration(tmp_path, monkeypatch):
    """`kv` offers no cost model of its own (`StateBackend.cost_model` returns None): the decoder passes
    its builders the calibration stored for the backend instead, as `specframe calibrate` left it, which
    the backend was handed when it was built."""
    from specframe import SpeculativeDecoder, assemble
    from specframe.plugging import calibration
    from specframe.terms.cost import MeasuredCost

    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))
    target = tiny_llama(seed=3)
    stored = MeasuredCost((0, 4), (1.0, 1.2), (1.0, 1.1))
    key = calibration.cost_key(assemble(target).backend)
    calibration.write_cost(calibration.cost_path(key), key, stored)
    decoder = SpeculativeDecoder.from_names(target, "pld", budget=4)
    assert decoder.pipeline.backend.cost_model() is None
    assert decoder.step_planner().cost == stored == decoder.pipeline.backend.calibration.cost
