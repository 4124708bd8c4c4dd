"""`draft-model`: classic speculative decoding with a small causal LM, or the target's first N layers."""

from __future__ import annotations

import specframe


PRESET_LAYERS = 8  # the `draft-model` preset drafts with the target's first 8 layers


@specframe.hookimpl
def register_drafters(register):
    from specframe_draft.drafter import DraftModelDrafter

    register(DraftModelDrafter)


@specframe.hookimpl
def register_presets(register):
    register(specframe.Preset("draft-model", f"draft-model(layers={PRESET_LAYERS})+chain+greedy",
                              unusable=too_shallow, help="self-speculation with the target's first layers"))


def too_shallow(target) -> str | None:
    """Why the `draft-model` preset cannot run on `target`: it needs more than `PRESET_LAYERS` layers."""
    layers = getattr(target.config, "num_hidden_layers", None)
    if layers is None or layers > PRESET_LAYERS:
        return None
    return (f"model '{target.name}' has {layers} layers, so its first {PRESET_LAYERS} are no smaller draft "
            f"model; name fewer: --methods 'draft-model(layers={max(layers - 1, 1)})+chain+greedy'")
