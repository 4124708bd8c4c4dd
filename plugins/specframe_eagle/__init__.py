"""`eagle`: EAGLE draft heads (Li et al., EAGLE, EAGLE-2, EAGLE-3) over the target's hidden states, loaded
from the checkpoints the serving engines load (`eagle(heads=DIR_OR_HUB_ID)`), and `specframe train eagle`
to train one for any target. The presets `eagle` and `suffix-eagle` decode with the model's default head:
one shipped in `weights/`, else the one `specframe train eagle --model MODEL` trained in its default place
(`$SPECFRAME_HOME/eagle/MODEL`)."""

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


# The target layers a default head reads (EAGLE-3 as `specframe train eagle` trains it: a low, a middle and
# a high one, SmolLM2's layers 2, 15 and 27), which the presets ask `kv` to hand out; the presets refuse a
# default head that reads others.
PRESET_LAYERS = (2, 15, 27)
HEADS_BELOW = 0.85  # `suffix-eagle` drafts with the head on steps whose best copied root child is less likely


@specframe.hookimpl
def register_presets(register):
    backend = f"kv(hidden_layers={PRESET_LAYERS})"
    register(specframe.Preset("eagle", f"eagle+dynamic+greedy+{backend}", unusable=no_default_head,
                              help="EAGLE-3, the model's default head (shipped or trained here)"))
    fused = f"suffix-eagle(heads_below={HEADS_BELOW})+trie+greedy+{backend}"
    register(specframe.Preset("suffix-eagle", fused, unusable=no_default_head,
                              help="suffix plus the model's default EAGLE head, for text nothing copied"))


def no_default_head(target) -> str | None:
    """Why the `eagle` presets cannot run on `target`: no default head, or one reading other layers."""
    import json

    from specframe_eagle.drafter import default_head, trained_head_dir

    head = default_head(target.name)
    if head is None:
        return (f"no EAGLE head ships for model '{target.name}' or was trained here: train one with "
                f"`specframe train eagle --model {target.name}` (it writes {trained_head_dir(target.name)}), "
                "or name one: --methods \"eagle(heads=DIR)+dynamic+greedy+kv(hidden_layers=...)\"")
    try:
        config = json.loads((head / "config.json").read_text())
        layers = tuple(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    except (OSError, ValueError, KeyError, TypeError):
        layers = None
    if layers != PRESET_LAYERS:
        return (f"the EAGLE head in {head} does not read the target layers {PRESET_LAYERS} these presets "
                f"ask kv for: name it with its own, --methods \"eagle(heads='{head}')+dynamic+greedy+"
                "kv(hidden_layers=...)\"")
    return None
