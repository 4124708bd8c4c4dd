"""The whole recipe, resumable: data, teacher activations, one distilled mixer per replaced layer, and the
hybrid model directories, one per layer ratio. `specframe hybrid build` runs it; the model alias builds
from the mixers committed with the package instead (`specframe_hybrid.alias`)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specframe import ConfigurationError
from specframe.kit.training import check_bounds
from specframe_hybrid.convert import replaced_layers
from specframe_hybrid.data import training_blocks
from specframe_hybrid.distill import LayerTraining, TeacherActivations, assemble, distil_layers
from specframe_hybrid.end_to_end import EndToEndTraining, load_end_to_end, train_end_to_end


@dataclass
class Recipe:
    """What to build and on what data. The defaults are the run behind the packaged mixers."""

    model: str = "smollm2-135m"
    device: str = "cpu"  # where the teacher and the training run ("auto": the accelerator if there is one)
    ratios: list[str] = field(default_factory=lambda: ["1/4"])
    block: int = 512
    code_tokens: int = 96 * 1024
    chat_prompts: int = 128
    chat_new_tokens: int = 256
    training: LayerTraining = field(default_factory=LayerTraining)
    end_to_end: EndToEndTraining = field(default_factory=lambda: EndToEndTraining(steps=60))  # 0: skip

    def __post_init__(self):
        check_bounds("hybrid recipe", self, {"block": 2, "code_tokens": 0, "chat_prompts": 0,
                                             "chat_new_tokens": 1})
        if not self.code_tokens and not self.chat_prompts:
            raise ConfigurationError("hybrid recipe: no training data: give --code-tokens or --chat-prompts "
                                     "above 0")


def ratio_name(ratio: str) -> str:
    """A directory name for a layer ratio: "1/4" -> "1in4"."""
    return ratio.replace("/", "in").replace(",", "-")


def run(recipe: Recipe, run_dir: Path, save_to: dict[str, Path] | None = None, log=print) -> dict:
    """Run every stage not yet done in `run_dir`; save the hybrid of each ratio in `save_to` (ratio ->
    directory) with the teacher's tokenizer. Returns the summary also written to `run_dir/summary.json`."""
    import specframe

    start = time.time()
    teacher = specframe.load_target(recipe.model, device=recipe.device, dtype="float32")
    num_layers = teacher.config.num_hidden_layers
    layers_by_ratio = {ratio: replaced_layers(ratio, num_layers) for ratio in recipe.ratios}
    order = list(dict.fromkeys(layer for layers in layers_by_ratio.values() for layer in layers))
    blocks = training_blocks(teacher, run_dir, block=recipe.block, code_tokens=recipe.code_tokens,
                             chat_prompts=recipe.chat_prompts, chat_new_tokens=recipe.chat_new_tokens,
                             log=log)
    activations = TeacherActivations(run_dir / "activations", blocks, order)
    activations.fill(teacher.model)
    reports = distil_layers(teacher.model, activations, run_dir, recipe.training, order=order, log=log)
    built, stage_two = {}, {}
    for ratio, layers in layers_by_ratio.items():
        hybrid = assemble(teacher.model, layers, run_dir)
        if recipe.end_to_end.steps:
            work = run_dir / f"end-to-end-{ratio_name(ratio)}"
            stage_two[ratio] = train_end_to_end(teacher.model, hybrid, layers, blocks, work,
                                                recipe.end_to_end, log=log)
            load_end_to_end(hybrid, work)
        path = (save_to or {}).get(ratio)
        if path is None:
            continue
        hybrid.to("cpu").save_pretrained(path)
        teacher.tokenizer.save_pretrained(path)
        built[ratio] = str(path)
        log(f"hybrid: {ratio} of the layers replaced ({len(layers)}: {layers}) -> {path}")
    summary = {"recipe": asdict(recipe), "tokens": int(blocks.numel()),
               "layers": {str(k): v for k, v in reports.items()}, "end_to_end": stage_two, "built": built,
               "minutes": round((time.time() - start) / 60, 1)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
