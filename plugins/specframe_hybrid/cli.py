"""`specframe hybrid build`, `specframe hybrid quality` and `specframe hybrid export`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specframe.kit.cli_options import device_option, model_option

hybrid_app = typer.Typer(help="Distil a Llama-architecture model into a Mamba2 + attention hybrid.",
                         no_args_is_help=True)


@hybrid_app.command("build")
def build(
    model: str = model_option(),
    device: str = device_option(),
    layers: list[str] = typer.Option(["1/4"], help="layers to replace: 1/K (e.g. 1/2, 1/4) or a list such "
                                     "as 3,7,11; repeat for several hybrids (their mixers are shared)"),
    run_dir: Path = typer.Option(Path("hybrid-run"), "--run", help="work directory (resumable)"),
    out: Optional[Path] = typer.Option(None, help="save each hybrid as OUT/1in4, OUT/1in2, ..."),
    steps: int = typer.Option(250, min=1, help="training steps per mixer"),
    batch: int = typer.Option(4, min=1, help="blocks per step"),
    lr: float = typer.Option(1e-3),
    end_to_end_steps: int = typer.Option(60, "--end-to-end-steps", min=0,
                                         help="then train all mixers of each hybrid on the teacher's "
                                         "distributions for this many steps (0: skip)"),
    code_tokens: int = typer.Option(96 * 1024, min=0, help="standard library tokens of training data"),
    chat_prompts: int = typer.Option(128, min=0,
                                     help="chat prompts answered by the teacher for training data"),
    threads: Optional[int] = typer.Option(None, min=1, help="torch CPU threads"),
) -> None:
    """Distil MODEL into hybrids, layer by layer then end to end; rerun the same command to resume."""
    import torch

    from specframe_hybrid.convert import replaced_layers
    from specframe_hybrid.distill import LayerTraining
    from specframe_hybrid.end_to_end import EndToEndTraining
    from specframe_hybrid.recipe import Recipe, ratio_name, run

    for spec in layers:
        replaced_layers(spec, 1 << 20)  # a malformed spec fails before the teacher loads
    if threads:
        torch.set_num_threads(threads)
    recipe = Recipe(model=model, device=device, ratios=list(layers), code_tokens=code_tokens,
                    chat_prompts=chat_prompts,
                    training=LayerTraining(steps=steps, batch=batch, lr=lr),
                    end_to_end=EndToEndTraining(steps=end_to_end_steps))
    save_to = {ratio: out / ratio_name(ratio) for ratio in layers} if out else None
    summary = run(recipe, run_dir, save_to, log=lambda line: print(line, flush=True))
    print(f"hybrid: done in {summary['minutes']} min; summary in {run_dir / 'summary.json'}")


@hybrid_app.command("quality")
def quality(
    hybrid: list[str] = typer.Argument(..., help="hybrid models (directories or aliases) to measure"),
    teacher: str = typer.Option("smollm2-135m", help="the model they were distilled from"),
    humaneval: int = typer.Option(20, min=0, help="HumanEval prompts"),
    per_category: int = typer.Option(5, min=0, help="Spec-Bench questions per category"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="also write the table as JSON"),
) -> None:
    """Greedy next-token agreement with the teacher and perplexity, on held-out benchmark prompts."""
    import json

    from specframe_hybrid.quality import measure, table

    rows = measure(teacher, hybrid, humaneval=humaneval, per_category=per_category)
    print(table(rows))
    if json_out:
        json_out.write_text(json.dumps(rows, indent=2))


@hybrid_app.command("export")
def export_mixers(
    run_dir: Path = typer.Option(Path("hybrid-run"), "--run", help="the work directory of `hybrid build`"),
    layers: str = typer.Option("1/4", help="which layers' mixers to ship: 1/K or a list"),
    out: Path = typer.Option(..., help="the float16 file to write, e.g. "
                             "plugins/specframe_hybrid/weights/smollm2-135m-hybrid/mixers.safetensors"),
    model: str = model_option(),
) -> None:
    """Write distilled mixers as one float16 file that a model alias builds from (those trained end to end
    for these layers, if the run has them, else the layer-wise ones)."""
    import specframe
    from specframe.kit.files import read_json
    from specframe_hybrid.convert import replaced_layers
    from specframe_hybrid.packaged import export
    from specframe_hybrid.recipe import ratio_name

    teacher = specframe.load_target(model, device="cpu", dtype="float32")
    chosen = replaced_layers(layers, teacher.config.num_hidden_layers)
    summary_file = run_dir / "summary.json"
    summary = read_json(summary_file, f"delete it and run `specframe hybrid build --run {run_dir}` again",
                        specframe.ConfigurationError) if summary_file.is_file() else {}
    stage_two = run_dir / f"end-to-end-{ratio_name(layers)}"
    end_to_end = stage_two if (stage_two / "mixers.safetensors").is_file() else None
    size = export(teacher.model, run_dir, chosen, out, summary, end_to_end)
    stage = "end to end" if end_to_end else "layer-wise"
    print(f"hybrid: mixers of layers {chosen} ({stage}) -> {out} ({size / 2**20:.1f} MiB)")
