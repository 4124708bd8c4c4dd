"""The CPU attention a target runs: grouped heads read in place, or rows computed exactly.

Two implementations are registered with transformers' attention and mask interfaces:

- `specframe_sdpa` (`NAME`, float32 on the CPU). SmolLM2 (like most recent models) shares each key/value
  head between several query heads. Given an attention mask, transformers' `sdpa` attention copies every
  key and value head once per query head that reads it (`repeat_kv`) before calling torch, unless the
  device is one it lists as able to take a mask with grouped heads. A tree forward always has a mask, so
  on the CPU each tree step copied the whole cache of every layer: for SmolLM2 at 256 cached tokens that
  made a tree of 1-5 nodes cost 5-20 % more than it does with torch's own grouped-query support
  (`enable_gqa=True`), which torch's CPU attention kernel computes in place from the shared heads, mask
  and all. `specframe_sdpa` passes the same masks to the same kernel, with `enable_gqa=True` instead of
  copying; every other call (another device, no mask, a paged cache, position biases, soft-capping)
  goes to transformers' `sdpa` unchanged. A plain step (one query, no mask) never copied.
- `specframe_exact` (`EXACT`, bfloat16 and float16 on the CPU): row-invariant attention, so that a tree
  forward reproduces plain decoding steps bit for bit.

Why half precision needs exact rows: speculative decoding is lossless when the target scores a draft
token exactly as a plain decoding step would. torch's attention kernels do not promise that: how they
block and sum over keys depends on how many query rows a call has and on the mask, so the row of a node
in a tree forward differs from the same token's plain step in the last bits. In float32 that is about
1e-5 in the logits, and a greedy choice flips only at a near-tie that close. In bfloat16 each layer
rounds its output to 8 bits, the differences grow through the layers to 0.2-0.7 in the logits, and
greedy speculative outputs part from plain decoding within a few tokens.

`exact_attention_forward` computes every query row from that row's query and the keys it may see
alone, accumulating in float64. The products of bfloat16 (or float32) queries and keys are exact there,
and the scores and the weighted sums of the values carry 53 bits before the result is rounded to the
model's precision, so the order of summation (which differs with the number of rows and with the masked
keys between a node and its ancestors) changes the result with a probability of the order of 2^-40 per
output element. Rows then match plain steps bit for bit, as long as the linear layers are row invariant
too: `load_target` packs a bfloat16 CPU target's linears so that they are, for up to `EXACT_ROWS` rows
(`specframe.runtime.packed_linear`; `tests/core/runtime/test_exact_attention.py` checks whole forwards).
`exact_rows(model)` says how many rows a model's attention and linears keep exact; for the linears it
measures that on the CPU it runs on, because where they are not packed (`SPECFRAME_CPU_LINEAR=torch`, or
a CPU without native bfloat16) torch's own kernels decide, and they may keep fewer rows.

Forwards of more than `EXACT_ROWS` query rows per sequence (prefills) go to torch's kernel: a prompt is
read once, by the same call in plain and speculative decoding, so its keys and values are the same either
way. A forward of several sequences (a batch of rows scored together, each with its own slice of a 4D
mask) computes each sequence as a forward of that sequence alone would, by the same float64 sums; the
linears then see the rows of every sequence at once, so `exact_rows(model)` bounds the rows of all
sequences together. A backend scores a larger tree, or a larger batch, in forwards of at most
`exact_rows(model)` rows. `docs/explanation/metrics-and-costs.md` has what this costs.

`load_target` switches CPU targets on `sdpa` to the one for their dtype (`SPECFRAME_CPU_ATTENTION=auto`,
the default); `specframe_sdpa`, `specframe_exact` or `sdpa` (transformers' own) choose one for every dtype.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from specframe.runtime.packed_linear import invariant_rows
from specframe.support.settings import env_choice

NAME = "specframe_sdpa"
EXACT = "specframe_exact"
ENV = "SPECFRAME_CPU_ATTENTION"
OURS = (NAME, EXACT)
CHOICES = ("auto", NAME, EXACT, "sdpa")  # the values of `ENV`
HALF = (torch.bfloat16, torch.float16)
EXACT_ROWS = 64  # more query rows than this (a prefill) go to torch's own kernel
FEW_ROWS = 8  # linears exact for fewer rows than this split a typical tree into several forwards: warn
ACCUMULATE = torch.float64


def chosen_attention() -> str:
    """The CPU attention `SPECFRAME_CPU_ATTENTION` asks for: auto (the default), specframe_sdpa,
    specframe_exact or sdpa."""
    return env_choice(ENV, CHOICES, "CPU attention")


def attention_for(dtype: torch.dtype, exact: bool = False) -> str:
    """The attention a CPU target computing in `dtype` runs: `SPECFRAME_CPU_ATTENTION`, where auto
    means exact rows in half precision, or where `exact` (the linears keep rows exact in float32 too:
    `block_linear`), and grouped sdpa otherwise."""
    choice = chosen_attention()
    if choice != "auto":
        return choice
    return EXACT if dtype in HALF or exact else NAME


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


def use_cpu_attention(model: torch.nn.Module, exact: bool = False) -> str:
    """Switch a CPU `model` on `sdpa` to `attention_for` its dtype (and `exact`); the implementation it
    runs after. Models on another implementation (eager, flash), and model classes that refuse custom
    attention, are left as they are."""
    use_attention(model, attention_for(next(model.parameters()).dtype, exact))
    return getattr(model.config, "_attn_implementation", None)


# --- exact rows (`specframe_exact`) ------------------------------------------------------------------


def exact_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None,
                            **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: (batch, heads, rows, dim) in, (batch, rows, heads, dim) out.
    `attention_mask` is additive (float, large negative where masked) or boolean (True = may attend),
    of shape (batch or 1, 1, rows, keys); None means causal (unless the module or `is_causal` says not).
    Each batch row (a sequence of a batch) is computed from its own queries, keys and mask slice alone."""
    batch, heads, rows, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    # Prefills and what this does not compute.
    if rows > EXACT_ROWS or not _plain_scaled(kwargs, dropout) or heads % kv_heads:
        return grouped_sdpa_forward(module, query, key, value, attention_mask, dropout=dropout,
                                    scaling=scaling, is_causal=is_causal, **kwargs)
    groups = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    # Query head h reads key/value head h // groups: stack each head's group of queries into one matrix,
    # one matrix per (batch row, key/value head).
    grouped = query.reshape(batch * kv_heads, groups * rows, dim).to(ACCUMULATE).mul_(scale)
    keys = key.to(ACCUMULATE).reshape(batch * kv_heads, length, dim).transpose(1, 2)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    bias = _bias(attention_mask, rows, length, groups, causal)  # (groups * rows, keys) or per batch row
    # Products of bfloat16 (or float32) numbers summed in float64: the order of the sum does not matter.
    if bias is None:
        scores = torch.bmm(grouped, keys)
    elif bias.dim() == 2:
        scores = torch.baddbmm(bias, grouped, keys)
    else:  # a mask per batch row: (batch, groups * rows, keys) added to each of its key/value heads
        scores = torch.bmm(grouped, keys).view(batch, kv_heads, groups * rows, length).add_(bias[:, None])
        scores = scores.view(batch * kv_heads, groups * rows, length)
    weights = torch.softmax(scores, -1)  # its sum over the keys: float64, so its order does not matter
    out = torch.bmm(weights, value.to(ACCUMULATE).reshape(batch * kv_heads, length, dim))
    out = out.to(query.dtype).reshape(batch, heads, rows, dim)
    return out.transpose(1, 2).contiguous(), None


