"""For plugins that train (s4c heads, hybrid mixers): a resumable training state and the bounds check of a
training config.

- `save_train_state(path, tensors, optimizer, extra)` writes the weights, the optimizer's state and JSON
  extras to one safetensors file, atomically, so a killed run resumes from its last save;
  `read_train_state(path, hint)` reads it back and refuses a damaged or foreign file, saying how to
  start afresh (`hint`). `STATE_FILE` is the file's name in a run directory.
- `refuse_pickled_state(directory, hint)` refuses a run directory whose only state is a pickle, which is
  never loaded (loading a pickle can run any code).
- `check_bounds(what, settings, at_least, positive)` refuses a config whose fields fall below their
  bounds (zero steps, a zero learning rate) before a model is loaded.
- `cosine_lr(step, lr, warmup, steps)`, `batch_rows(order, step, batch)` and
  `optimizer_step(optimizer, loss, parameters, lr)`: a step's learning rate (linear warm-up, then a
  cosine down to a tenth), its rows of the shuffled data, and its update (gradients clipped to norm 1).
- `read_run_state(out_dir, config, what)` reads a run directory's state to resume from (None where
  there is none), refusing a pickle, a damaged file, or one written with other settings.
- `run_steps(trainer, max_minutes, describe)` is the loop of a trainer: steps until its config's
  `steps` or `max_minutes`, each logged with its loss, what `describe` says of it, the learning rate and
  the tokens per second, the state saved every `save_every` steps and at the end.

Imports torch: import it in the modules that train, never in a plugin's `__init__`.
"""

import math
import time
from collections.abc import Callable

from specframe.plugging.options import check_bounds
from specframe.support.train_state import STATE_FILE, read_train_state, refuse_pickled_state, save_train_state

__all__ = ["STATE_FILE", "batch_rows", "check_bounds", "cosine_lr", "optimizer_step", "read_run_state",
           "read_train_state", "refuse_pickled_state", "run_steps", "save_train_state"]

RESUME_HINT = "delete it (or pass --fresh) to start afresh, or use a new --out directory"


def read_run_state(out_dir, config: dict, what: str):
    """The training state saved in run directory `out_dir` (`read_train_state`), or None where it holds
    none; refused where only a pickle is there, where the file is damaged, or where it was written with
    settings other than `config` (a dict; `what` names the training in the message, e.g. "s4c")."""
    from pathlib import Path

    refuse_pickled_state(Path(out_dir), RESUME_HINT)
    path = Path(out_dir) / STATE_FILE
    if not path.is_file():
        return None
    state = read_train_state(path, RESUME_HINT)
    if state.extra.get("config") != config:
        from specframe.terms.errors import ConfigurationError

        raise ConfigurationError(f"{what} training: {path} was written with other settings "
                                 f"({state.extra.get('config')}); use a new --out directory or the same "
                                 "options")
    return state


def cosine_lr(step: int, lr: float, warmup: int, steps: int) -> float:
    """The learning rate of `step`: linear warm-up over `warmup` steps, then a cosine from `lr` down to
    `lr / 10` at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_rows(order, step: int, batch: int):
    """The rows of `step`'s batch: the next `batch` of the shuffled `order` (a numpy array), wrapping
    round."""
    import numpy as np

    start = (step * batch) % len(order)
    return order[np.arange(start, start + batch) % len(order)]


def optimizer_step(optimizer, loss, parameters, lr: float) -> None:
    """One update of `parameters` by `optimizer` at learning rate `lr`, from `loss`, gradients clipped to
    norm 1."""
    import torch

    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()


def run_steps(trainer, max_minutes: float | None, describe: Callable[[dict], str]) -> None:
    """Train until `trainer.step` reaches `trainer.config.steps`, or `max_minutes` have passed (the state is
    saved: run again to resume). `trainer` has `config` (with `steps`, `batch`, `block`, `save_every`),
    `step`, `history`, `train_step()` (one optimizer step, returning its record with a `loss`),
    `lr_at(step)`, `log(line)` and `save()`; each step is logged with `describe(record)`."""
    c = trainer.config
    deadline = None if max_minutes is None else time.time() + 60 * max_minutes
    t0, tokens = time.time(), 0
    while trainer.step < c.steps and (deadline is None or time.time() < deadline):
        record = trainer.train_step()
        tokens += c.batch * c.block
        trainer.history.append(record)
        trainer.log(f"step {trainer.step}/{c.steps} loss {record['loss']:.4f} {describe(record)} "
                    f"lr {trainer.lr_at(trainer.step - 1):.2e} {tokens / (time.time() - t0):.0f} tok/s")
        if trainer.step % c.save_every == 0:
            trainer.save()
    trainer.save()
