"""`draft-model`: classic speculative decoding with a small causal LM, or the target's first N layers."""

from __future__ import annotations

import specframe


@specframe.hookimpl
def register_drafters(register):
    from specframe_draft.drafter import DraftModelDrafter

    register(DraftModelDrafter)
