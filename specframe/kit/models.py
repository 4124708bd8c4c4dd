"""Model internals a drafter or backend reuses to run the target's weights as specframe runs them: packed
linear layers, the linear kernel in use, native bfloat16, and truncated copies of the target.

- `linear_kernel(model)` says how `model`'s linear layers multiply ("stream", "onednn" or "torch"): a key
  of measured step costs, and what a drafter that shares the target's layers should match.
- `PackedLinear` and `pack_linear_layers(model, bfloat16=..., exact_rows=...)` multiply by oneDNN-packed
  weights where that computes the same function, so a drafter's own layers (s4c's heads) run as fast
  as the target's.
- `native_bfloat16()` says whether this CPU multiplies bfloat16 natively, so drafting in bfloat16 halves
  the bytes read at no loss of speed.
- `truncated_model(target, layers)` is a causal LM of the target's first layers, sharing its modules (no
  memory allocated): a draft model that needs no download.

Imports torch: import it inside the methods that build or run a model, never at a plugin module's top.
"""

from specframe.runtime.packed_linear import PackedLinear, linear_kernel, native_bfloat16, pack_linear_layers
from specframe.runtime.truncation import truncated_model

__all__ = ["PackedLinear", "linear_kernel", "native_bfloat16", "pack_linear_layers", "truncated_model"]
