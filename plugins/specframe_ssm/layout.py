"""What a model is made of, as far as the SSM backends care: its Mamba2 mixers, its attention layers and
how its forward takes the cache. Detected from the modules and `config.layer_types`, never configured.

Recurrent layers are told apart by module class (`layer_kind`): transformers types them all
"linear_attention" (Mamba-1, Mamba2, gated DeltaNet, Kimi delta attention alike), and several of them
carry an `A_log` parameter. Mamba2 mixers run in the tree scan, gated DeltaNet layers (Qwen3-Next,
OLMo-hybrid) and Kimi delta attention in the tree delta rule, Mamba-1 mixers (Mamba, FalconMamba, Jamba)
in the tree selective scan and LFM2's short convs in the tree conv; a refusal of any other names what
the layer is.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

# Attributes every transformers Mamba2-type mixer has (Mamba2, Bamba, NemotronH, GraniteMoeHybrid, Zamba2).
MIXER_ATTRIBUTES = ("in_proj", "conv1d", "dt_bias", "A_log", "D", "norm", "out_proj", "num_heads", "head_dim",
                    "n_groups", "ssm_state_size", "intermediate_size", "conv_dim", "conv_kernel_size",
                    "time_step_limit", "layer_idx")
# The Mamba2-type mixer classes whose tree forward the test-suite proves equal to the model's own forward
# (tests/plugins/ssm/test_ssm_backends.py: Mamba2, Bamba, NemotronH, GraniteMoeHybrid, Falcon-H1, Zamba2).
MAMBA2_MIXERS = ("Mamba2Mixer", "BambaMixer", "NemotronHMamba2Mixer", "GraniteMoeHybridMambaLayer",
                 "FalconH1Mixer", "Zamba2MambaMixer")
# Mixers with extra scaling inside the mixer: the tree forward reproduces it for these classes only.
EXTRA_SCALING = ("mup_vector", "ssm_in_multiplier")
SCALED_MIXERS = ("FalconH1Mixer",)
# "hybrid" layers hold a Mamba2 mixer and attention in the same layer: in parallel (Falcon-H1), or a
# shared attention block before the Mamba layer (Zamba2). One cache layer holds both the conv/SSM states
# and the keys/values; the attention sees the tree through the mask like any other.
PARALLEL_TYPE = "hybrid"
PARALLEL_MIXERS = ("FalconH1Mixer", "Zamba2MambaMixer")
# Attributes the gated DeltaNet tree forward reads (specframe_ssm.gated_deltanet), and the classes it serves.
DELTA_ATTRIBUTES = ("conv1d", "conv_dim", "conv_kernel_size", "activation", "layer_idx")
GATED_DELTANET_CLASSES = ("Qwen3NextGatedDeltaNet", "OlmoHybridGatedDeltaNet", "KimiLinearDeltaAttention")
# Attributes the Mamba-1 tree forward reads (specframe_ssm.selective_scan).
SELECTIVE_ATTRIBUTES = ("in_proj", "conv1d", "x_proj", "dt_proj", "A_log", "D", "out_proj", "time_step_rank",
                        "ssm_state_size", "intermediate_size", "conv_kernel_size", "activation", "layer_idx")
ATTENTION_TYPES = {"full_attention"}
STATELESS_TYPES = {"mlp", "moe"}  # blocks without a cache (NemotronH)
SSM_TYPE = "linear_attention"
RECURRENT_TYPES = {SSM_TYPE, "conv"}  # "conv": LFM2's short convolutions
SHORT_CONV_CLASSES = ("Lfm2ShortConv", "Lfm2MoeShortConv")
SHORT_CONV_ATTRIBUTES = ("in_proj", "conv", "out_proj", "conv_kernel_size", "layer_idx")

# Kinds of recurrent layer (see `layer_kind`).
MAMBA2, MAMBA1, DELTA_RULE, SHORT_CONV, OTHER = "mamba2", "mamba1", "delta-rule", "short-conv", "other"
MAMBA1_MIXERS = ("MambaMixer", "FalconMambaMixer", "JambaMambaMixer")
DELTA_RULE_MARKS = ("DeltaNet", "DeltaAttention")  # Qwen3NextGatedDeltaNet, KimiLinearDeltaAttention
NO_BACKEND = "no backend serves it yet"
# The refusal of a model without recurrent layers; the backend adds whether 'kv' serves it.
NO_RECURRENT = ("it has no Mamba2 layers, nor any other recurrent layer ssm-tree serves (Mamba-1, gated "
                "DeltaNet, LFM2 short convolutions)")
# What each kind other than Mamba2 is ({cls}: its module class) and why neither 'kv' nor 'ssm-tree' serves it.
UNSERVED = {
    MAMBA1: ("a Mamba-1 selective scan ({cls})",
             "its decay A (shape {shape}) is laid out per head and channel, unlike the Mamba, FalconMamba "
             "and Jamba mixers the Mamba-1 tree scan (ssm-tree) serves, and cropping a KV cache (kv) cannot "
             "roll its state back"),
    DELTA_RULE: ("a gated delta-rule linear attention ({cls})",
                 "its class is not one of the delta-rule layers whose projections the tree delta rule "
                 "(ssm-tree) knows ({served}), and cropping a KV cache (kv) cannot roll its matrix state "
                 "back"),
    SHORT_CONV: ("a gated short convolution ({cls})",
                 "its class is not one of the LFM2 short convolutions whose tree form ssm-tree has "
                 "({served}), and cropping a KV cache (kv) cannot roll its conv window back"),
    OTHER: ("a recurrent layer of type {cls}",
            "neither cropping a KV cache (kv) nor the Mamba2 tree scan (ssm-tree) handles its state"),
}


@dataclass
class ModelLayout:
    """The recurrent layers (by cache layer index) and their kinds, the attention layer indices and the
    cache keyword."""

    mixers: dict[int, torch.nn.Module]  # Mamba2, gated DeltaNet and Mamba-1 layers
    attention: list[int]
    cache_kwarg: str  # "cache_params" (Mamba2ForCausalLM) or "past_key_values" (hybrids)
    takes_positions: bool
    kinds: dict[int, str]  # layer index -> MAMBA2, DELTA_RULE or MAMBA1

    @property
    def hybrid(self) -> bool:
        return bool(self.attention)


def _decay_parameter(module: torch.nn.Module) -> torch.Tensor | None:
    """The module's `A_log`, or that of a gate child (KimiLinearForgetGate in its attention); else None."""
    a_log = getattr(module, "A_log", None)
    if isinstance(a_log, torch.Tensor):
        return a_log
    for child in module.children():
        if type(child).__name__.endswith("Gate") and isinstance(getattr(child, "A_log", None), torch.Tensor):
            return child.A_log
    return None


