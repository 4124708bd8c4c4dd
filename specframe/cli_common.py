"""Options every model-loading command shares: `--model`, `--device`, `--dtype` (and `--phase-timing`).

Factories, not shared instances, so each command owns its option objects."""

from __future__ import annotations

import typer

from specframe.devices import DEVICE_HELP, DTYPE_HELP

MODEL_HELP = ("Model: an alias (smollm2-135m), a local Hugging Face directory, a .gguf file, or a Hugging "
              "Face id such as HuggingFaceTB/SmolLM2-360M-Instruct (from your HF cache, or downloaded "
              "unless HF_HUB_OFFLINE is set).")


def model_option(default: str = "smollm2-135m") -> str:
    return typer.Option(default, help=MODEL_HELP)


def device_option() -> str:
    return typer.Option("auto", help=DEVICE_HELP)


def dtype_option() -> str:
    return typer.Option("auto", help=DTYPE_HELP)


def phase_timing_option() -> bool:
    return typer.Option(True, "--phase-timing/--no-phase-timing",
                        help="Time each phase of a step (synchronises the GPU per phase); turn off for the "
                        "fastest run: totals stay right, the per-phase split is then not measured.")
