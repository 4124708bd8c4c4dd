"""For drafter, tree builder and verifier authors: how drafts are drawn, the draw order that keeps
sampled trees lossless, the greedy token, and what stored token ids mean.

- `DraftDraw` is the `draw` option of drafters with real probabilities; `check_draw(component, draw)`
  validates it at construction and `samples_drafts(draw, sampler)` says whether this request samples
  its drafts (so `rejection` can accept them with probability min(1, p/q)) or takes the top k.
- `SAMPLED_DRAWS` are the draw methods of sampled proposals; a tree builder keeps their nodes with
  `draw_order_prefix(proposal, budget, allowed)`, a prefix of each node's children in draw order chosen
  without looking at the tokens, so the tree stays lossless under `rejection`.
- `argmax(logits)` is the greedy token of one row of logits, the first on ties as `torch.argmax`, and
  faster on the CPU: what a greedy verifier or drafter compares against.
- `DraftDtype` is the `dtype` option of drafters with a network of their own (what it computes in;
  `specframe.kit.models.drafting_dtype` resolves it on a target).
- `TokenizerIdentity` names the tokenizer whose ids a stored file (a datastore, a learned store) holds,
  so a drafter refuses a store built for another tokenizer instead of proposing wrong tokens.

Imports neither torch nor transformers: a plugin may import it at the top of any module.
"""

from typing import Literal

from specframe.support.tokenizer_identity import TokenizerIdentity
from specframe.terms.sampling import DraftDraw, argmax, check_draw, samples_drafts
from specframe.terms.tree import SAMPLED_DRAWS, draw_order_prefix

__all__ = ["SAMPLED_DRAWS", "DraftDraw", "DraftDtype", "TokenizerIdentity", "argmax", "check_draw",
           "draw_order_prefix", "samples_drafts"]

DraftDtype = Literal["auto", "target", "bfloat16"]  # what a drafter's network computes in
