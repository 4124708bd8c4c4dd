"""`eagle`: EAGLE draft heads (Li et al., EAGLE, EAGLE-2, EAGLE-3) over the target's hidden states, loaded
from the checkpoints the serving engines load (`eagle(heads=DIR_OR_HUB_ID)`), and `specframe train eagle`
to train one for any target. The presets `eagle` and `suffix-eagle` decode with the head that ships for the
model (`weights/`)."""

from __future__ import annotations

import specframe


@specframe.hookimpl
def register_commands(cli):
    from specframe.kit.cli_options import train_group
    from specframe_eagle.cli import train_eagle

    train_group(cli).command("eagle")(train_eagle)


@specframe.hookimpl
def register_drafters(register):
    from specframe_eagle.drafter import EagleDrafter

    register(EagleDrafter)


# The target layers the shipped heads read (EAGLE-3: a low, a middle and a high one), which the presets ask
# `kv` to hand out; a test checks them against each shipped head's config.json.
PACKAGED_LAYERS = (2, 15, 27)
HEADS_BELOW = 0.85  # `suffix-eagle` drafts with the head on steps whose best copied root child is less likely


@specframe.hookimpl
def register_presets(register):
    backend = f"kv(hidden_layers={PACKAGED_LAYERS})"
    register(specframe.Preset("eagle", f"eagle+dynamic+greedy+{backend}", unusable=no_packaged_head,
                              help="EAGLE-3 with the head shipped for the model, EAGLE-2's dynamic tree"))
    fused = f"suffix-eagle(heads_below={HEADS_BELOW})+trie+greedy+{backend}"
    register(specframe.Preset("suffix-eagle", fused, unusable=no_packaged_head,
                              help="suffix plus the shipped EAGLE head, for what nothing copied says"))


def no_packaged_head(target) -> str | None:
    """Why the `eagle` presets cannot run on `target`: no trained head ships for it."""
    from specframe_eagle.drafter import packaged_head

    path = packaged_head(target.name)
    if (path / "config.json").is_file():
        return None
    return (f"no trained EAGLE head ships for model '{target.name}' (looked in {path}); train one with "
            f"`specframe train eagle --model {target.name} --out RUN` and name it: --methods "
            "\"eagle(heads='RUN/head')+dynamic+greedy+kv(hidden_layers=...)\" (it prints the layers)")
