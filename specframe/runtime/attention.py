"""The CPU attention a target runs: grouped heads read in place, or rows computed exactly.

Two implementations are registered with transformers' attention and mask interfaces:

- `specframe_sdpa` (float32 on the CPU). SmolLM2 (like most recent models) shares each key/value head
  between several query heads. Given an attention mask, transformers' `sdpa` attention copies every key
  and value head once per query head that reads it (`repeat_kv`) before calling torch, unless the device
  is one it lists as able to take a mask with grouped heads. A tree forward always has a mask, so on the
  CPU each tree step copied the whole cache of every layer: for SmolLM2 at 256 cached tokens that made a
  tree of 1-5 nodes cost 5-20 % more than it does with torch's own grouped-query support
  (`enable_gqa=True`), which torch's CPU attention kernel computes in place from the shared heads, mask
  and all. `specframe_sdpa` passes the same masks to the same kernel, with `enable_gqa=True` instead of
  copying; every other call (another device, no mask, a paged cache, position biases, soft-capping)
  goes to transformers' `sdpa` unchanged. A plain step (one query, no mask) never copied.
- `specframe_exact` (bfloat16 and float16 on the CPU): each query row computed from its own query and
  visible keys alone, in float64, so that a tree forward reproduces plain steps bit for bit
  (`specframe.runtime.exact_attention`, which says why half precision needs it).

`load_target` switches CPU targets on `sdpa` to the one for their dtype (`SPECFRAME_CPU_ATTENTION=auto`,
the default); `specframe_sdpa`, `specframe_exact` or `sdpa` (transformers' own) choose one for every dtype.
"""

from __future__ import annotations

import torch

from specframe.runtime.exact_attention import NAME as EXACT
from specframe.support.settings import env_choice

NAME = "specframe_sdpa"
ENV = "SPECFRAME_CPU_ATTENTION"
OURS = (NAME, EXACT)
CHOICES = ("auto", NAME, EXACT, "sdpa")  # the values of `ENV`
HALF = (torch.bfloat16, torch.float16)


def chosen_attention() -> str:
    """The CPU attention `SPECFRAME_CPU_ATTENTION` asks for: auto (the default), specframe_sdpa,
    specframe_exact or sdpa."""
    return env_choice(ENV, CHOICES, "CPU attention")


def attention_for(dtype: torch.dtype) -> str:
    """The attention a CPU target computing in `dtype` runs: `SPECFRAME_CPU_ATTENTION`, where auto
    means exact rows in half precision and grouped sdpa in float32."""
    choice = chosen_attention()
    if choice != "auto":
        return choice
    return EXACT if dtype in HALF else NAME


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
    """Make `specframe_sdpa` and `specframe_exact` names transformers accepts (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    from specframe.runtime.exact_attention import exact_attention_forward

    AttentionInterface.register(NAME, grouped_sdpa_forward)
    AttentionInterface.register(EXACT, exact_attention_forward)
    for name in (NAME, EXACT):
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)


def use_attention(model: torch.nn.Module, name: str) -> bool:
    """Switch `model` from transformers' `sdpa` (or one of ours) to `name`; whether it runs `name` now
    (a model class that refuses custom attention keeps `sdpa`)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", *OURS):
        return False
    register()
    try:
        model.set_attn_implementation(name)
    except (ValueError, ImportError):
        model.set_attn_implementation("sdpa")
        return False
    return getattr(model.config, "_attn_implementation", None) == name


def use_cpu_attention(model: torch.nn.Module) -> str:
    """Switch a CPU `model` on `sdpa` to `attention_for` its dtype; the implementation it runs after.
    Models on another implementation (eager, flash), and model classes that refuse custom attention,
    are left as they are."""
    use_attention(model, attention_for(next(model.parameters()).dtype))
    return getattr(model.config, "_attn_implementation", None)
