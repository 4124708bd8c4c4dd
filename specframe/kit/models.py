"""Model internals a drafter or backend reuses to run the target's weights as specframe runs them: packed
linear layers, the linear kernel in use, native bfloat16, and truncated copies of the target.

- `linear_kernel(model)` says how `model`'s linear layers multiply ("stream", "onednn" or "torch"): a key
  of measured step costs, and what a drafter that shares the target's layers should match.
- `PackedLinear` and `pack_linear_layers(model, bfloat16=..., exact_rows=...)` multiply by oneDNN-packed
  weights where that computes the same function, so a drafter's own layers (s4c's heads) run as fast
  as the target's.
- `native_bfloat16()` says whether this CPU multiplies bfloat16 natively, so drafting in bfloat16 halves
  the bytes read at no loss of speed; `drafting_dtype(choice, target, who)` is what a drafter's `dtype`
  option (`specframe.kit.drafting.DraftDtype`) asks for on a target.
- `truncated_model(target, layers)` is a causal LM of the target's first layers, sharing its modules (no
  memory allocated): a draft model that needs no download.

Imports torch: import it inside the methods that build or run a model, never at a plugin module's top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, get_args

from specframe.kit.drafting import DraftDtype
from specframe.runtime.packed_linear import PackedLinear, linear_kernel, native_bfloat16, pack_linear_layers
from specframe.runtime.truncation import truncated_model

if TYPE_CHECKING:
    import torch

__all__ = ["PackedLinear", "drafting_dtype", "linear_kernel", "native_bfloat16",
           "pack_linear_layers", "truncated_model"]


def drafting_dtype(choice: str, target, who: str) -> torch.dtype:
    """The dtype a drafter's `dtype` option asks for on `target`: `auto` is bfloat16 where the target runs
    on packed float32 weights (the CPU default) and the CPU multiplies bfloat16 natively, else the
    target's own; `target` the target's own; `bfloat16` bfloat16. A draft only decides what is proposed,
    so it needs no float32 accuracy; the drafter `who` names itself in the error."""
    import torch

    from specframe.terms.errors import ConfigurationError

    if choice not in get_args(DraftDtype):
        raise ConfigurationError(f"{who}: dtype must be one of {', '.join(map(repr, get_args(DraftDtype)))}, "
                                 f"got {choice!r}")
    own = next(target.model.parameters()).dtype
    if choice == "bfloat16" or (choice == "auto" and linear_kernel(target.model) != "torch"
                                and native_bfloat16()):
        return torch.bfloat16
    return own
