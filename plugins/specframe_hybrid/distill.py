"""Layer-wise distillation: each new Mamba2 mixer learns to reproduce the output of the attention layer it
replaces, on that layer's own inputs taken from the teacher (stage 1 of MambaInLlama).

Every replaced layer trains alone, so the work splits into resumable pieces, each saved atomically:
1. the teacher's attention inputs and outputs for every layer to distil, over all training blocks, cached
   as float16 chunks (`activations/chunk-NNNN.safetensors`);
2. one mixer per layer, trained on its cached pairs by AdamW on the relative squared error
   `|mixer(x) - attention(x)|^2 / |attention(x)|^2`, saved as `mixers/layer-NN.safetensors`.
A run killed at any point continues where it stopped. Mixers trained once serve every layer ratio: a
hybrid with layers 2, 6, 10 replaced and one with 1, 2, 3, ... replaced draw from the same files.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specframe import ConfigurationError
from specframe.kit.files import parse_json
from specframe.kit.progress import bar as progress_bar
from specframe.kit.training import check_bounds
from specframe_hybrid.convert import convert, hybrid_config

CHUNK_BLOCKS = 8  # training blocks per activation file


@dataclass
class LayerTraining:
    """How each mixer is trained."""

    steps: int = 250
    batch: int = 4  # blocks per step
    lr: float = 1e-3
    warmup: int = 20
    seed: int = 0

    def __post_init__(self):
        check_bounds("hybrid layer training", self, {"steps": 1, "batch": 1, "warmup": 0}, positive=("lr",))


def save_atomic(tensors: dict[str, torch.Tensor], path: Path, metadata: dict | None = None) -> None:
    """Write `tensors` as safetensors beside `path`, then rename: a killed run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    tmp.replace(path)


