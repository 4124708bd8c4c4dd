"""EAGLE heads written by hand in the layouts the engines load (SafeAILab's EAGLE-1/2, EAGLE-3), and a plain
reference forward of each form, so that the plugin's loader and head are checked against the published
key names and equations rather than against themselves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

import specframe


def sizes(target: specframe.Target) -> dict:
    c = target.config
    hidden = c.hidden_size
    heads = c.num_attention_heads
    return {"H": hidden, "nh": heads, "nkv": c.num_key_value_heads, "hd": hidden // heads,
            "I": c.intermediate_size, "V": target.model.get_input_embeddings().weight.shape[0]}


def _layer(prefix: str, s: dict, width: int, gen: torch.Generator, scale: float, first: bool) -> dict:
    def rand(*shape):
        return torch.randn(*shape, generator=gen) * scale

    def norm():
        return 1.0 + 0.1 * torch.randn(s["H"], generator=gen)

    out = {f"{prefix}self_attn.q_proj.weight": rand(s["nh"] * s["hd"], width),
           f"{prefix}self_attn.k_proj.weight": rand(s["nkv"] * s["hd"], width),
           f"{prefix}self_attn.v_proj.weight": rand(s["nkv"] * s["hd"], width),
           f"{prefix}self_attn.o_proj.weight": rand(s["H"], s["nh"] * s["hd"]),
           f"{prefix}mlp.gate_proj.weight": rand(s["I"], s["H"]),
           f"{prefix}mlp.up_proj.weight": rand(s["I"], s["H"]),
           f"{prefix}mlp.down_proj.weight": rand(s["H"], s["I"]),
           f"{prefix}post_attention_layernorm.weight": norm()}
    if not first:
        out[f"{prefix}input_layernorm.weight"] = norm()
    return out


def llama_config(target: specframe.Target, **extra) -> dict:
    s = sizes(target)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s["H"],
            "intermediate_size": s["I"], "num_attention_heads": s["nh"], "num_key_value_heads": s["nkv"],
            "num_hidden_layers": 1, "vocab_size": s["V"], "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "rope_theta": 10000.0, "max_position_embeddings": 512, **extra}


def eagle1_tensors(target: specframe.Target, seed: int = 0, layers: int = 1, scale: float = 0.2,
                   embed: bool = True) -> dict:
    """SafeAILab's EAGLE-1/2 keys: fc (with bias), layers.{i}.*, the first layer without input_layernorm,
    and a copy of the target's embedding as `embed_tokens.weight`."""
    s = sizes(target)
    gen = torch.Generator().manual_seed(seed)
    tensors = {"fc.weight": torch.randn(s["H"], 2 * s["H"], generator=gen) * scale,
               "fc.bias": torch.randn(s["H"], generator=gen) * 0.01}
    for i in range(layers):
        tensors |= _layer(f"layers.{i}.", s, s["H"], gen, scale, first=i == 0)
    if embed:
        tensors["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone()
    return tensors


def eagle3_tensors(target: specframe.Target, draft_ids: list[int], seed: int = 0, scale: float = 0.2,
                   prefix: str = "midlayer.") -> dict:
    """EAGLE-3 keys: fc (3H -> H, no bias), midlayer.* (attention over 2H), norm, lm_head over the draft
    vocabulary, d2t (draft -> target offsets) and t2d (target -> in the draft vocabulary)."""
    s = sizes(target)
    gen = torch.Generator().manual_seed(seed)
    tensors = {"fc.weight": torch.randn(s["H"], 3 * s["H"], generator=gen) * scale,
               "norm.weight": 1.0 + 0.1 * torch.randn(s["H"], generator=gen),
               "lm_head.weight": torch.randn(len(draft_ids), s["H"], generator=gen)}
    tensors |= _layer(prefix, s, 2 * s["H"], gen, scale, first=True)
    tensors[f"{prefix}hidden_norm.weight"] = 1.0 + 0.1 * torch.randn(s["H"], generator=gen)
    tensors[f"{prefix}input_layernorm.weight"] = 1.0 + 0.1 * torch.randn(s["H"], generator=gen)
    ids = torch.tensor(draft_ids)
    tensors["d2t"] = ids - torch.arange(len(ids))
    t2d = torch.zeros(s["V"], dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    return tensors


def write_head(directory: Path, config: dict, tensors: dict, name: str = "model.safetensors") -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / name))
    return directory


