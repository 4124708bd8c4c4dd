"""Plugin discovery and the component registers.

Plugins are found through the `specframe` entry-point group, lazily (on the first lookup, never at
`import specframe`) and once. `SPECFRAME_LOAD_PLUGINS=a,b` restricts loading to those entry-point
names (an empty value loads none).
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pluggy

from specframe import hookspecs
from specframe.errors import ConfigurationError, DuplicateComponentError, UnknownComponentError
from specframe.interfaces import Drafter, StateBackend, TreeBuilder, Verifier

ENTRY_POINT_GROUP = "specframe"
KINDS = {"drafter": Drafter, "tree builder": TreeBuilder, "verifier": Verifier, "backend": StateBackend}
REGISTRATION_HOOKS = {"drafter": "register_drafters", "tree builder": "register_tree_builders",
                      "verifier": "register_verifiers", "backend": "register_state_backends"}


class ComponentRegister:
    """Name -> class for one kind of component. Refuses duplicates, names the known ones on a miss."""

    def __init__(self, kind: str, base: type):
        self.kind, self.base = kind, base
        self._classes: dict[str, type] = {}
        self._owner: dict[str, str] = {}

    def add(self, cls: type, plugin: str = "?") -> None:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"plugin '{plugin}' registered {cls!r} as a {self.kind}, "
                            f"but it is not a subclass of {self.base.__name__}")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} class {cls.__qualname__} needs a non-empty `name`")
        if name in self._classes and self._classes[name] is not cls:
            old = self._classes[name]
            raise DuplicateComponentError(
                f"{self.kind} name '{name}' is registered twice: by {old.__module__}.{old.__qualname__} "
                f"(plugin '{self._owner[name]}') and by {cls.__module__}.{cls.__qualname__} "
                f"(plugin '{plugin}'). Rename one, or limit loading with SPECFRAME_LOAD_PLUGINS."
            )
        self._classes[name] = cls
        self._owner[name] = plugin

    def get(self, name: str) -> type:
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownComponentError(self.kind, name, list(self._classes)) from None

    def names(self) -> list[str]:
        return sorted(self._classes)

    def owner(self, name: str) -> str:
        return self._owner[name]


class PluginRegistry:
    """Holds the pluggy plugin manager and one `ComponentRegister` per interface."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.registers = {kind: ComponentRegister(kind, base) for kind, base in KINDS.items()}
        self._loaded = False
        self.distributions: dict[str, str] = {}  # plugin name -> "dist==version"

    # --- loading -----------------------------------------------------------------------------------

    def register_plugin(self, plugin: Any, name: str | None = None) -> None:
        """Add a plugin object (a module or class with hookimpls) directly, e.g. in tests or notebooks."""
        self.pm.register(plugin, name=name)
        if self._loaded:
            self._collect([self.pm.get_name(plugin) or name or repr(plugin)])

    def load(self) -> None:
        """Load entry points and collect component classes, once."""
        if self._loaded:
            return
        self._loaded = True
        wanted = os.environ.get("SPECFRAME_LOAD_PLUGINS")
        allow = None if wanted is None else {w.strip() for w in wanted.split(",") if w.strip()}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if allow is not None and ep.name not in allow:
                continue
            if self.pm.has_plugin(ep.name):
                continue
            self.pm.register(ep.load(), name=ep.name)
            dist = ep.dist
            self.distributions[ep.name] = f"{dist.name}=={dist.version}" if dist else "?"
        self._collect([name for name, _ in self.pm.list_name_plugin()])

    def _collect(self, plugin_names: list[str]) -> None:
        """Call the registration hooks of the named plugins, remembering which plugin gave what."""
        for kind, hook_name in REGISTRATION_HOOKS.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin_name in plugin_names:
                    register = self.registers[kind]
                    impl.function(register=lambda cls, _r=register, _p=impl.plugin_name: _r.add(cls, _p))

    # --- lookup ------------------------------------------------------------------------------------

    def get(self, kind: str, name: str) -> type:
        self.load()
        return self.registers[kind].get(name)

    def names(self, kind: str) -> list[str]:
        self.load()
        return self.registers[kind].names()

    @property
    def hook(self):
        self.load()
        return self.pm.hook

    def describe(self) -> dict[str, Any]:
        """Installed plugins with their components and versions (what `specframe plugins` prints)."""
        self.load()
        plugins: dict[str, dict[str, Any]] = {}
        for name, _ in self.pm.list_name_plugin():
            plugins[name] = {"name": name, "version": self.distributions.get(name, "builtin"),
                             "components": {}}
        for kind, register in self.registers.items():
            for comp in register.names():
                entry = plugins.setdefault(register.owner(comp), {"name": register.owner(comp),
                                                                  "version": "?", "components": {}})
                entry["components"].setdefault(kind + "s", []).append(comp)
        return {"plugins": sorted(plugins.values(), key=lambda p: p["name"]),
                "components": {kind + "s": reg.names() for kind, reg in self.registers.items()}}


_registry: PluginRegistry | None = None


def get_registry() -> PluginRegistry:
    """The process-wide registry (created on first use)."""
    global _registry
    if _registry is None:
        _registry = PluginRegistry()
    return _registry


@dataclass(frozen=True)
class ComponentSpec:
    """A component named with options, parsed from text like `rest(c=16, live=True)`."""

    name: str
    options: dict[str, Any]

    @classmethod
    def parse(cls, text: str) -> ComponentSpec:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.:-]+)\s*(?:\((.*)\))?\s*", text)
        if not match:
            raise ConfigurationError(f"cannot parse component spec '{text}': use NAME or NAME(key=value, ...)")
        name, args = match.group(1), match.group(2)
        options: dict[str, Any] = {}
        if args and args.strip():
            try:
                call = ast.parse(f"f({args})", mode="eval").body
                assert isinstance(call, ast.Call) and not call.args
                for kw in call.keywords:
                    value = kw.value
                    options[kw.arg] = (ast.literal_eval(value) if not isinstance(value, ast.Name)
                                       else value.id)  # bare words are strings: tree(preset=medusa)
            except (SyntaxError, ValueError, AssertionError):
                raise ConfigurationError(
                    f"cannot parse options of '{text}': use key=value pairs, e.g. {name}(c=16)") from None
        return cls(name, options)
