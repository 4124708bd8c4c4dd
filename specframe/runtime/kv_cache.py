"""A KV cache that appends in place: transformers' `DynamicCache` without a copy of the cache per step.

transformers' `DynamicLayer` appends a step's keys and values with `torch.cat`, which copies the layer's
whole cache into a freshly allocated tensor at every forward. A speculative decoder pays that at every
step: it scores a tree, crops the rejected rows and appends again. For SmolLM2 on the development CPU
(two threads) the copies cost 0-2 % of a step at 256 cached tokens, 1-4 % at 1,024, 3-5 % at 2,048 and
up to 10 % at 4,096, and how much varies with the state of the allocator
(docs/explanation/metrics-and-costs.md has the measurements and how to reproduce them).

`BufferedLayer` keeps each layer's keys and values in buffers with room to spare and exposes the filled
part as views (`keys = buffer[..., :length, :]`), so appending is one copy of the new rows. A crop only
shortens the views, and writes into the views (the `kv` backend's commit of an accepted branch) land in
the buffers. When the rows do not fit, the buffers grow by half (at least `MIN_ROOM` rows), so appends
cost amortised O(1) per row, for at most 1.5 times the cache's memory plus `MIN_ROOM` rows per layer.

Anything that replaces `keys` or `values` with a tensor of its own (transformers' beam reordering,
batch selection, offloading) is noticed at the next append, which copies that tensor into a new buffer:
the layer never writes into storage it no longer owns. The numbers are those of `DynamicLayer`: the same
rows reach attention in the same order, only their storage differs.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 256  # rows of spare room a buffer gets when it grows
GROWTH = 1.5  # a grown buffer holds this many times the rows it must


class BufferedLayer(DynamicLayer):
    """A `DynamicLayer` whose `keys` and `values` are views into preallocated buffers (see the module)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if not self._owns_views(key_states, start) or self.key_buffer.shape[-2] < end:
            self._move_to_new_buffers(start, end, key_states, value_states)
        self.key_buffer[..., start:end, :].copy_(key_states)
        self.value_buffer[..., start:end, :].copy_(value_states)
        self.keys = self.key_buffer[..., :end, :]
        self.values = self.value_buffer[..., :end, :]
        return self.keys, self.values

    @property
    def capacity(self) -> int:
        """Rows the buffers hold before they must grow (0 before the first append)."""
        return 0 if self.key_buffer is None else self.key_buffer.shape[-2]

    def _owns_views(self, key_states: torch.Tensor, length: int) -> bool:
        """Whether `keys`/`values` still view the start of this layer's buffers and the new rows fit their
        layout (`length`: rows now cached): false before the first append and after anything replaced
        them with tensors of its own."""
        buffer = self.key_buffer
        if buffer is None or (buffer.shape[:-2], buffer.dtype, buffer.device) != (
                key_states.shape[:-2], key_states.dtype, key_states.device):
            return False
        if length == 0:
            return True  # nothing to keep
        return all(view.data_ptr() == store.data_ptr() and view.stride() == store.stride()
                   for view, store in ((self.keys, buffer), (self.values, self.value_buffer)))

    def _move_to_new_buffers(self, start: int, end: int, key_states: torch.Tensor,
                             value_states: torch.Tensor) -> None:
        """Fresh buffers with room for `end` rows and more, holding the first `start` rows of the cache."""
        rows = max(int(end * GROWTH), end + MIN_ROOM)
        key_buffer = key_states.new_empty((*key_states.shape[:-2], rows, key_states.shape[-1]))
        value_buffer = value_states.new_empty((*value_states.shape[:-2], rows, value_states.shape[-1]))
        if start:
            key_buffer[..., :start, :].copy_(self.keys)
            value_buffer[..., :start, :].copy_(self.values)
        self.key_buffer, self.value_buffer = key_buffer, value_buffer

    def reset(self) -> None:
        super().reset()
        self.key_buffer = self.value_buffer = None


def buffered_cache(config) -> DynamicCache:
    """A `DynamicCache` for `config` whose plain attention layers append in place (`BufferedLayer`);
    sliding-window, recurrent and other special layers stay as transformers builds them."""
    cache = DynamicCache(config=config)
    cache.layers = [BufferedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
