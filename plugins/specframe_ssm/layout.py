"""What a model is made of, as far as the SSM backends care: its Mamba2 mixers, its attention layers and
how its forward takes the cache. Detected from the modules and `config.layer_types`, never configured.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

# Attributes every transformers Mamba2-type mixer has (Mamba2, Bamba, NemotronH, GraniteMoeHybrid, Zamba2).
MIXER_ATTRIBUTES = ("in_proj", "conv1d", "dt_bias", "A_log", "D", "norm", "out_proj", "num_heads", "head_dim",
                    "n_groups", "ssm_state_size", "intermediate_size", "conv_dim", "conv_kernel_size",
                    "time_step_limit", "layer_idx")
# Mixers with extra scaling inside the mixer that the tree forward does not reproduce.
EXTRA_SCALING = ("mup_vector", "ssm_in_multiplier")
ATTENTION_TYPES = {"full_attention"}
STATELESS_TYPES = {"mlp", "moe"}  # blocks without a cache (NemotronH)
SSM_TYPE = "linear_attention"


@dataclass
class ModelLayout:
    """The Mamba2 mixers (by cache layer index), the attention layer indices and the cache keyword."""

    mixers: dict[int, torch.nn.Module]
    attention: list[int]
    cache_kwarg: str  # "cache_params" (Mamba2ForCausalLM) or "past_key_values" (hybrids)
    takes_positions: bool

    @property
    def hybrid(self) -> bool:
        return bool(self.attention)


def _state_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Modules holding an SSM (an `A_log` parameter): Mamba-1 and Mamba2 mixers alike."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(getattr(m, "A_log", None), torch.Tensor)]


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the SSM backends cannot run `model`, naming the offending layer; None when they can."""
    config = model.config
    layer_types = list(getattr(config, "layer_types", None) or [])
    for name, module in _state_modules(model):
        kind = type(module).__name__
        if module.A_log.dim() != 1:
            return (f"layer '{name}' is a {kind} with a Mamba-1 selective scan (A of shape "
                    f"{tuple(module.A_log.shape)}, per channel); the tree scan supports Mamba2 mixers only "
                    "(per-head scalar A)")
        missing = [a for a in MIXER_ATTRIBUTES if not hasattr(module, a)]
        if missing:
            return f"layer '{name}' ({kind}) is not a recognised Mamba2 mixer: it lacks {missing}"
        extra = [a for a in EXTRA_SCALING if hasattr(module, a)]
        if extra:
            return f"layer '{name}' ({kind}) scales its SSM inputs ({extra}), which the tree scan does not do"
    mixers = [m for _, m in _state_modules(model)]
    if not mixers:
        return "it has no Mamba2 layers; use the 'kv' backend for attention-only models"
    unknown = sorted(set(layer_types) - ATTENTION_TYPES - STATELESS_TYPES - {SSM_TYPE})
    if unknown:
        return (f"its layer types {unknown} are not supported "
                "(only Mamba2, full attention, MLP and MoE blocks)")
    ssm_layers = [i for i, t in enumerate(layer_types) if t == SSM_TYPE]
    if sorted(m.layer_idx for m in mixers) != ssm_layers:
        return ("its Mamba2 mixers do not match config.layer_types one to one "
                "(shared or parallel blocks are not supported)")
    return None


def inspect_layout(model: torch.nn.Module) -> ModelLayout:
    """The layout of a model that `unsupported_reason` accepted."""
    layer_types = list(model.config.layer_types)
    mixers = {m.layer_idx: m for _, m in _state_modules(model)}
    params = inspect.signature(model.forward).parameters
    cache_kwarg = "past_key_values" if "past_key_values" in params else "cache_params"
    return ModelLayout(mixers=mixers,
                       attention=[i for i, t in enumerate(layer_types) if t in ATTENTION_TYPES],
                       cache_kwarg=cache_kwarg, takes_positions="position_ids" in params)
