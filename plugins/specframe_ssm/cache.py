"""Reading and writing the committed state of a transformers `DynamicCache` for Mamba2 and hybrid models.

SSM layers are `LinearAttentionLayer`s (conv state (1, Cd, K), SSM state (1, H, P, N)); attention layers
are `DynamicLayer`s (keys/values (1, H_kv, S, d)). The committed state is only ever written by `commit`.
"""

from __future__ import annotations

import torch


def conv_module(mixer) -> torch.nn.Conv1d:
    """The layer's depthwise causal conv (`conv1d`; LFM2's short conv calls it `conv`)."""
    return mixer.conv1d if hasattr(mixer, "conv1d") else mixer.conv


def ssm_state(cache, mixer) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(conv (Cd, K), recurrent state or None) of a mixer's layer: zeros and None before any token, and
    None for layers with no recurrent state (LFM2's short conv)."""
    layer = cache.layers[mixer.layer_idx]
    if layer.has_previous_state[0]:
        recurrent = layer.recurrent_states[0]
        return layer.conv_states[0][0], None if recurrent is None else recurrent[0]
    weight = conv_module(mixer).weight  # (channels, 1, K)
    return torch.zeros(weight.shape[0], weight.shape[-1], dtype=weight.dtype, device=weight.device), None


def write_ssm_state(cache, mixer, conv: torch.Tensor, h: torch.Tensor | None) -> None:
    """Store conv (Cd, K) and the recurrent state h (None: the layer has none) as the layer's committed
    state, in place when it exists."""
    layer = cache.layers[mixer.layer_idx]
    if layer.has_previous_state[0]:
        layer.conv_states[0].copy_(conv[None])
        if h is not None:
            layer.recurrent_states[0].copy_(h[None])
    else:  # first tokens ever: let the cache allocate its buffers
        cache.update_conv_state(conv[None].contiguous(), mixer.layer_idx, conv_kernel_size=conv.shape[1])
        if h is not None:
            cache.update_recurrent_state(h[None].contiguous(), mixer.layer_idx)


def kv_length(cache, layer_idx: int) -> int:
    return cache.layers[layer_idx].get_seq_length()


def crop_kv(cache, layers: list[int], length: int) -> None:
    """Drop every key/value row after `length` in the given attention layers. The keys/values alone: a
    layer that also holds recurrent states (Falcon-H1's parallel layers) would otherwise try to roll them
    back too, which transformers refuses and `commit` does itself."""
    from transformers.cache_utils import DynamicLayer

    for idx in layers:
        extra = kv_length(cache, idx) - length
        if extra > 0:
            DynamicLayer.crop(cache.layers[idx], -extra)


def compact_kv(cache, layers: list[int], start: int, keep: list[int]) -> None:
    """Move rows `keep` (absolute, increasing) to `start, start + 1, ...` and drop the rest."""
    if keep != list(range(start, start + len(keep))):
        index = torch.tensor(keep)
        for idx in layers:
            layer = cache.layers[idx]
            index = index.to(layer.keys.device)
            layer.keys[:, :, start:start + len(keep)] = layer.keys.index_select(-2, index)
            layer.values[:, :, start:start + len(keep)] = layer.values.index_select(-2, index)
    crop_kv(cache, layers, start + len(keep))
