"""`eagle`: EAGLE draft heads (Li et al., EAGLE, EAGLE-2, EAGLE-3) over the target's hidden states, loaded
from the checkpoints the serving engines load (`eagle(heads=DIR_OR_HUB_ID)`), and `specframe train eagle`
to train one for any target."""

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