class TeacherActivations:
    """The input (after the layer's RMSNorm) and output of the teacher's attention at `layers`, per block."""

    def __init__(self, directory: Path, blocks: torch.Tensor, layers: list[int]) -> None:
        self.directory, self.blocks, self.layers = directory, blocks, sorted(layers)

    def _chunk(self, index: int) -> Path:
        return self.directory / f"chunk-{index:04d}.safetensors"

    @property
    def chunks(self) -> int:
        return math.ceil(len(self.blocks) / CHUNK_BLOCKS)

    def missing(self) -> list[int]:
        """Chunks not yet computed, or computed without some of these layers."""
        todo = []
        for index in range(self.chunks):
            path = self._chunk(index)
            if not path.is_file():
                todo.append(index)
                continue
            with safe_open(str(path), "pt") as f:
                stored = {int(i) for i in (f.metadata() or {}).get("layers", "").split(",") if i}
            if not set(self.layers) <= stored:
                todo.append(index)
        return todo

    @torch.inference_mode()
    def fill(self, teacher: torch.nn.Module) -> None:
        """Run the teacher over the blocks whose activations are missing and cache them."""
        captured: dict[str, torch.Tensor] = {}
        hooks = []
        for layer in self.layers:
            attention = teacher.model.layers[layer].self_attn

            def keep_input(module, args, kwargs, layer=layer):
                captured[f"in.{layer}"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

            def keep_output(module, args, kwargs, output, layer=layer):
                captured[f"out.{layer}"] = output[0]

            hooks.append(attention.register_forward_pre_hook(keep_input, with_kwargs=True))
            hooks.append(attention.register_forward_hook(keep_output, with_kwargs=True))
        try:
            for index in progress_bar(self.missing(), desc="teacher activations", unit="chunk"):
                rows = self.blocks[index * CHUNK_BLOCKS:(index + 1) * CHUNK_BLOCKS]  # (B, T)
                captured.clear()
                teacher(rows.to(teacher.device), use_cache=False)
                tensors = {k: v.to("cpu", torch.float16) for k, v in captured.items()}
                save_atomic(tensors, self._chunk(index), {"layers": ",".join(map(str, self.layers))})
        finally:
            for hook in hooks:
                hook.remove()

    def pairs(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, outputs) of `layer` over all blocks, float16, each (N, T, hidden)."""
        ins, outs = [], []
        for index in range(self.chunks):
            tensors = load_file(str(self._chunk(index)))
            ins.append(tensors[f"in.{layer}"])
            outs.append(tensors[f"out.{layer}"])
        return torch.cat(ins), torch.cat(outs)


def mixer_path(run_dir: Path, layer: int) -> Path:
    return run_dir / "mixers" / f"layer-{layer:02d}.safetensors"


def require_mixers(run_dir: Path, layers: list[int]) -> None:
    """Refuse, naming them, layers whose mixer `run_dir` has not distilled."""
    missing = [layer for layer in layers if not mixer_path(run_dir, layer).is_file()]
    if missing:
        raise ConfigurationError(f"{run_dir} has no distilled mixer for layers {missing}: run "
                                 f"`specframe hybrid build --run {run_dir}` with these layers first")


def train_mixer(mixer: torch.nn.Module, inputs: torch.Tensor, outputs: torch.Tensor, settings: LayerTraining,
                *, held_out: int = 2, desc: str = "mixer") -> dict:
    """Fit `mixer` so that mixer(inputs) ~ outputs; the last `held_out` blocks are kept out of training and
    report the held-out relative error. Returns the first and last losses."""
    generator = torch.Generator().manual_seed(settings.seed)
    device = next(mixer.parameters()).device
    train_x, train_y = inputs[:-held_out], outputs[:-held_out]  # float16, on the CPU
    test_x, test_y = inputs[-held_out:].to(device).float(), outputs[-held_out:].to(device).float()
    optimizer = torch.optim.AdamW(mixer.parameters(), lr=settings.lr, weight_decay=0.0, betas=(0.9, 0.98))

    def rate(step: int) -> float:
        if step < settings.warmup:
            return (step + 1) / settings.warmup
        progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)

    def held_out_error() -> float:
        with torch.no_grad():
            return relative_error(mixer(hidden_states=test_x), test_y).item()

    match_output_scale(mixer, train_x[:settings.batch].to(device).float(),
                       train_y[:settings.batch].to(device).float())
    before = held_out_error()
    losses = []
    with progress_bar(range(settings.steps), desc=desc, unit="step") as bar:
        for _ in bar:
            rows = torch.randint(len(train_x), (settings.batch,), generator=generator)
            x, y = train_x[rows].to(device).float(), train_y[rows].to(device).float()  # (B, T, hidden)
            loss = relative_error(mixer(hidden_states=x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(mixer.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    return {"held_out_before": before, "held_out_after": held_out_error(),
            "train_first": sum(losses[:20]) / max(1, len(losses[:20])),
            "train_last": sum(losses[-20:]) / max(1, len(losses[-20:]))}


@torch.no_grad()
def match_output_scale(mixer: torch.nn.Module, inputs: torch.Tensor, outputs: torch.Tensor) -> None:
    """Scale the mixer's output norm so that its output has the attention output's energy: the gated RMSNorm
    before `out_proj` would otherwise start the mixer an order of magnitude too loud."""
    produced = mixer(hidden_states=inputs).pow(2).mean()
    mixer.norm.weight.mul_((outputs.pow(2).mean() / produced.clamp_min(1e-12)).sqrt())


def relative_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Squared error relative to the target's energy, so that layers of any scale weigh alike."""
    return (prediction - target).pow(2).mean() / target.pow(2).mean().clamp_min(1e-8)


def distil_layers(teacher, activations: TeacherActivations, run_dir: Path, settings: LayerTraining,
                  order: list[int] | None = None, log=print) -> dict[int, dict]:
    """Train (or load, if already trained) the mixer of every layer in `activations`, in `order` if given;
    their reports."""
    config = hybrid_config(teacher.config, activations.layers)
    hybrid_template = None
    reports = {}
    for layer in order or activations.layers:
        path = mixer_path(run_dir, layer)
        if path.is_file():
            with safe_open(str(path), "pt") as f:
                reports[layer] = parse_json((f.metadata() or {}).get("report", "{}"), f"the report of {path}",
                                            "delete that file to train the layer again", ConfigurationError)
            continue
        if hybrid_template is None:
            hybrid_template = convert(teacher, activations.layers).to(teacher.device)
        mixer = hybrid_template.model.layers[layer].mamba
        inputs, outputs = activations.pairs(layer)
        start = time.time()
        report = train_mixer(mixer, inputs, outputs, settings, desc=f"layer {layer}")
        report["seconds"] = round(time.time() - start, 1)
        reports[layer] = report
        log(f"hybrid: layer {layer}: held-out relative error {report['held_out_before']:.3f} -> "
            f"{report['held_out_after']:.3f} in {report['seconds']:.0f} s")
        state = {k: v.detach().cpu() for k, v in mixer.state_dict().items()}
        save_atomic(state, path, {"report": json.dumps(report), "settings": json.dumps(asdict(settings)),
                                   "config": config.to_json_string()})
    return reports


def assemble(teacher, mamba_layers: list[int], run_dir: Path) -> torch.nn.Module:
    """The hybrid of `teacher` with the layer-wise distilled mixers of `run_dir` at `mamba_layers`."""
    require_mixers(run_dir, mamba_layers)
    hybrid = convert(teacher, mamba_layers).to(teacher.device)
    for layer in mamba_layers:
        hybrid.model.layers[layer].mamba.load_state_dict(load_file(str(mixer_path(run_dir, layer))))
    return hybrid