# The last mask seen (a weak reference: a new forward's mask is a new tensor), its shape and its bias.
# Masks are not changed in place while a forward reads them.
_BIAS_CACHE: dict = {}


def _bias(mask: torch.Tensor | None, rows: int, length: int, groups: int,
          causal: bool = True) -> torch.Tensor | None:
    """The float64 bias (0 where allowed, -inf where masked) of every stacked query row: (groups * rows,
    keys) for a mask of one batch row (or none), (batch, groups * rows, keys) for a mask with a slice per
    batch row; None when every row sees every key. Made once per forward: every layer gets the same mask.
    Without a mask the rows are causal, as transformers' `sdpa` makes them, unless `causal` is False."""
    if mask is None and (rows == 1 or not causal):
        return None
    if mask is None:  # causal: row i sees the keys up to its own position, length - rows + i
        allowed = torch.ones(rows, length, dtype=torch.bool).tril(length - rows)
        return _bias_of(allowed, groups)
    seen, key = _BIAS_CACHE.get("mask"), (tuple(mask.shape), rows, length, groups)
    if seen is not None and seen() is mask and _BIAS_CACHE["key"] == key:
        return _BIAS_CACHE["bias"]
    rows_mask = mask[:, 0, :, :length] if mask.shape[0] > 1 else mask[0, 0, :, :length]
    allowed = rows_mask if rows_mask.dtype == torch.bool else rows_mask > torch.finfo(rows_mask.dtype).min / 2
    bias = _bias_of(allowed, groups)
    _BIAS_CACHE.update(mask=weakref.ref(mask), key=key, bias=bias)
    return bias


