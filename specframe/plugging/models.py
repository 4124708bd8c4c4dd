"""Targets loaded by any name, the model aliases of the installed plugins included: `specframe.load_target`.

The loader itself (`specframe.runtime.load.load_target`) sits below the registry and knows the plugins'
aliases only through the `recipes` it is given; this module gives it the registry's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specframe.plugging.registry import get_registry
from specframe.runtime import load
from specframe.runtime.load import DEFAULT_MODEL

if TYPE_CHECKING:
    import torch

    from specframe.contract.extensions import ModelRecipe
    from specframe.terms.target import Target


def model_recipes() -> dict[str, ModelRecipe]:
    """The model aliases that plugins build on first use (`register_models`), by name; loads the plugins.
    Pass the function itself as `recipes=` to `specframe.runtime.load`, which calls it only when a name is
    none of the other forms."""
    return dict(get_registry().models.items())


def load_target(name: str = DEFAULT_MODEL, *, device: str | torch.device = "auto",
                dtype: str | torch.dtype = "auto") -> Target:
    """Load a target model and its tokenizer onto `device` in `dtype`: `name` is a directory, a `.gguf`
    file, an alias (the plugins' too) or a Hugging Face model id. See `specframe.runtime.load.load_target`,
    which this calls with the registry's `model_recipes`."""
    return load.load_target(name, device=device, dtype=dtype, recipes=model_recipes)
