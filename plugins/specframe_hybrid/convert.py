"""Turn a Llama-architecture model (SmolLM2) into a Mamba2 + attention hybrid that transformers loads alone.

The hybrid is a `GraniteMoeHybridForCausalLM` with no experts: its decoder layer is a Llama layer (RMSNorm,
mixer, residual, RMSNorm, SwiGLU MLP, residual) whose mixer is either attention or a Mamba2 mixer, with
rotary embeddings over the whole head and every multiplier set to the value that makes it a Llama. With no
layer replaced it computes the Llama's logits exactly (`tests/plugins/hybrid/test_hybrid.py` checks it), so a
layer replaced is the only difference. Bamba would not do: it hard-codes rotary embeddings over half of
each head.

A replaced layer's Mamba2 mixer starts from that layer's attention as MambaInLlama does (Wang et al.,
"The Mamba in the Llama", 2024): linear attention without the softmax is a state space model whose input
is V, whose input matrix B is K and whose output matrix C is Q. So, per query head h:

    x_h <- V of h's key/value head    B_h <- K of h's key/value head    C_h <- Q_h    out_proj <- O

with one Mamba2 group per query head (keys and values repeated as grouped-query attention repeats them),
a state as wide as a head and the convolution started as the identity. The gate z, the step sizes dt and
the decays A start as in Mamba2 and are learned in distillation (`specframe_hybrid.distill`).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from specframe import ConfigurationError

# Mamba2's step-size initialisation: dt log-uniform in [DT_MIN, DT_MAX], stored through softplus.
DT_MIN, DT_MAX = 1e-3, 1e-1


def replaced_layers(spec: str, num_layers: int) -> list[int]:
    """The decoder layers to replace, from `spec`: a fraction ("1/2": every second layer, "1/4": one in
    four), "none", or a comma-separated list of layer indices ("3,7,11").

    Fractions replace evenly spaced layers and keep the first layer attention (the layer that sees the
    raw embeddings is the hardest to replace): "1/2" replaces 1, 3, 5, ...; "1/4" replaces 2, 6, 10, ...
    """
    text = spec.strip()
    if text == "none":
        return []
    if "/" in text:
        try:
            fraction = Fraction(text)
        except (ValueError, ZeroDivisionError):
            fraction = None
        if fraction is None or fraction.numerator != 1 or fraction.denominator < 2:
            raise ConfigurationError(f"layer ratio '{spec}' must be 1/K with K >= 2 (e.g. 1/2 or 1/4)")
        every = fraction.denominator
        return [i for i in range(num_layers) if i % every == every // 2]
    try:
        layers = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ConfigurationError(f"layers '{spec}' must be 1/K, 'none' or a list of layer indices "
                                 "such as 3,7,11") from None
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad or not layers:
        raise ConfigurationError(f"layers '{spec}': indices must lie in 0..{num_layers - 1} "
                                 f"(got {bad or 'none'})")
    return layers


def hybrid_config(llama_config, mamba_layers: list[int]):
    """A GraniteMoeHybrid config computing the same function as `llama_config` where layers are attention,
    with Mamba2 mixers (one group per query head, state = head width) at `mamba_layers`."""
    from transformers import GraniteMoeHybridConfig

    c = llama_config
    _check_llama(c)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    heads = c.num_attention_heads
    if heads * head_dim != c.hidden_size:
        raise ConfigurationError(f"{c.model_type}: heads x head width ({heads} x {head_dim}) must equal the "
                                 f"hidden size ({c.hidden_size}) for the mixer to map the attention heads")
    layer_types = ["linear_attention" if i in set(mamba_layers) else "full_attention"
                   for i in range(c.num_hidden_layers)]
    return GraniteMoeHybridConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=heads, num_key_value_heads=c.num_key_value_heads, hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings, rope_parameters=dict(c.rope_parameters),
        position_embedding_type="rope", attention_bias=False,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id,
        # A Llama: no experts, a dense SwiGLU MLP, no muP multipliers, attention scaled by 1/sqrt(d).
        num_local_experts=0, shared_intermediate_size=c.intermediate_size, embedding_multiplier=1.0,
        residual_multiplier=1.0, logits_scaling=1.0, attention_multiplier=1.0 / math.sqrt(head_dim),
        layer_types=layer_types, mamba_n_heads=heads, mamba_d_head=head_dim, mamba_n_groups=heads,
        mamba_d_state=head_dim, mamba_expand=1, mamba_d_conv=4, mamba_chunk_size=256,
        mamba_conv_bias=True, mamba_proj_bias=False,
    )


def _check_llama(config) -> None:
    if config.model_type != "llama":
        raise ConfigurationError(f"the hybrid conversion maps Llama-architecture models (SmolLM2, Llama); "
                                 f"this model is '{config.model_type}'")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ConfigurationError("the hybrid conversion maps Llama layers without biases; this one has some")


def convert(llama: torch.nn.Module, mamba_layers: list[int], *, seed: int = 0) -> torch.nn.Module:
    """The hybrid of `llama` (a LlamaForCausalLM) with `mamba_layers` replaced, in float32 on the CPU
    (move it with `.to(device)`). Everything but the replaced mixers is copied; those start from the
    attention they replace."""
    from transformers import GraniteMoeHybridForCausalLM

    config = hybrid_config(llama.config, mamba_layers)
    torch.manual_seed(seed)  # the gate and step-size rows that have no attention counterpart
    hybrid = GraniteMoeHybridForCausalLM(config).float().eval()
    source = llama.model
    target = hybrid.model
    with torch.no_grad():
        target.embed_tokens.weight.copy_(source.embed_tokens.weight)
        target.norm.weight.copy_(source.norm.weight)
        if not config.tie_word_embeddings:
            hybrid.lm_head.weight.copy_(llama.lm_head.weight)
        for index, (old, new) in enumerate(zip(source.layers, target.layers)):
            new.input_layernorm.weight.copy_(old.input_layernorm.weight)
            new.post_attention_layernorm.weight.copy_(old.post_attention_layernorm.weight)
            mlp = old.mlp
            new.shared_mlp.input_linear.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            new.shared_mlp.output_linear.weight.copy_(mlp.down_proj.weight)
            if index in mamba_layers:
                init_mixer_from_attention(new.mamba, old.self_attn, config.num_key_value_heads)
            else:
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(new.self_attn, name).weight.copy_(getattr(old.self_attn, name).weight)
    return hybrid


def init_mixer_from_attention(mixer: torch.nn.Module, attention: torch.nn.Module, kv_heads: int) -> None:
    """Start a Mamba2 mixer from an attention layer (MambaInLlama): x from V, B from K, C from Q, the
    output projection from O; the convolution as the identity; z, dt and A as Mamba2 starts them."""
    heads, head_dim = mixer.num_heads, mixer.head_dim
    repeat = heads // kv_heads  # query heads per key/value head
    wq = attention.q_proj.weight  # (heads * d, hidden)
    wk = attention.k_proj.weight.view(kv_heads, head_dim, -1)  # (kv, d, hidden)
    wv = attention.v_proj.weight.view(kv_heads, head_dim, -1)
    x_rows = wv.repeat_interleave(repeat, dim=0).reshape(heads * head_dim, -1)  # (heads * d, hidden)
    b_rows = wk.repeat_interleave(repeat, dim=0).reshape(heads * head_dim, -1)  # one group per query head
    inner = mixer.intermediate_size
    proj = mixer.in_proj.weight  # rows: z | x | B | C (each `inner`: groups x state = heads x d) | dt (heads)
    proj[inner:2 * inner].copy_(x_rows)
    proj[2 * inner:3 * inner].copy_(b_rows)
    proj[3 * inner:4 * inner].copy_(wq)
    mixer.out_proj.weight.copy_(attention.o_proj.weight)
    conv = mixer.conv1d.weight  # (channels, 1, width): the last tap sees the current token
    conv.zero_()
    conv[:, 0, -1] = 1.0
    mixer.conv1d.bias.zero_()
    dt = torch.exp(torch.rand(heads) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
    mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
    mixer.A_log.copy_(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))
    mixer.D.fill_(1.0)
    mixer.norm.weight.fill_(1.0)

