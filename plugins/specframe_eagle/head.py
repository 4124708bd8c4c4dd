"""The EAGLE draft head: Llama decoder layers over the token embedding and the target's feature, drafting
autoregressively in feature space (Li et al., EAGLE, EAGLE-2 and EAGLE-3).

One module serves both published forms; their parameter names are the checkpoints' own, so a state dict
loads as it is:

- **EAGLE** (EAGLE-1 and EAGLE-2 share it): `fc` maps concat(e(t_{j+1}), f_j) (2H) to H, then
  `layers.0..n-1` (the first without `input_layernorm`, as published); the output is the predicted
  feature f_{j+1}, which the target's own, frozen LM head turns into logits (no final norm: the target's
  feature is already normed).
- **EAGLE-3**: the target's features of three layers (low, middle, high) concatenated (3H) and projected
  by `fc` to H; one `midlayer` whose attention reads concat(input_layernorm(e), hidden_norm(h)) (2H); its
  output, before `norm`, is the next step's feature, and `lm_head(norm(out))` gives logits over a reduced
  draft vocabulary, draft id i being target id i + d2t[i]. Drafted positions feed the head's own output
  (H) back, which `fc` does not touch.

The head keeps a KV cache per request (`HeadCache`); `forward` writes the keys of its rows into given
slots and attends through an explicit boolean mask, so the same call serves the committed context (a
causal block) and the draft tree's levels (each node sees the context and its ancestors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

Form = Literal["eagle", "eagle3"]


@dataclass(frozen=True)
class HeadConfig:
    """Sizes of a head, read from its `config.json` (`specframe_eagle.checkpoint.head_config`)."""

    form: Form
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    layers: int
    vocab_size: int  # the target's vocabulary, which drafted ids live in
    draft_vocab_size: int  # rows of the head's own LM head (EAGLE-3); the target's vocabulary otherwise
    feature_layers: tuple[int, ...] | None  # the target's hidden-state indices it reads; None: the last
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    fc_bias: bool = False
    attention_bias: bool = False
    norm_before_residual: bool = False  # EAGLE-3 variant: the residual is the normed feature
    rope: dict = field(default_factory=dict, hash=False)  # rope_theta, rope_scaling, max_position_embeddings

    @property
    def feature_width(self) -> int:
        """Width of the target features the head reads: one layer's, or several concatenated."""
        return self.hidden_size * (len(self.feature_layers) if self.feature_layers else 1)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    def __init__(self, config: HeadConfig):
        from transformers.activations import ACT2FN

        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query attention with rotary positions over a `width`-wide input (H, or 2H in EAGLE-3)."""

    def __init__(self, config: HeadConfig, width: int):
        super().__init__()
        heads, kv, dim, bias = config.num_heads, config.num_kv_heads, config.head_dim, config.attention_bias
        self.heads, self.kv_heads, self.head_dim = heads, kv, dim
        self.q_proj = nn.Linear(width, heads * dim, bias=bias)
        self.k_proj = nn.Linear(width, kv * dim, bias=bias)
        self.v_proj = nn.Linear(width, kv * dim, bias=bias)
        self.o_proj = nn.Linear(heads * dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                cache: LayerView | Appending | None, mask: torch.Tensor | None) -> torch.Tensor:
        """(B, T, W) -> (B, T, H). With `cache`, the rows' keys go to its slots and the queries attend to
        its first `cache.end` columns through `mask` (B or 1, 1, T, end) bool; without, causally."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, nh, T, d)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, d)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *rotary)
        if cache is not None:
            k, v = cache.write(k, v)  # (B, nkv, end, d)
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=cache is None and mask is None,
            enable_gqa=self.heads != self.kv_heads)  # (B, nh, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Layer(nn.Module):
    """A Llama decoder layer; EAGLE's first layer has no input norm, EAGLE-3's reads [e, h] (see module)."""

    def __init__(self, config: HeadConfig, index: int):
        super().__init__()
        self.wide = config.form == "eagle3"
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Attention(config, 2 * hidden if self.wide else hidden)
        self.mlp = MLP(config)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        if self.wide:
            self.hidden_norm = RMSNorm(hidden, eps)
            self.input_layernorm = RMSNorm(hidden, eps)
            self.norm_before_residual = config.norm_before_residual
        elif index > 0:
            self.input_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, embeds: torch.Tensor, rotary, cache: LayerView | Appending | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        if self.wide:
            h = self.hidden_norm(x)
            residual = h if self.norm_before_residual else x
            h = torch.cat([self.input_layernorm(embeds), h], dim=-1)  # (B, T, 2H)
        else:
            residual = x
            h = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        x = residual + self.self_attn(h, rotary, cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    """The draft head of either form (see the module docstring). The target's embedding, and in the
    EAGLE form its LM head, are passed in by the caller, never stored here."""

    def __init__(self, config: HeadConfig):
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        super().__init__()
        self.config = config
        hidden = config.hidden_size
        if config.form == "eagle3":
            if config.feature_layers:  # several layers' features, projected to H (two or more)
                self.fc = nn.Linear(config.feature_width, hidden, bias=config.fc_bias)
            self.midlayer = Layer(config, 0)
            self.norm = RMSNorm(hidden, config.rms_norm_eps)
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        else:
            self.fc = nn.Linear(2 * hidden, hidden, bias=config.fc_bias)
            self.layers = nn.ModuleList(Layer(config, i) for i in range(config.layers))
        rope = LlamaConfig(hidden_size=hidden, num_attention_heads=config.num_heads, head_dim=config.head_dim,
                           **config.rope)
        self.rotary = LlamaRotaryEmbedding(rope)

    @property
    def decoder_layers(self) -> list[Layer]:
        return [self.midlayer] if self.config.form == "eagle3" else list(self.layers)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | StepKeys | None = None, slots: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, H) token embeddings e(t_{j+1}), (B, T, F) features f_j (the target's, or the head's own
        output at drafted positions), (B, T) positions j -> (B, T, H) predicted features f_{j+1}.

        With a `HeadCache` (B = 1), keys go to `slots` (T,) and `mask` (1, 1, T, end) says what each row
        sees; with `StepKeys` (training's unrolled steps) they go after the earlier steps', seen through
        `mask` too; without either, the rows attend causally (training's first step)."""
        embeds = embeds.to(self.dtype)
        features = features.to(self.dtype)
        if self.config.form == "eagle3":
            fc = getattr(self, "fc", None)
            x = fc(features) if fc is not None and features.shape[-1] == fc.in_features else features
        else:
            x = self.fc(torch.cat([embeds, features], dim=-1))  # (B, T, H)
        rotary = self.rotary(x, positions)  # (cos, sin), each (B, T, d)
        for i, layer in enumerate(self.decoder_layers):
            view = None if cache is None else cache.view(i, slots)
            x = layer(x, embeds, rotary, view, mask)
        return x

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


class HeadCache:
    """One request's keys and values of every head layer: (1, kv_heads, capacity, head_dim) buffers that
    grow by doubling. Columns [0, length) hold the committed context (the drafter's bookkeeping); a draft
    tree's keys are written after them and overwritten by the next step's context."""

    def __init__(self, head: EagleHead, capacity: int = 256):
        c = head.config
        self.shape = (1, c.num_kv_heads, capacity, c.head_dim)
        self.keys = [torch.empty(self.shape, dtype=head.dtype, device=_device(head))
                     for _ in head.decoder_layers]
        self.values = [torch.empty_like(k) for k in self.keys]

    def reserve(self, columns: int) -> None:
        """Room for `columns` columns, the existing ones kept."""
        capacity = self.keys[0].shape[2]
        if columns <= capacity:
            return
        grown = max(columns, 2 * capacity)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = old.new_empty((*old.shape[:2], grown, old.shape[3]))
                new[:, :, :capacity] = old
                buffers[i] = new

    def view(self, layer: int, slots: torch.Tensor) -> LayerView:
        return LayerView(self, layer, slots)


@dataclass
class LayerView:
    """Where one forward writes its keys in one layer of a `HeadCache`."""

    cache: HeadCache
    layer: int
    slots: torch.Tensor  # (T,) columns the rows' keys go to

    @property
    def end(self) -> int:
        return int(self.slots.max()) + 1

    def write(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (1, nkv, T, d) keys and values at the slots; the first `end` columns of each."""
        end = self.end
        self.cache.reserve(end)
        keys, values = self.cache.keys[self.layer], self.cache.values[self.layer]
        keys.index_copy_(2, self.slots, k.to(keys.dtype))
        values.index_copy_(2, self.slots, v.to(values.dtype))
        return keys[:, :, :end], values[:, :, :end]


class StepKeys:
    """The keys and values of a training run's unrolled steps (EAGLE-3's training-time test): each step's
    forward appends its keys after the earlier steps' by concatenation (autograd keeps every step), and
    its queries see them through a mask (`specframe_eagle.train.unrolled_mask`)."""

    def __init__(self, head: EagleHead):
        self.keys: list[torch.Tensor | None] = [None] * len(head.decoder_layers)
        self.values: list[torch.Tensor | None] = [None] * len(head.decoder_layers)

    def view(self, layer: int, slots: torch.Tensor | None) -> Appending:
        return Appending(self, layer)


@dataclass
class Appending:
    cache: StepKeys
    layer: int

    def write(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, nkv, T, d) keys and values after the earlier steps' (B, nkv, S + T, d)."""
        old_k, old_v = self.cache.keys[self.layer], self.cache.values[self.layer]
        if old_k is not None:
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.cache.keys[self.layer], self.cache.values[self.layer] = k, v
        return k, v


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


@torch.no_grad()
def start_from_target(head: EagleHead, target, generator: torch.Generator | None = None) -> EagleHead:
    """Initialise `head` for `target` as training starts it: "feature in, feature out" (as s4c's heads
    start). `fc` passes the feature on (EAGLE: its feature half is the identity; EAGLE-3: the highest
    layer's block is), the decoder layers start from the target's last layer where the shapes agree
    (random otherwise) with their output projections zeroed, so the head's first prediction is its input
    feature, and EAGLE-3's LM head starts as the target's rows of the draft vocabulary. Untrained, it then
    proposes what the target's own head says at the previous position: sharp, real distributions."""
    def noise(*shape):
        return torch.randn(*shape, generator=generator) * 0.02

    c = head.config
    hidden = c.hidden_size
    source = {}
    layers = getattr(getattr(target.model, "base_model", None), "layers", None)
    if layers is not None and len(layers):
        source = {name: value for name, value in layers[-1].state_dict().items()}
    for layer in head.decoder_layers:
        for name, param in layer.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif source.get(name) is not None and source[name].shape == param.shape:
                param.copy_(source[name])
            else:
                param.copy_(noise(*param.shape))
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    fc = getattr(head, "fc", None)
    if fc is not None:
        fc.weight.copy_(noise(*fc.weight.shape))
        fc.weight[:, fc.in_features - hidden:] += torch.eye(hidden)  # EAGLE: [e, f]; EAGLE-3: the last layer
        if fc.bias is not None:
            fc.bias.zero_()
    if c.form == "eagle3":
        head.norm.weight.copy_(target.model.base_model.norm.weight.detach())
        lm_head = target.model.get_output_embeddings().weight.detach()
        head.lm_head.weight.copy_(lm_head[torch.arange(len(head.d2t)) + head.d2t])
    return head