def layer_kind(module: torch.nn.Module) -> str | None:
    """The kind of recurrent layer `module` is, from its class (and `A_log` rank); None if it is not one.

    The class name decides first because other layers carry an `A_log` too: a 1-D one (a decay per head)
    makes a Mamba2 mixer only in a class named like a Mamba mixer.
    """
    cls = type(module).__name__
    if cls in MAMBA1_MIXERS:
        return MAMBA1
    if any(mark in cls for mark in DELTA_RULE_MARKS):
        return DELTA_RULE
    if cls.endswith("ShortConv"):  # Lfm2ShortConv, Lfm2MoeShortConv
        return SHORT_CONV
    a_log = _decay_parameter(module)
    if a_log is None:
        return None
    if "Mamba" in cls or "Mixer" in cls:
        return MAMBA2 if a_log.dim() == 1 else MAMBA1  # ZambaMambaMixer: a per-channel A for each head
    return OTHER


def recurrent_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, module, kind) of every module that owns a recurrent state, outermost only."""
    layers: list[tuple[str, torch.nn.Module, str]] = []
    for name, module in model.named_modules():
        if any(name.startswith(outer + ".") for outer, _, _ in layers):
            continue  # inside a layer already found
        kind = layer_kind(module)
        if kind is not None:
            layers.append((name, module, kind))
    return layers


# Kinds other than Mamba2: the module classes with a tree form, and (attributes that tree form reads,
# what a refusal calls it).
SERVED_CLASSES = {DELTA_RULE: GATED_DELTANET_CLASSES, MAMBA1: MAMBA1_MIXERS, SHORT_CONV: SHORT_CONV_CLASSES}
TREE_FORMS = {DELTA_RULE: (DELTA_ATTRIBUTES, "gated DeltaNet layer the tree delta rule"),
              MAMBA1: (SELECTIVE_ATTRIBUTES, "Mamba-1 mixer the tree selective scan"),
              SHORT_CONV: (SHORT_CONV_ATTRIBUTES, "short convolution the tree conv")}


def served(module: torch.nn.Module, kind: str) -> bool:
    """Whether `ssm-tree` has a tree form for this layer: a Mamba2 mixer, or a gated DeltaNet, Mamba-1 or
    short-conv layer of a class it knows."""
    cls = type(module).__name__
    return kind == MAMBA2 or cls in SERVED_CLASSES.get(kind, ())


def _state_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """The recurrent layers `ssm-tree` serves, by module name, with their kinds."""
    return [(name, m, kind) for name, m, kind in recurrent_layers(model) if served(m, kind)]


def _unserved_reason(name: str, module: torch.nn.Module, kind: str) -> str:
    """What a recurrent layer without a tree form is, and why no backend serves it yet."""
    what, why = UNSERVED[kind]
    fields = dict(cls=type(module).__name__, shape=tuple(getattr(module, "A_log", torch.empty(0)).shape),
                  served=", ".join(SERVED_CLASSES.get(kind, ())))
    return f"layer '{name}' is {what.format(**fields)}; {NO_BACKEND}: {why.format(**fields)}"


def _layer_reason(name: str, module: torch.nn.Module, kind: str) -> str | None:
    """Why a non-Mamba2 layer of a served class cannot run in its tree forward, or None when it can."""
    wanted, what = TREE_FORMS[kind]
    missing = [a for a in wanted if not hasattr(module, a)]
    if missing:
        return (f"layer '{name}' ({type(module).__name__}) is not the {what} knows: it lacks {missing}; "
                f"{NO_BACKEND}")
    return None


def _mixer_reason(name: str, module: torch.nn.Module) -> str | None:
    """Why a Mamba2-type mixer cannot run in the tree forward, or None when it can."""
    kind = type(module).__name__
    missing = [a for a in MIXER_ATTRIBUTES if not hasattr(module, a)]
    if missing:
        return f"layer '{name}' ({kind}) is not a recognised Mamba2 mixer: it lacks {missing}; {NO_BACKEND}"
    extra = [a for a in EXTRA_SCALING if hasattr(module, a)]
    if extra and kind not in SCALED_MIXERS:
        return (f"layer '{name}' ({kind}) scales its SSM inputs ({extra}), which the tree scan does not do; "
                f"{NO_BACKEND}")
    if kind not in MAMBA2_MIXERS:
        return (f"layer '{name}' ({kind}) is a Mamba2-type mixer of a class the tree scan has not been "
                f"verified on (verified: {', '.join(MAMBA2_MIXERS)}); {NO_BACKEND}")
    return None


def _no_recurrent_module_reason(layer_types: list[str]) -> str:
    """The refusal of a model without a recognised recurrent module: attention-only, or of an unknown kind."""
    recurrent = sorted(set(layer_types) - ATTENTION_TYPES - STATELESS_TYPES - {"sliding_attention"})
    if recurrent:  # MiniMax lightning attention, RecurrentGemma's RG-LRU: typed, but no module we know
        return (f"its layers of type {recurrent} hold no recurrent module the tree scan recognises; "
                f"{NO_BACKEND}")
    return NO_RECURRENT


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the SSM backends cannot run `model`, naming the offending layer and what it is; None when they can.

    A backend states its own reason only: which other backend serves the model, if any, is added where a
    pipeline refuses one (the registry asks every backend: `PluginRegistry.backends_for`). A model without
    recurrent layers gets `NO_RECURRENT`.
    """
    layers = recurrent_layers(model)
    for name, module, kind in layers:
        if kind == MAMBA2:
            reason = _mixer_reason(name, module)
        elif served(module, kind):
            reason = _layer_reason(name, module, kind)
        else:
            reason = _unserved_reason(name, module, kind)
        if reason:
            return reason
    layer_types = list(getattr(model.config, "layer_types", None) or [])
    if not layers:
        return _no_recurrent_module_reason(layer_types)
    parallel = all(type(m).__name__ in PARALLEL_MIXERS for _, m, _ in layers)
    unknown = sorted(set(layer_types) - ATTENTION_TYPES - STATELESS_TYPES - RECURRENT_TYPES
                     - ({PARALLEL_TYPE} if parallel else set()))
    if unknown:
        return (f"its layer types {unknown} are not supported "
                f"(only Mamba2, Mamba-1, gated DeltaNet, LFM2 short conv, full attention, MLP and MoE "
                f"blocks); {NO_BACKEND}")
    ssm_layers = [i for i, t in enumerate(layer_types) if t in RECURRENT_TYPES or t == PARALLEL_TYPE]
    if sorted(m.layer_idx for _, m, _ in layers) != ssm_layers:
        return ("its recurrent layers do not match config.layer_types one to one "
                f"(shared or parallel blocks are not supported); {NO_BACKEND}")
    return None


def inspect_layout(model: torch.nn.Module) -> ModelLayout:
    """The layout of a model that `unsupported_reason` accepted."""
    layer_types = list(model.config.layer_types)
    found = _state_modules(model)
    mixers = {m.layer_idx: m for _, m, _ in found}
    params = inspect.signature(model.forward).parameters
    cache_kwarg = "past_key_values" if "past_key_values" in params else "cache_params"
    return ModelLayout(mixers=mixers,
                       attention=[i for i, t in enumerate(layer_types)
                                  if t in ATTENTION_TYPES or t == PARALLEL_TYPE],
                       cache_kwarg=cache_kwarg, takes_positions="position_ids" in params,
                       kinds={m.layer_idx: kind for _, m, kind in found})
