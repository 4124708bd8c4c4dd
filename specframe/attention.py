"""Grouped-query attention without copying the cache: cheaper tree forwards on the CPU.

SmolLM2 (like most recent models) shares each key/value head between several query heads. Given an
attention mask, transformers' `sdpa` attention copies every key and value head once per query head that
reads it (`repeat_kv`) before calling torch, unless the device is one it lists as able to take a mask
with grouped heads. A tree forward always has a mask, so on the CPU each tree step copied the whole cache
of every layer: for SmolLM2 at 256 cached tokens that made a tree of 1-5 nodes cost 5-20 % more than it
does with torch's own grouped-query support (`enable_gqa=True`), which torch's CPU attention kernel
computes in place from the shared heads, mask and all. A plain step (one query, no mask) never copied.

`use_grouped_sdpa(model)` switches a model that uses `sdpa` to `specframe_sdpa`, registered here with
transformers' attention and mask interfaces: the same masks, the same kernel, the same numbers, but
CPU calls with a mask and grouped heads pass `enable_gqa=True` instead of copying. Every other call
(another device, no mask, a paged cache, position biases, soft-capping) goes to transformers' `sdpa`
unchanged. `load_target` does this for CPU targets; `SPECFRAME_CPU_ATTENTION=sdpa` turns it off.
"""

from __future__ import annotations

import torch

from specframe.options import env_choice

NAME = "specframe_sdpa"
ENV = "SPECFRAME_CPU_ATTENTION"
CHOICES = (NAME, "sdpa")  # the values of `ENV`: grouped heads in torch's kernel, or transformers' own sdpa


def chosen_attention() -> str:
    """The CPU attention `SPECFRAME_CPU_ATTENTION` asks for: specframe_sdpa (the default) or sdpa."""
    return env_choice(ENV, CHOICES, "CPU attention")


def grouped_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                         scaling: float | None = None, is_causal: bool | None = None,
                         **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: (batch, heads, rows, dim) in, (batch, rows, heads, dim) out."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if not _takes_grouped_mask(query, key, value, attention_mask, groups, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _takes_grouped_mask(query, key, value, mask, groups: int, dropout: float, extra: dict) -> bool:
    """Whether this call is one transformers would answer by copying the cache and we can answer without:
    CPU, a mask, grouped heads of equal sizes, nothing beyond plain scaled attention."""
    if mask is None or groups <= 1 or query.device.type != "cpu" or dropout:
        return False
    if any(extra.get(name) is not None for name in ("position_bias", "cache", "softcap")):
        return False
    if extra.get("output_attentions") or key.shape[-1] != value.shape[-1]:
        return False
    return query.shape[1] == key.shape[1] * groups


def register() -> None:
    """Make `specframe_sdpa` a name transformers accepts (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use_grouped_sdpa(model: torch.nn.Module) -> bool:
    """Switch `model` from transformers' `sdpa` to `specframe_sdpa`; whether it switched (models on
    another attention implementation, and `SPECFRAME_CPU_ATTENTION=sdpa`, are left as they are)."""
    config = getattr(model, "config", None)
    if chosen_attention() != NAME or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, ImportError):  # a model class that refuses custom attention: keep its sdpa
        model.set_attn_implementation("sdpa")
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME
