"""Row-invariant attention: a tree forward reproduces plain decoding steps bit for bit.

Speculative decoding is lossless when the target scores a draft token exactly as a plain decoding step
would. torch's attention kernels do not promise that: how they block and sum over keys depends on how
many query rows a call has and on the mask, so the row of a node in a tree forward differs from the
same token's plain step in the last bits. In float32 that is about 1e-5 in the logits, and a greedy
choice flips only at a near-tie that close. In bfloat16 each layer rounds its output to 8 bits, the
differences grow through the layers to 0.2-0.7 in the logits, and greedy speculative outputs part from
plain decoding within a few tokens.

`exact_attention_forward` computes every query row from that row's query and the keys it may see
alone, accumulating in float64. The products of bfloat16 (or float32) queries and keys are exact there,
and the scores and the weighted sums of the values carry 53 bits before the result is rounded to the
model's precision, so the order of summation (which differs with the number of rows and with the masked
keys between a node and its ancestors) changes the result with a probability of the order of 2^-40 per
output element. Rows then match plain steps bit for bit, as long as the linear layers are row invariant
too: `load_target` packs a bfloat16 CPU target's linears so that they are, for up to `EXACT_ROWS` rows
(`specframe.runtime.packed_linear`; `tests/test_exact_attention.py` checks whole forwards).
`exact_rows(model)`
says how many rows a model's attention and linears keep exact; for the linears it measures that on the
CPU it runs on, because where they are not packed (`SPECFRAME_CPU_LINEAR=torch`, or a CPU without native
bfloat16) torch's own kernels decide, and they may keep fewer rows.

Forwards of more than `EXACT_ROWS` query rows (prefills) go to torch's kernel: a prompt is read once,
by the same call in plain and speculative decoding, so its keys and values are the same either way. So
do batches of several sequences, which the decoders never score. A backend scores a larger tree in
forwards of at most `exact_rows(model)` rows.
`docs/explanation/metrics-and-costs.md` has what this costs.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from specframe.runtime.packed_linear import invariant_rows

NAME = "specframe_exact"
EXACT_ROWS = 64  # more query rows than this (a prefill) go to torch's own kernel
FEW_ROWS = 8  # linears exact for fewer rows than this split a typical tree into several forwards: warn
ACCUMULATE = torch.float64


def exact_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None,
                            **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: (batch, heads, rows, dim) in, (batch, rows, heads, dim) out.
    `attention_mask` is additive (float, large negative where masked) or boolean (True = may attend),
    of shape (batch, 1, rows, keys); None means causal (unless the module or `is_causal` says not)."""
    batch, heads, rows, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    # Prefills, several sequences at once (the decoders score one), and what this does not compute.
    if rows > EXACT_ROWS or batch != 1 or not _plain_scaled(kwargs, dropout) or heads % kv_heads:
        from specframe.runtime.attention import grouped_sdpa_forward  # which imports this module

        return grouped_sdpa_forward(module, query, key, value, attention_mask, dropout=dropout,
                                    scaling=scaling, is_causal=is_causal, **kwargs)
    groups = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    # Query head h reads key/value head h // groups: stack each head's group of queries into one matrix.
    grouped = query.reshape(kv_heads, groups * rows, dim).to(ACCUMULATE).mul_(scale)
    keys = key.reshape(kv_heads, length, dim).to(ACCUMULATE).transpose(1, 2)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    bias = _bias(attention_mask, rows, length, groups, causal)
    # Products of bfloat16 (or float32) numbers summed in float64: the order of the sum does not matter.
    scores = torch.bmm(grouped, keys) if bias is None else torch.baddbmm(bias, grouped, keys)
    weights = torch.softmax(scores, -1)  # its sum over the keys: float64, so its order does not matter
    out = torch.bmm(weights, value.reshape(kv_heads, length, dim).to(ACCUMULATE))
    out = out.to(query.dtype).reshape(batch, heads, rows, dim)
    return out.transpose(1, 2).contiguous(), None


# The last mask seen (a weak reference: a new forward's mask is a new tensor), its shape and its bias.
# Masks are not changed in place while a forward reads them.
_BIAS_CACHE: dict = {}


def _bias(mask: torch.Tensor | None, rows: int, length: int, groups: int,
          causal: bool = True) -> torch.Tensor | None:
    """The float64 bias (0 where allowed, -inf where masked) of every stacked query row, (groups * rows,
    keys); None when every row sees every key. Made once per forward: every layer gets the same mask.
    Without a mask the rows are causal, as transformers' `sdpa` makes them, unless `causal` is False."""
    if mask is None and (rows == 1 or not causal):
        return None
    if mask is None:  # causal: row i sees the keys up to its own position, length - rows + i
        allowed = torch.ones(rows, length, dtype=torch.bool).tril(length - rows)
        return _bias_of(allowed, groups)
    seen, key = _BIAS_CACHE.get("mask"), (rows, length, groups)
    if seen is not None and seen() is mask and _BIAS_CACHE["key"] == key:
        return _BIAS_CACHE["bias"]
    rows_mask = mask[0, 0, :, :length]
    allowed = rows_mask if rows_mask.dtype == torch.bool else rows_mask > torch.finfo(rows_mask.dtype).min / 2
    bias = _bias_of(allowed, groups)
    _BIAS_CACHE.update(mask=weakref.ref(mask), key=key, bias=bias)
    return bias


def _bias_of(allowed: torch.Tensor, groups: int) -> torch.Tensor:
    bias = torch.zeros(allowed.shape, dtype=ACCUMULATE, device=allowed.device)
    return bias.masked_fill_(~allowed, float("-inf")).repeat(groups, 1)


def _plain_scaled(extra: dict, dropout: float) -> bool:
    """Whether a call asks for plain scaled dot-product attention, nothing this module does not compute."""
    if dropout or extra.get("output_attentions"):
        return False
    return all(extra.get(name) is None for name in ("position_bias", "cache", "softcap", "sliding_window",
                                                     "s_aux"))


def exact_rows(model: torch.nn.Module) -> int | None:
    """The most rows one forward of `model` may take and still compute every row exactly as a forward of
    that row alone would, for a CPU model on `specframe_exact` attention: `EXACT_ROWS`, or fewer where
    its linear layers keep fewer rows invariant, as measured on this CPU (`invariant_rows`: torch's own
    kernels, where the linears are not packed or the CPU has no native bfloat16, may keep fewer). None
    (no limit that matters: the model is not computed exactly anyway) for any other."""
    exact = getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME
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
