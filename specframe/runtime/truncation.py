"""A target's first decoder layers as a smaller causal LM that shares the target's weights: the draft model
of self-speculation (the `draft-model(layers=N)` drafter, the bench's `hf-assisted` peer)."""

from __future__ import annotations

import copy

from torch import nn

from specframe.terms.errors import ConfigurationError, UnsupportedModelError
from specframe.terms.target import Target


def truncated_model(target: Target, layers: int, who: str = "truncated model") -> nn.Module:
    """A causal LM of the target's first `layers` decoder layers, final norm and LM head.

    Every module is the target's own (nothing is copied, no memory is allocated) and the target is left
    whole; the copy has its own config (`num_hidden_layers = layers`) and generation config. `who` names
    the caller in error messages.
    """
    model = target.model
    blocks = getattr(model.base_model, "layers", None)
    if not isinstance(blocks, nn.ModuleList):
        raise UnsupportedModelError(f"{who}: cannot cut model '{target.name}' into a draft model: its base "
                                    "model has no `layers` list of decoder layers")
    total = len(blocks)
    if not 1 <= layers < total:
        raise ConfigurationError(f"{who}: layers must be in [1, {total - 1}] for model '{target.name}' "
                                 f"({total} layers), got {layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    base = copy.copy(model.base_model)  # shallow: shares every weight with the target
    base._modules = dict(base._modules)
    base.layers = nn.ModuleList(list(blocks)[:layers])
    base.config = config
    draft = copy.copy(model)
    draft._modules = dict(draft._modules)
    draft._modules[model.base_model_prefix] = base
    draft.config = config
    draft.generation_config = copy.deepcopy(model.generation_config)  # callers may tune their copy
    return draft
