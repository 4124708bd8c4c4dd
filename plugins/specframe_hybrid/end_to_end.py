"""Stage 2 of the recipe: the whole hybrid against the teacher's next-token distributions.

Layer-wise training fits each mixer on the teacher's inputs; in the hybrid each mixer sees the outputs of
the mixers before it, so errors add up. This stage trains only the mixers (the teacher's layers stay
frozen) on the KL divergence from the teacher's distribution to the hybrid's at every position of the
training blocks. It checkpoints every few steps (`state.safetensors`) and resumes; the result is one file
of all the hybrid's mixers (`mixers.safetensors`), which `assemble` loads over the layer-wise ones.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specframe.kit.progress import bar as progress_bar
from specframe.kit.training import (
    STATE_FILE, check_bounds, read_train_state, refuse_pickled_state, save_train_state,
)
from specframe_hybrid.distill import save_atomic

CHECKPOINT_EVERY = 10


@dataclass
class EndToEndTraining:
    steps: int = 60  # 0: skip
    batch: int = 2
    lr: float = 2e-4
    seed: int = 0

    def __post_init__(self):
        check_bounds("hybrid end-to-end training", self, {"steps": 0, "batch": 1}, positive=("lr",))


def mixer_parameters(hybrid: torch.nn.Module, layers: list[int]) -> dict[str, torch.nn.Parameter]:
    return {f"layers.{layer}.{name}": p for layer in layers
            for name, p in hybrid.model.layers[layer].mamba.named_parameters()}


def mixer_state(hybrid: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The hybrid's trained tensors (its mixers'), as its `state_dict` names them."""
    return {k: v for k, v in hybrid.state_dict().items() if ".mamba." in k}


def train_end_to_end(teacher: torch.nn.Module, hybrid: torch.nn.Module, layers: list[int],
                     blocks: torch.Tensor, work: Path, settings: EndToEndTraining, log=print) -> dict:
    """Train the mixers at `layers` of `hybrid` on KL(teacher || hybrid); resumes from
    `work/state.safetensors`. Returns the first and last mean losses; leaves the trained mixers in
    `work/mixers.safetensors`."""
    for p in hybrid.parameters():
        p.requires_grad_(False)
    params = mixer_parameters(hybrid, layers)
    for p in params.values():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params.values(), lr=settings.lr, weight_decay=0.0, betas=(0.9, 0.98))
    state_file, step, losses = work / STATE_FILE, 0, []
    hint = "delete it to train end to end afresh"
    refuse_pickled_state(work, hint)
    if state_file.is_file():
        state = read_train_state(state_file, hint)
        weights = state.weights(mixer_state(hybrid))
        step, losses = state.extra.get("step"), state.extra.get("losses")
        if (not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(losses, list)
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses)):
            raise state.error("holds a damaged step or loss history")
        state.load_optimizer(optimizer)
        hybrid.load_state_dict(weights, strict=False)  # the mixers only: the teacher's layers are frozen
    generator = torch.Generator().manual_seed(settings.seed + step)
    start = time.time()
    with progress_bar(total=settings.steps, initial=step, desc="end to end", unit="step") as bar:
        while step < settings.steps:
            rows = blocks[torch.randint(len(blocks), (settings.batch,), generator=generator)]  # (B, T)
            rows = rows.to(next(hybrid.parameters()).device)
            with torch.no_grad():
                want = F.log_softmax(teacher(rows, use_cache=False).logits.float(), dim=-1)  # (B, T, V)
            got = F.log_softmax(hybrid(rows, use_cache=False).logits.float(), dim=-1)
            loss = F.kl_div(got.flatten(0, 1), want.flatten(0, 1), log_target=True, reduction="batchmean")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
            for group in optimizer.param_groups:  # cosine to 10 % of the peak rate
                group["lr"] = settings.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / settings.steps)))
            optimizer.step()
            step += 1
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(kl=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")
            if step % CHECKPOINT_EVERY == 0 or step == settings.steps:
                save_train_state(state_file, mixer_state(hybrid), optimizer, {"step": step, "losses": losses})
    save_atomic({k: p.detach().cpu() for k, p in params.items()}, work / "mixers.safetensors")
    first, last = losses[:10], losses[-10:]
    report = {"steps": step, "kl_first": sum(first) / max(1, len(first)),
              "kl_last": sum(last) / max(1, len(last))}
    log(f"hybrid: end to end, {step} steps in {(time.time() - start) / 60:.1f} min: "
        f"KL {report['kl_first']:.3f} -> {report['kl_last']:.3f}")
    return report


def load_end_to_end(hybrid: torch.nn.Module, work: Path) -> None:
    """Load the mixers trained end to end (`work/mixers.safetensors`) into `hybrid`."""
    for key, value in load_file(str(work / "mixers.safetensors")).items():
        _, layer, name = key.split(".", 2)
        hybrid.model.layers[int(layer)].mamba.get_parameter(name).data.copy_(value)
