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


@specframe.hookimpl
def register_presets(register):
    register(specframe.Preset("s4c", "s4c+static+greedy", unusable=no_packaged_heads,
                              help="S4C with the heads shipped for the model"))


def no_packaged_heads(target) -> str | None:
    """Why the `s4c` preset cannot run on `target`: no trained heads ship for it."""
    from specframe_s4c.drafter import packaged_heads

    path = packaged_heads(target.name)
    if path.is_file():
        return None
    return (f"no trained heads ship for model '{target.name}' (looked for {path}); train them with "
            f"`specframe train s4c --model {target.name}` and name them: --methods "
            "\"s4c(heads='RUN/heads.safetensors')+static+greedy\"")
