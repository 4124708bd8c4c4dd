"""`s4c`: S4C multi-head drafter (He et al., "S4C: Speculative Sampling with Syntactic and Semantic
Coherence"), and `specframe train s4c` to train its heads."""

from __future__ import annotations

import specframe


@specframe.hookimpl
def register_commands(cli):
    from specframe_s4c.cli import train_app

    cli.add_typer(train_app, name="train")


@specframe.hookimpl
def register_drafters(register):
    from specframe_s4c.drafter import S4CDrafter

    register(S4CDrafter)