def _bias_of(allowed: torch.Tensor, groups: int) -> torch.Tensor:
    """(..., rows, keys) allowed -> (..., groups * rows, keys) bias, row g * rows + i that of row i."""
    bias = torch.zeros(allowed.shape, dtype=ACCUMULATE, device=allowed.device)
    repeats = (1,) * (allowed.dim() - 2) + (groups, 1)
    return bias.masked_fill_(~allowed, float("-inf")).repeat(*repeats)


def _plain_scaled(extra: dict, dropout: float) -> bool:
    """Whether a call asks for plain scaled dot-product attention, nothing this module does not compute."""
    if dropout or extra.get("output_attentions"):
        return False
    return all(extra.get(name) is None for name in ("position_bias", "cache", "softcap", "sliding_window",
                                                     "s_aux"))


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The (B, 1, T, S) additive attention mask that a model's forward takes, from a (B, T, S) bool mask of
    the keys each query may see: 0 where allowed, the dtype's lowest value elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def exact_rows(model: torch.nn.Module) -> int | None:
    """The most rows one forward of `model` may take and still compute every row exactly as a forward of
    that row alone would, for a CPU model on `specframe_exact` attention: `EXACT_ROWS`, or fewer where
    its linear layers keep fewer rows invariant, as measured on this CPU (`invariant_rows`: torch's own
    kernels, where the linears are not packed or the CPU has no native bfloat16, may keep fewer). None
    (no limit that matters: the model is not computed exactly anyway) for any other."""
    exact = getattr(getattr(model, "config", None), "_attn_implementation", None) == EXACT
    weight = next(model.parameters())
    if not exact or weight.device.type != "cpu":
        return None
    rows = min([EXACT_ROWS, *(invariant_rows(m, EXACT_ROWS) for m in model.modules()
                              if isinstance(m, torch.nn.Linear))])
    if rows < FEW_ROWS:
        kind = str(weight.dtype).removeprefix("torch.")
        count = "1 row" if rows == 1 else f"{rows} rows"
        warnings.warn(f"this model's {kind} linear layers give a row the same bits in a product of several "
                      f"rows as alone only for products of up to {count} on this CPU, so trees are scored "
                      f"{count} per forward to stay exact, which is slow: use float32, or a CPU with "
                      "native bfloat16 products (AVX-512 BF16 or AMX)", stacklevel=2)
    return rows
