"""`hybrid`: SmolLM2 (or any Llama-architecture model) distilled into a Mamba2 + attention hybrid that
transformers loads by itself and `ssm-tree` serves: `specframe hybrid build`, `specframe hybrid quality`,
and the model alias `smollm2-135m-hybrid`."""

from __future__ import annotations

from functools import partial

import specframe


@specframe.hookimpl
def register_commands(cli):
    from specframe_hybrid.cli import hybrid_app

    cli.add_typer(hybrid_app, name="hybrid")


@specframe.hookimpl
def register_models(register):
    register(specframe.ModelRecipe(
        "smollm2-135m-hybrid", build_shipped,
        help="SmolLM2-135M-Instruct with 1 in 4 attention layers distilled into Mamba2 mixers", minutes=0.5))
    register(specframe.ModelRecipe(
        "smollm2-135m-hybrid-1in2", partial(build_distilled, "1/2"),
        help="SmolLM2-135M-Instruct with every second attention layer distilled into Mamba2 mixers "
             "(distilled on first use)", minutes=60))


def build_shipped(directory, log) -> None:
    """Build `smollm2-135m-hybrid` from the mixers shipped in this package. Its modules load torch, so they
    are imported here, when the alias is first used, not when it is registered."""
    from specframe_hybrid.packaged import WEIGHTS, build_from_file

    build_from_file(WEIGHTS / "smollm2-135m-hybrid" / "mixers.safetensors", directory, log)


def build_distilled(ratio: str, directory, log) -> None:
    """Build the hybrid of `ratio` by the whole distillation recipe (see `build_shipped` on imports)."""
    from specframe_hybrid.packaged import build_by_recipe

    build_by_recipe(ratio)(directory, log)
