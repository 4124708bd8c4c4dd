"""What plugins add besides components: bench presets, command-line options and model aliases.

All are plain records, registered through the `register_presets`, `register_cli_options` and
`register_models` hooks and
collected with the components: a plugin whose records are malformed or clash with another's is refused
whole, like one whose components do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from specframe.terms.errors import ConfigurationError
from specframe.terms.kinds import ComponentKind

if TYPE_CHECKING:
    from specframe.terms.target import Target

COMMANDS = ("generate", "bench")  # the commands plugins may add options to
OPTION_TYPES = (str, int, float, bool, Path)


@dataclass(frozen=True)
class Preset:
    """A short name for a pipeline spec in `specframe bench --methods`, and one of the methods of `all`.

    `spec` is `DRAFTER[+TREE[+VERIFIER[+BACKEND]]][@BUDGET]`. The preset is offered only when every
    component it names is registered. `unusable(target)`, if given, says why the preset cannot run on
    `target` (e.g. "no datastore: pass --datastore"), or returns None when it can: `all` then skips the
    preset with a warning naming the reason, and `--methods NAME` fails with it.
    """

    name: str
    spec: str
    unusable: Callable[[Target], str | None] | None = None
    help: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", self.name or ""):
            raise ConfigurationError(f"preset name {self.name!r} must be a word of letters, digits, '_', "
                                     "'.', ':' or '-' (no '+', '@' or parentheses)")
        if not self.spec.strip():
            raise ConfigurationError(f"preset '{self.name}' needs a pipeline spec, e.g. 'pld+chain+greedy'")


@dataclass(frozen=True)
class ModelRecipe:
    """A model alias that a plugin builds on first use, as the GGUF aliases are converted.

    `build(directory, log)` writes a model that transformers loads (`save_pretrained` of a model and its
    tokenizer) into `directory`, an empty temporary directory; `log(line)` reports progress. The core calls
    it once, holding a lock, and renames the directory into the model cache (`specframe.runtime.load`), so a
    build killed mid-way leaves nothing behind that is mistaken for a model. `minutes` is the build's
    expected duration on a CPU, shown before it starts.
    """

    name: str
    build: Callable[[Path, Callable[[str], None]], None]
    help: str = ""
    minutes: float = 1.0

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name or "") or "/" in self.name:
            raise ConfigurationError(f"model alias {self.name!r} must be a word of letters, digits, '_', '.' "
                                     "or '-' (a '/' would read as a Hugging Face id)")


@dataclass(frozen=True)
class CliOption:
    """An option a plugin adds to `specframe generate` and `specframe bench` (or those in `commands`).

    The value applies in one of two ways, named by the record: exported as the environment variable
    `envvar` while the command runs (for the plugin's components to read), or passed as the constructor
    option `option` of the component `component` of `kind`, wherever a pipeline of the command uses that
    component and its spec does not set the option itself. A value left at `default` None applies nothing.
    `type` is one of str, int, float, bool, Path.
    """

    flag: str
    help: str
    type: type = str
    default: Any = None
    envvar: str | None = None
    component: str | None = None
    option: str | None = None
    kind: ComponentKind = ComponentKind.DRAFTER
    commands: tuple[str, ...] = COMMANDS

    def __post_init__(self) -> None:
        if not re.fullmatch(r"--[a-z][a-z0-9-]*", self.flag or ""):
            raise ConfigurationError(f"option flag {self.flag!r} must look like '--name' (lower-case "
                                     "letters, digits and '-')")
        by_component = self.component is not None and self.option is not None
        if (self.envvar is not None) == by_component:
            raise ConfigurationError(f"option {self.flag} must say how its value applies: give envvar=NAME, "
                                     "or component=NAME and option=NAME (not both)")
        if self.type not in OPTION_TYPES:
            raise ConfigurationError(f"option {self.flag}: type must be one of "
                                     f"{', '.join(t.__name__ for t in OPTION_TYPES)}, got {self.type!r}")
        unknown = set(self.commands) - set(COMMANDS)
        if unknown or not self.commands:
            raise ConfigurationError(f"option {self.flag}: commands must be among {', '.join(COMMANDS)}, "
                                     f"got {', '.join(self.commands) or 'none'}")
        object.__setattr__(self, "kind", ComponentKind(self.kind))

    @property
    def dest(self) -> str:
        """The Python name of the option's value: `--datastore-dir` -> `datastore_dir`."""
        return self.flag[2:].replace("-", "_")


_option_defaults: ContextVar[Mapping[tuple[ComponentKind, str], dict[str, Any]]] = ContextVar(
    "specframe_option_defaults", default=MappingProxyType({}))


def option_defaults(kind: ComponentKind | str, name: str) -> dict[str, Any]:
    """Options that plugin command-line options give the component `name` of `kind` (empty outside a
    command, or when none was given); options of the component's own spec override them."""
    return dict(_option_defaults.get().get((ComponentKind(kind), name), {}))


@contextmanager
def applied(values: dict[CliOption, Any]) -> Iterator[None]:
    """Apply the given option values while the block runs: export environment variables and set
    component option defaults; both are restored afterwards."""
    defaults: dict[tuple[ComponentKind, str], dict[str, Any]] = {}
    saved: dict[str, str | None] = {}
    for option, value in values.items():
        if value is None:
            continue
        if option.envvar is not None:
            saved.setdefault(option.envvar, os.environ.get(option.envvar))
            os.environ[option.envvar] = str(value)
        else:
            defaults.setdefault((option.kind, option.component), {})[option.option] = value
    token = _option_defaults.set(defaults)
    try:
        yield
    finally:
        _option_defaults.reset(token)
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
