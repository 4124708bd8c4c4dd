"""`specframe.runtime.kv_cache`: a cache that appends in place holds exactly what transformers'
`DynamicLayer` holds, through appends, crops, in-place commits and tensors swapped in from outside, and
decodes identically; `kv`'s rows grow past their first room and still score as a plain forward."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicLayer

from specframe import TokenTree
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


def test_a_buffered_cache_decodes_as_transformers_own_cache():
    """Forwards appending to each cache, past the buffered cache's first room: the same logits bit for bit
    (what `kv` reads a prompt with)."""
    from transformers import DynamicCache

    model = tiny_llama(seed=5).model
    buffered, dynamic = buffered_cache(model.config), DynamicCache(config=model.config)
    ids = torch.arange(20, 60).repeat(3)[None]
    first_room = None
    with torch.inference_mode():
        for start in range(0, ids.shape[1], 6):
            a, b = (model(input_ids=ids[:, start:start + 6], past_key_values=cache, use_cache=True).logits
                    for cache in (buffered, dynamic))
            assert torch.equal(a, b)
            first_room = first_room or buffered.layers[0].capacity
    assert buffered.get_seq_length() == dynamic.get_seq_length() == ids.shape[1]
    assert type(buffered.layers[0]) is BufferedLayer and type(dynamic.layers[0]) is DynamicLayer


def test_kv_grows_its_rows_past_their_first_room_and_scores_as_a_plain_forward():
    target = tiny_llama(seed=5)
    backend, tree = KVCacheBackend(target), TokenTree(np.arange(6) + 9, np.array([-1, -1, 0, 0, 1, 4]))
    tokens = list(range(20, 60)) * 3
    backend.prefill(tokens)
    for step in range(80):  # the rows' buffers grow on the way
        scored = backend.score(tree)
        path = [1, 4, 5] if step % 2 else [0, 2]
        backend.commit(scored, path, bonus=step + 3)
        tokens += [int(tree.tokens[i]) for i in path] + [step + 3]
    assert backend.committed_length == len(tokens) - 1
    last = backend.score(TokenTree(np.zeros(0, np.int64), np.zeros(0, np.int64))).logits[0]
    with torch.inference_mode():
        plain = target.model(input_ids=torch.tensor([tokens])).logits[0, -1]
    torch.testing.assert_close(last, plain.float(), rtol=1e-4, atol=1e-4)
