"""A KV cache that appends in place: transformers' `DynamicCache` without a copy of the cache per step.

transformers' `DynamicLayer` appends a step's keys and values with `torch.cat`, which copies the layer's
whole cache into a freshly allocated tensor at every forward. A speculative decoder pays that at every
step: it scores a tree, crops the rejected rows and appends again. For SmolLM2 on a CPU the copies cost
little on a short cache and more as the cache grows, by an amount that varies with the state of the
allocator (docs/explanation/metrics-and-costs.md).

`BufferedLayer` keeps each layer's keys and values in buffers with room to spare and exposes the filled
part as views (`keys = buffer[..., :length, :]`), so appending is one copy of the new rows. A crop only
shortens the views, and writes into the views (the `kv` backend's commit of an accepted branch) land in
the buffers. When the rows do not fit, the buffers grow by half (at least `MIN_ROOM` rows), so appends
cost amortised O(1) per row, for at most 1.5 times the cache's memory plus `MIN_ROOM` rows per layer.

Anything that replaces `keys` or `values` with a tensor of its own (transformers' beam reordering,
batch selection, offloading) is noticed at the next append, which copies that tensor into a new buffer:
the layer never writes into storage it no longer owns. The numbers are those of `DynamicLayer`: the same
rows reach attention in the same order, only their storage differs.

`RaggedCache` holds several sequences of different lengths for forwards that score them together (the
`kv` backend's batch): one buffer per layer of (slots, kv_heads, columns, head_dim), each sequence in a
slot, every forward writing each selected slot's new rows at that slot's own length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

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


# --- several sequences of different lengths (`RaggedCache`) ------------------------------------------


@dataclass
class Selection:
    """The sequences (slots) one forward computes and where their new rows go, set by
    `RaggedCache.select` and read by every layer's `update`."""

    write: tuple[torch.Tensor, torch.Tensor] | None = None  # (R, T) slot and cache column of each new row
    read: slice | torch.Tensor | None = None  # the slots attention reads, in the forward's batch order
    end: int = 0  # cache columns attention reads: the longest selected sequence after its new rows
    slots: int = 0  # slots the buffers must hold


