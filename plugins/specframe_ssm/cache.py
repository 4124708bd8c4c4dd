"""Reading the state of a transformers `DynamicCache` for Mamba2 and hybrid models: a prompt's recurrent
states (`ssm-tree`'s rows keep them per row), and cropping attention keys (`ssm-unrolled`).

SSM layers are `LinearAttentionLayer`s (conv state (1, Cd, K), SSM state (1, H, P, N)); attention layers
are `DynamicLayer`s (keys/values (1, H_kv, S, d)).
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
