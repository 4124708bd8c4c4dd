"""`specframe.runtime.kv_cache`: a cache that appends in place holds exactly what transformers'
`DynamicLayer` holds,
through appends, crops, in-place commits and tensors swapped in from outside, and decodes identically."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicLayer

from specframe import TokenTree
from specframe.terms.errors import ConfigurationError
from specframe.runtime.kv_cache import MIN_ROOM, BufferedLayer, buffered_cache
from specframe_kv import KVCacheBackend

from conftest import tiny_llama

HEADS, DIM = 2, 3

append = st.tuples(st.just("append"), st.integers(1, 40))
crop = st.tuples(st.just("crop"), st.integers(1, 30))
commit = st.tuples(st.just("commit"), st.integers(0, 5))  # gather rows, as the kv backend's commit does
swap = st.tuples(st.just("swap"), st.just(0))  # replace keys/values from outside (beam reordering does)


def _apply(layer, op: str, n: int, rng: torch.Generator) -> None:
    length = layer.get_seq_length()
    if op == "append":
        rows = torch.randn(1, HEADS, n, DIM, generator=rng)
        layer.update(rows, rows * 2 + 1)
    elif op == "crop" and length:
        layer.crop(-min(n, length))
    elif op == "commit" and length > n + 1:
        index = torch.arange(length - 1, length - 2 - n, -1)  # the last n + 1 rows, reversed
        layer.keys[:, :, length - n - 1:] = layer.keys.index_select(-2, index)
        layer.values[:, :, length - n - 1:] = layer.values.index_select(-2, index)
    elif op == "swap" and length:
        layer.keys, layer.values = layer.keys.flip(-2).contiguous(), layer.values.flip(-2).contiguous()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(append, crop, commit, swap), min_size=1, max_size=30))
def test_the_buffered_layer_holds_what_dynamic_layer_holds(ops):
    layers = DynamicLayer(), BufferedLayer()
    for layer in layers:
        rng = torch.Generator().manual_seed(0)  # both layers see the same rows
        for op, n in ops:
            _apply(layer, op, n, rng)
    reference, buffered = layers
    assert buffered.get_seq_length() == reference.get_seq_length()
    if reference.get_seq_length():
        assert torch.equal(buffered.keys, reference.keys) and torch.equal(buffered.values, reference.values)


def test_appends_write_in_place_and_buffers_grow_by_half():
    layer = BufferedLayer()
    rows = torch.ones(1, HEADS, 10, DIM)
    layer.update(rows, rows)
    assert layer.capacity == 10 + MIN_ROOM
    storage = layer.keys.data_ptr()
    for _ in range(MIN_ROOM // 10):
        layer.update(rows, rows)
    assert layer.keys.data_ptr() == storage and layer.capacity == 10 + MIN_ROOM  # no copy while it fits
    layer.update(torch.ones(1, HEADS, 1000, DIM), torch.ones(1, HEADS, 1000, DIM))
    length = layer.get_seq_length()
    assert length == 10 + 10 * (MIN_ROOM // 10) + 1000 and layer.capacity == int(length * 1.5)


def test_a_swapped_in_tensor_is_copied_not_written_through():
    layer = BufferedLayer()
    layer.update(torch.zeros(1, HEADS, 4, DIM), torch.zeros(1, HEADS, 4, DIM))
    outside = layer.keys + 5  # what beam reordering or offloading would put there: other storage
    layer.keys, layer.values = outside, outside.clone()
    layer.update(torch.ones(1, HEADS, 2, DIM), torch.ones(1, HEADS, 2, DIM))
    assert outside.shape[-2] == 4 and layer.get_seq_length() == 6
    assert torch.equal(layer.keys[..., :4, :], outside)
    assert torch.equal(layer.values[..., 4:, :], torch.ones(1, HEADS, 2, DIM))
    assert layer.keys.data_ptr() == layer.key_buffer.data_ptr()


def test_only_plain_attention_layers_are_buffered():
    cache = buffered_cache(tiny_llama(seed=1).config)
    assert cache.layers and all(type(layer) is BufferedLayer for layer in cache.layers)


def test_both_caches_score_and_commit_identically():
    target = tiny_llama(seed=5)
    buffered, concat = KVCacheBackend(target), KVCacheBackend(target, cache="concat")
    tree = TokenTree(np.arange(6) + 9, np.array([-1, -1, 0, 0, 1, 4]))
    prompt = list(range(20, 60)) * 3
    for backend in (buffered, concat):
        backend.prefill(prompt)
    first_room = buffered.cache.layers[0].capacity
    for step in range(80):  # past the first buffer's room: the buffers grow on the way
        a, b = buffered.score(tree), concat.score(tree)
        assert torch.equal(a.logits, b.logits)
        path = [1, 4, 5] if step % 2 else [0, 2]
        buffered.commit(a, path, bonus=step + 3)
        concat.commit(b, path, bonus=step + 3)
    assert buffered.committed_length == concat.committed_length > first_room
    assert buffered.cache.layers[0].capacity > first_room
    assert type(buffered.cache.layers[0]) is BufferedLayer and type(concat.cache.layers[0]) is DynamicLayer


def test_an_unknown_cache_kind_is_refused():
    with pytest.raises(ConfigurationError, match="cache must be one of buffer, concat"):
        KVCacheBackend(tiny_llama(seed=1), cache="paged")
