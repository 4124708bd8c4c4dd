"""Other components a component needs, reached the one documented way: declared, then `required`.

A component that works with another (a drafter running another drafter's heads, a drafter that checks a
model the way a backend would) names it in its class's `requires`, a tuple of (kind, name) pairs:

    class SuffixHeadsDrafter(SuffixDrafter):
        name = "suffix-heads"
        requires = ((ComponentKind.DRAFTER, "s4c"),)

Assembling a pipeline checks every declared need (`specframe.plugging.registry.PluginRegistry.check_requires`)
and refuses a component whose need is missing with a `ConfigurationError` naming what to install, before any
model is built. The component then obtains the class with `required(self, "drafter", "s4c")`, which refuses a
name it did not declare: plugins import no other plugin, and no component asks the registry for another by
name behind the assembly's back. A backend never asks another whether it serves a model: the registry asks
them all (`PluginRegistry.backends_for`) and composes the advice of a refusal
(`specframe.plugging.pipeline.backend_refusal`).
"""

from __future__ import annotations

from typing import Any

from specframe.plugging.registry import PluginRegistry, get_registry, requirements
from specframe.terms.errors import ConfigurationError
from specframe.terms.kinds import ComponentKind


def required(component: Any, kind: ComponentKind | str, name: str,
             registry: PluginRegistry | None = None) -> type:
    """The class of the component `kind` `name` that `component` (a component class or instance) declares
    in its `requires`; of `registry`, default the process's.

    Raises `ConfigurationError` when `component` did not declare it (add the pair to its `requires`), or
    when it is not available (naming what to install)."""
    cls = component if isinstance(component, type) else type(component)
    wanted = (ComponentKind(kind), name)
    if wanted not in requirements(cls):
        declared = ", ".join(f"({k.value!r}, {n!r})" for k, n in requirements(cls)) or "nothing"
        raise ConfigurationError(
            f"{cls.__qualname__} asked for {wanted[0]} '{name}', which it does not declare in `requires` "
            f"(it declares {declared}): add ({wanted[0].value!r}, {name!r}) to {cls.__qualname__}.requires, "
            "so that assembly checks it is installed")
    return (registry or get_registry()).require(cls, *wanted)