def eagle1_head(directory: Path, target: specframe.Target, **options) -> Path:
    layers = options.get("layers", 1)
    config = llama_config(target, num_hidden_layers=layers)
    return write_head(directory, config, eagle1_tensors(target, **options))


def eagle3_head(directory: Path, target: specframe.Target, draft_ids: list[int], layer_ids: list[int],
                **options) -> Path:
    config = llama_config(target, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=len(draft_ids),
                          eagle_config={"eagle_aux_hidden_state_layer_ids": layer_ids})
    return write_head(directory, config, eagle3_tensors(target, draft_ids, **options))


# --- the reference forward: the published equations, one op at a time, no cache --------------------------

def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x, positions, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions[:, None].float() * inv[None]  # (T, d/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


def _attention(x, t, p, s, positions):
    T = x.shape[0]
    q = (x @ t[p + "self_attn.q_proj.weight"].T).view(T, s["nh"], s["hd"]).transpose(0, 1)
    k = (x @ t[p + "self_attn.k_proj.weight"].T).view(T, s["nkv"], s["hd"]).transpose(0, 1)
    v = (x @ t[p + "self_attn.v_proj.weight"].T).view(T, s["nkv"], s["hd"]).transpose(0, 1)
    q, k = _rotate(q, positions), _rotate(k, positions)
    rep = s["nh"] // s["nkv"]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(s["hd"])
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, -1)
    return out @ t[p + "self_attn.o_proj.weight"].T


def _mlp(x, t, p):
    gate = x @ t[p + "mlp.gate_proj.weight"].T
    inner = torch.nn.functional.silu(gate) * (x @ t[p + "mlp.up_proj.weight"].T)
    return inner @ t[p + "mlp.down_proj.weight"].T


def reference_eagle1(tensors: dict, target, embeds: torch.Tensor, features: torch.Tensor,
                     layers: int = 1) -> torch.Tensor:
    """(T, H) embeddings e(t_{j+1}), (T, H) features f_j at positions 0..T-1 -> (T, H) predicted features."""
    s = sizes(target)
    x = torch.cat([embeds, features], -1) @ tensors["fc.weight"].T + tensors["fc.bias"]
    positions = torch.arange(len(x))
    for i in range(layers):
        p = f"layers.{i}."
        h = x if i == 0 else _rms(x, tensors[p + "input_layernorm.weight"])
        x = x + _attention(h, tensors, p, s, positions)
        x = x + _mlp(_rms(x, tensors[p + "post_attention_layernorm.weight"]), tensors, p)
    return x


def reference_eagle3(tensors: dict, target, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """(T, H) embeddings, (T, 3H) target features -> (T, H) the midlayer's output (before `norm`)."""
    s, p = sizes(target), "midlayer."
    h = features @ tensors["fc.weight"].T
    residual = h
    joined = torch.cat([_rms(embeds, tensors[p + "input_layernorm.weight"]),
                        _rms(h, tensors[p + "hidden_norm.weight"])], -1)
    x = residual + _attention(joined, tensors, p, s, torch.arange(len(h)))
    return x + _mlp(_rms(x, tensors[p + "post_attention_layernorm.weight"]), tensors, p)


def oracle_eagle1(directory: Path, target: specframe.Target, feature_weight: float = 0.02) -> Path:
    """An EAGLE head that nearly is a one-layer target: `fc` passes the token embedding on (plus a little of
    the feature, so that the features still matter), a first layer that changes nothing (zero output
    projections), then a copy of the target's layer. It predicts the target's next token from the
    tokens it has read, all but the very first, so drafts get accepted often and every code path of a
    step (accepted paths, rollback) runs."""
    s = sizes(target)
    assert target.config.num_hidden_layers == 1
    eye = torch.eye(s["H"])
    tensors = {"fc.weight": torch.cat([eye, feature_weight * eye], 1)}
    gen = torch.Generator().manual_seed(0)
    tensors |= _layer("layers.0.", s, s["H"], gen, 0.2, first=True)
    tensors["layers.0.self_attn.o_proj.weight"] = torch.zeros(s["H"], s["nh"] * s["hd"])
    tensors["layers.0.mlp.down_proj.weight"] = torch.zeros(s["H"], s["I"])
    own = target.model.model.layers[0].state_dict()
    tensors |= {f"layers.1.{name}": value.detach().clone() for name, value in own.items()}
    return write_head(directory, llama_config(target, num_hidden_layers=2), tensors)
