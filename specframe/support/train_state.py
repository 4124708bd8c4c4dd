"""Resumable training state that loading cannot turn into code: tensors in safetensors, the rest in JSON.

`torch.save` writes a pickle, and unpickling runs whatever its author put in it, so a run directory that
anyone else could write to would be a way to run code as the user who resumes. Trainers that resume
(`specframe train s4c`, the hybrid recipe) keep their state in one safetensors file instead:

- the model's tensors under their own names, and the optimizer's per-parameter tensors (Adam's moments
  and step counts) as `optimizer.<param index>.<name>`;
- in the file's metadata, as JSON: the optimizer's parameter groups (learning rate, betas, ...), its
  non-tensor per-parameter values, and the trainer's own fields (`extra`: step, history, settings).

Reading parses only those two formats; loading checks every tensor's name and shape against the model
and optimizer it goes into, so a damaged or foreign file is refused with a message, not half-applied.
The file is replaced atomically: a reader sees the previous state or the new one, whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from specframe.support.atomic_dirs import write_atomically
from specframe.terms.errors import ConfigurationError

STATE_FILE = "state.safetensors"
"""The name of the state file `save_train_state` writes in a run directory, which a resumed run reads."""
PICKLED_STATE = "state.pt"  # what torch.save wrote before: never loaded
FORMAT = "1"
OPTIMIZER = "optimizer."


class TrainStateError(ConfigurationError):
    """A training state file is damaged, was not written by specframe, or is a pickle."""


def save_train_state(path: Path, tensors: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                     extra: dict) -> None:
    """Write `tensors`, `optimizer`'s state and the JSON-able `extra` to `path`, atomically."""
    state = optimizer.state_dict()
    stored = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    plain: dict[str, dict] = {}
    for index, values in state["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                stored[f"{OPTIMIZER}{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                plain.setdefault(str(index), {})[name] = value
    metadata = {"format": FORMAT, "extra": json.dumps(extra),
                "optimizer": json.dumps({"param_groups": state["param_groups"], "plain": plain})}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, save(stored, metadata=metadata))


@dataclass
class TrainState:
    """A parsed state file: `extra` to check first, then `weights(...)` and `load_optimizer(...)`."""

    path: Path
    tensors: dict[str, torch.Tensor]
    extra: dict
    groups: list
    plain: dict
    hint: str

    def error(self, problem: str) -> TrainStateError:
        return TrainStateError(f"training state {self.path} {problem}; {self.hint}")

    def weights(self, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The stored model tensors, refused unless they are exactly `expected`'s names, shapes and dtypes
        (e.g. a module's `state_dict()`)."""
        found = {name: t for name, t in self.tensors.items() if not name.startswith(OPTIMIZER)}
        if set(found) != set(expected):
            odd = sorted(set(found) ^ set(expected))
            raise self.error(f"holds other tensors than this model's ({len(odd)} differ, e.g. {odd[0]!r})")
        for name, tensor in found.items():
            want = expected[name]
            if tensor.shape != want.shape or tensor.dtype != want.dtype:
                raise self.error(f"holds {name} as {tuple(tensor.shape)} {tensor.dtype}, the model has "
                                 f"{tuple(want.shape)} {want.dtype}")
        return found

    def load_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Load the stored optimizer state into `optimizer`, each tensor checked against its parameter."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state: dict[int, dict] = {}
        for name, tensor in self.tensors.items():
            if not name.startswith(OPTIMIZER):
                continue
            index, _, key = name[len(OPTIMIZER):].partition(".")
            if not index.isdigit() or int(index) >= len(params) or not key:
                raise self.error(f"holds an optimizer tensor {name!r} for no parameter of this optimizer")
            param = params[int(index)]
            if tensor.dim() and tensor.shape != param.shape:
                raise self.error(f"holds {name} of shape {tuple(tensor.shape)} for a parameter of shape "
                                 f"{tuple(param.shape)}")
            state.setdefault(int(index), {})[key] = tensor
        for index, values in self.plain.items():
            if not (index.isdigit() and int(index) < len(params) and isinstance(values, dict)):
                raise self.error(f"holds optimizer values for no parameter of this optimizer ({index!r})")
            state.setdefault(int(index), {}).update(values)
        current = optimizer.param_groups
        if len(self.groups) != len(current) or not all(isinstance(g, dict) for g in self.groups):
            raise self.error(f"holds {len(self.groups)} optimizer parameter groups, this optimizer has "
                             f"{len(current)}")
        groups = [{key: tuple(value) if isinstance(now.get(key), tuple) and isinstance(value, list) else value
                   for key, value in group.items()}  # JSON stored the tuples (betas) as lists
                  for group, now in zip(self.groups, current)]
        try:
            optimizer.load_state_dict({"state": state, "param_groups": groups})
        except (ValueError, KeyError, TypeError, RuntimeError) as err:
            raise self.error(f"holds an optimizer state of another shape ({err})") from None


def read_train_state(path: Path, hint: str) -> TrainState:
    """Parse the state file `path` that `save_train_state` wrote; `hint` says how to start afresh.
    Refuses, with `TrainStateError`, a file that is not one (a pickle, a damaged or foreign file)."""
    def refuse(problem: str) -> TrainStateError:
        return TrainStateError(f"training state {path} {problem}; {hint}")

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise refuse(f"is not a safetensors file ({err})") from None
    if metadata.get("format") != FORMAT:
        raise refuse(f"has format {metadata.get('format')!r}, not the {FORMAT!r} this specframe writes")
    try:
        extra = json.loads(metadata["extra"])
        saved = json.loads(metadata["optimizer"])
        groups, plain = saved["param_groups"], saved["plain"]
    except (KeyError, TypeError, ValueError, RecursionError) as err:
        raise refuse(f"has damaged metadata ({type(err).__name__}: {err})") from None
    if not isinstance(extra, dict) or not isinstance(groups, list) or not isinstance(plain, dict):
        raise refuse("has damaged metadata (fields of the wrong type)")
    return TrainState(path, tensors, extra, groups, plain, hint)


def refuse_pickled_state(directory: Path, hint: str) -> None:
    """Refuse a run directory whose only state is pickled (`state.pt`, written by `torch.save`): it is
    never loaded, since loading a pickle can run any code, and silently starting afresh beside it would
    look like a resume that lost its progress. `hint` says how to start afresh."""
    pickled = directory / PICKLED_STATE
    if pickled.exists() and not (directory / STATE_FILE).exists():
        raise TrainStateError(
            f"{pickled} is a pickled training state, which specframe does not load (unpickling can run "
            f"code); it resumes from {STATE_FILE} only: {hint}")
