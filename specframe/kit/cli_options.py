"""Options every model-loading command shares: `--model`, `--device`, `--dtype`, `--phase-timing`, and the
timing options of the commands that measure speed (`--threads`, `--clock`).

Factories, not shared instances, so each command owns its option objects. A plugin's own commands
(`specframe datastore build`, `specframe train s4c`) declare their model options with these, so they read
and behave as specframe's."""

from __future__ import annotations

import typer

from specframe.runtime.devices import DEVICE_HELP, DTYPE_HELP

MODEL_HELP = ("Model: an alias (smollm2-135m), a local Hugging Face directory, a .gguf file, or a Hugging "
              "Face id such as HuggingFaceTB/SmolLM2-360M-Instruct (from your HF cache, or downloaded "
              "unless HF_HUB_OFFLINE is set).")
"""The help of `--model`: every form of model name `load_target` accepts."""


def model_option(default: str = "smollm2-135m") -> str:
    """`--model`: an alias, a local directory, a .gguf file or a Hugging Face id (`MODEL_HELP`)."""
    return typer.Option(default, help=MODEL_HELP)


def device_option() -> str:
    """`--device`: auto (CUDA, else MPS, else the CPU), cpu, cuda, cuda:INDEX or mps."""
    return typer.Option("auto", help=DEVICE_HELP)


def dtype_option() -> str:
    """`--dtype`: the precision the model loads in (auto: its own on an accelerator, float32 on a CPU)."""
    return typer.Option("auto", help=DTYPE_HELP)


def phase_timing_option() -> bool:
    """`--phase-timing/--no-phase-timing`: whether each phase of a step is timed."""
    return typer.Option(True, "--phase-timing/--no-phase-timing",
                        help="Time each phase of a step (synchronises the GPU per phase); turn off for the "
                        "fastest run: totals stay right, the per-phase split is then not measured.")


def threads_option() -> int | None:
    """`--threads`: torch's intra-op thread count for a command that measures speed."""
    return typer.Option(None, min=1, help="torch intra-op threads (default: torch's choice). On a busy "
                        "machine 1 thread times far more steadily.")


def clock_option() -> str:
    """`--clock`: wall time, or this process's CPU time (one thread on the CPU only)."""
    return typer.Option("wall", help="wall, or cpu: this process's CPU time, which other processes on a "
                        "shared CPU do not inflate (needs --threads 1 and --device cpu).")


def set_timing(threads: int | None, clock: str, device: str) -> None:
    """Apply `--threads` and `--clock`: torch's thread count, and the clock every timing reads. CPU time
    measures a request only on one thread of a CPU."""
    import torch

    from specframe.runtime.devices import resolve_device
    from specframe.terms.errors import ConfigurationError
    from specframe.terms.metrics import CLOCKS, set_clock

    if clock not in CLOCKS:
        raise ConfigurationError(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if clock == "cpu" and (threads != 1 or resolve_device(device).type != "cpu"):
        raise ConfigurationError("--clock cpu needs --threads 1 and the CPU (--device cpu): CPU time adds up "
                                 "all threads' time and misses an accelerator's work")
    if threads is not None:
        torch.set_num_threads(threads)
    set_clock(clock)


def train_group(cli: typer.Typer) -> typer.Typer:
    """The `specframe train` group of `cli` (the app a `register_commands` hook is given), made by the
    first plugin that trains something: every plugin adds its command to the one group
    (`train_group(cli).command("s4c")(...)`), whichever registers first."""
    for group in cli.registered_groups:
        if group.name == "train":
            return group.typer_instance
    group = typer.Typer(help="Train drafters that need training.", no_args_is_help=True)
    cli.add_typer(group, name="train")
    return group