class RaggedLayer(DynamicLayer):
    """One attention layer's keys and values for several sequences of different lengths: buffers of
    (slots, kv_heads, columns, head_dim) where slot b holds its sequence's rows in columns [0, len_b).
    Keys and values each have their own head_dim (multi-head latent attention's differ).

    `update` writes a forward's T new rows of each selected slot at that slot's own start column (one
    indexed write per buffer, whatever the number of slots) and returns the selected slots' columns
    [0, end): views of the buffers when the slots are consecutive, else a copy of those slots. Columns
    past a slot's own rows hold zeros or stale rows, finite either way, which the caller's mask hides.
    Buffers grow as `BufferedLayer`'s do (by half, at least `MIN_ROOM` columns), and start zeroed so
    that no uninitialised memory (a NaN would survive any mask) reaches attention.
    """

    def __init__(self, selection: Selection):
        super().__init__()
        self.selection = selection  # shared by every layer of the cache
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        selected = self.selection
        self.reserve(selected.slots, selected.end, key_states, value_states)
        slots, columns = selected.write  # (R, T) each
        self.key_buffer[slots, :, columns] = key_states.transpose(1, 2)  # (R, T, kv_heads, head_dim)
        self.value_buffer[slots, :, columns] = value_states.transpose(1, 2)
        self.keys, self.values = (_read(buffer, selected) for buffer in (self.key_buffer, self.value_buffer))
        return self.keys, self.values

    def reserve(self, slots: int, columns: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Make the buffers hold at least `slots` slots of `columns` columns, keeping what they hold;
        `keys` and `values` (any tensors of shape (., kv_heads, ., head_dim)) give their layouts when
        they are new."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        have = (0, 0) if self.key_buffer is None else (self.key_buffer.shape[0], self.key_buffer.shape[2])
        if slots <= have[0] and columns <= have[1]:
            return
        size = (max(slots, int(have[0] * GROWTH)) if slots > have[0] else have[0],
                max(int(columns * GROWTH), columns + MIN_ROOM) if columns > have[1] else have[1])
        for name, like in (("key_buffer", keys), ("value_buffer", values)):
            old, new = getattr(self, name), like.new_zeros((size[0], like.shape[1], size[1], like.shape[-1]))
            if old is not None:
                new[:have[0], :, :have[1]].copy_(old)
            setattr(self, name, new)

    def reset(self) -> None:
        super().reset()
        self.key_buffer = self.value_buffer = None


def _read(buffer: torch.Tensor, selected: Selection) -> torch.Tensor:
    """The selected slots' first `selected.end` columns of `buffer`: (R, kv_heads, end, head_dim)."""
    if isinstance(selected.read, slice):
        return buffer[selected.read, :, :selected.end]
    return buffer[:, :, :selected.end].index_select(0, selected.read)


class RaggedCache(Cache):
    """A transformers cache for several sequences of different lengths in one forward (a batch of
    speculative rows): each layer a `RaggedLayer`, every sequence in a slot. Before each forward,
    `select` says which slots it computes, in which batch order, and at which column each slot's new
    rows start; the caller passes the model a 4D mask that shows each query its own slot's rows only.
    Models whose cache has layers other than plain attention (sliding windows, recurrent state) are
    refused: their state is not rows of keys and values."""

    def __init__(self, config):
        layers = DynamicCache(config=config).layers
        if any(type(layer) is not DynamicLayer for layer in layers):
            kinds = sorted({type(layer).__name__ for layer in layers} - {"DynamicLayer"})
            raise ValueError(f"a ragged cache holds plain attention layers only; this model's cache also has "
                             f"{', '.join(kinds)}: score its sequences one at a time")
        self.selection = Selection()
        super().__init__(layers=[RaggedLayer(self.selection) for _ in layers])

    def select(self, slots: list[int], starts: list[int], rows: int, device: torch.device | str) -> None:
        """The next forward computes `rows` new rows for each slot of `slots` (its batch order), written
        from column `starts[i]` of slot `slots[i]` on."""
        index = torch.tensor(slots, device=device)  # (R,)
        columns = torch.tensor(starts, device=device)[:, None] + torch.arange(rows, device=device)  # (R, T)
        consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
        self.selection.write = (index[:, None].expand(-1, rows), columns)
        self.selection.read = slice(slots[0], slots[0] + len(slots)) if consecutive else index
        self.selection.end = max(starts) + rows
        self.selection.slots = max(slots) + 1

    def store(self, slot: int, source: Cache) -> None:
        """Copy the rows of a single-sequence cache (batch 1, e.g. a prompt read alone) into `slot`."""
        for layer, alone in zip(self.layers, source.layers):
            length = alone.get_seq_length()
            if length:
                layer.reserve(slot + 1, length, alone.keys, alone.values)
                layer.key_buffer[slot, :, :length].copy_(alone.keys[0])
                layer.value_buffer[slot, :, :length].copy_(alone.values[0])

    def gather(self, slots: list[int], sources: list[int], targets: list[int], device) -> None:
        """For each i, copy column `sources[i]` of slot `slots[i]` to its column `targets[i]`, in every
        layer (a commit keeping an accepted branch); all sources are read before any target is written."""
        slot, source, target = (torch.tensor(values, device=device) for values in (slots, sources, targets))
        for layer in self.layers:
            if layer.key_buffer is not None:
                layer.key_buffer[slot, :, target] = layer.key_buffer[slot, :, source]  # (n, kv_heads, dim)
                layer.value_buffer[slot, :, target] = layer.value_buffer[slot, :, source]

    def move(self, source: int, target: int, columns: int) -> None:
        """Copy slot `source`'s first `columns` columns into slot `target`, in every layer."""
        for layer in self.layers:
            if layer.key_buffer is not None and columns:
                layer.key_buffer[target, :, :columns].copy_(layer.key_buffer[source, :, :columns])
                layer.value_buffer[target, :, :columns].copy_(layer.value_buffer[source, :, :columns])
