"""`hybrid`: SmolLM2 (or any Llama-architecture model) distilled into a Mamba2 + attention hybrid that
transformers loads by itself and `ssm-tree` serves: `specframe hybrid build`, `specframe hybrid quality`,
and the model alias `smollm2-135m-hybrid`."""

from __future__ import annotations

import specframe


@specframe.hookimpl
def register_commands(cli):
    from specframe_hybrid.cli import hybrid_app

    cli.add_typer(hybrid_app, name="hybrid")


@specframe.hookimpl
def register_models(register):
    from specframe_hybrid.packaged import WEIGHTS, build_by_recipe, build_from_file

    shipped = WEIGHTS / "smollm2-135m-hybrid" / "mixers.safetensors"
    register(specframe.ModelRecipe(
        "smollm2-135m-hybrid", lambda directory, log: build_from_file(shipped, directory, log),
        help="SmolLM2-135M-Instruct with 1 in 4 attention layers distilled into Mamba2 mixers", minutes=0.5))
    register(specframe.ModelRecipe(
        "smollm2-135m-hybrid-1in2", build_by_recipe("1/2"),
        help="SmolLM2-135M-Instruct with every second attention layer distilled into Mamba2 mixers "
             "(distilled on first use)", minutes=60))
