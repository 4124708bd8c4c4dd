"""Plugin discovery and the registers of components, bench presets and command-line options.

Plugins are found through the `specframe` entry-point group, lazily (on the first lookup, never at
`import specframe`) and once. `SPECFRAME_LOAD_PLUGINS=a,b` restricts loading to those entry-point
names (an empty value loads none), except the plugins providing the core's defaults (`DEFAULT_PLUGINS`,
transformers' bench peers among them), which always load: the core names their components itself.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import pluggy

from specframe.contract import hookspecs
from specframe.terms.errors import (
    ConfigurationError, DuplicateComponentError, SpecframeError, UnknownComponentError,
)
from specframe.contract.extensions import CliOption, ModelRecipe, Preset
from specframe.contract.interfaces import Drafter, StateBackend, TreeBuilder, Verifier
from specframe.contract.peers import Peer
from specframe.terms.kinds import ComponentKind

ENTRY_POINT_GROUP = "specframe"
DISTRIBUTION = "specframe"
# Entry points of this distribution that provide `kinds.DEFAULT_COMPONENTS` (and the plain drafter `none`),
# and transformers' bench peers (`specframe.bench.peers`, registered by entry point as any plugin is).
DEFAULT_PLUGINS = ("kv", "pld", "trees", "verify", "hf-peers")
KINDS = {ComponentKind.DRAFTER: Drafter, ComponentKind.TREE_BUILDER: TreeBuilder,
         ComponentKind.VERIFIER: Verifier, ComponentKind.BACKEND: StateBackend}


class ComponentRegister:
    """Name -> class for one kind of component. Refuses duplicates, names the known ones on a miss, and
    explains a name that a refused plugin would have provided."""

    def __init__(self, kind: str, base: type, label: Callable[[str], str] = lambda p: f"plugin '{p}'",
                 note: Callable[[], str] = lambda: ""):
        self.kind, self.base = kind, base
        self._label, self._note = label, note  # how a plugin is named; what limited loading
        self._classes: dict[str, Any] = {}
        self._owner: dict[str, str] = {}
        self._unavailable: dict[str, SpecframeError] = {}  # name -> why asking for it fails

    def add(self, item: Any, plugin: str = "?") -> str:
        name = self.name_of(item, plugin)
        if name in self._classes and self._classes[name] is not item:
            raise DuplicateComponentError(self._clash(name, item, plugin)
                                          + " Rename one, or limit loading with SPECFRAME_LOAD_PLUGINS.")
        self._classes[name] = item
        self._owner[name] = plugin
        return name

    def _clash(self, name: str, item: Any, plugin: str) -> str:
        old = self._classes[name]
        return (f"{self.kind} name '{name}' is registered twice: by {self._describe(old)} "
                f"({self._label(self._owner[name])}) and by {self._describe(item)} ({self._label(plugin)}).")

    def name_of(self, cls: Any, plugin: str) -> str:
        """The name `cls` registers under; raises `TypeError` when it is no registrable class."""
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"plugin '{plugin}' registered {cls!r} as a {self.kind}, "
                            f"but it is not a subclass of {self.base.__name__}")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} class {cls.__qualname__} needs a non-empty `name`")
        requirements(cls)  # a malformed `requires` is refused at registration, not at first use
        return name

    @staticmethod
    def _describe(cls: Any) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    def refused(self, item: Any, plugin: str, why: str, protected: Callable[[str], bool]) -> None:
        """Remember that the refused `plugin` would have registered `item`, so that asking for its name
        fails saying why rather than "unknown". A name another plugin holds becomes ambiguous: asking for
        it raises `DuplicateComponentError` naming both, unless `protected(owner)` (the core's defaults)."""
        try:
            name = self.name_of(item, plugin)
        except (TypeError, AttributeError):
            return
        if name in self._classes:
            if self._classes[name] is not item and not protected(self._owner[name]):
                self._unavailable[name] = DuplicateComponentError(
                    self._clash(name, item, plugin) + f" {self._label(plugin)} was refused and "
                    f"{self._label(self._owner[name])} loaded, so '{name}' would mean whichever loaded "
                    "first; uninstall or rename one, or choose one with SPECFRAME_LOAD_PLUGINS.")
            return
        self._unavailable.setdefault(name, UnknownComponentError(
            self.kind, name, list(self._classes),
            unavailable=f"{self._label(plugin)} provides it but was not loaded: {why}"))

    def remove(self, name: str) -> None:
        self._classes.pop(name, None)
        self._owner.pop(name, None)

    def get(self, name: str) -> type:
        if name in self._unavailable:
            raise self._unavailable[name]
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownComponentError(self.kind, name, list(self._classes), self._note()) from None

    def names(self) -> list[str]:
        return sorted(self._classes)

    def registered(self) -> list[str]:
        """The names in the order they were registered."""
        return list(self._classes)

    def owner(self, name: str) -> str:
        return self._owner[name]

    def items(self) -> list[tuple[str, Any]]:
        return sorted(self._classes.items())


class RecordRegister(ComponentRegister):
    """Name -> record (a `Preset` by name, a `CliOption` by flag), with the same refusals."""

    def __init__(self, kind: str, record: type, key: str, **labels: Any):
        super().__init__(kind, record, **labels)
        self.key = key

    def name_of(self, item: Any, plugin: str) -> str:
        if not isinstance(item, self.base):
            raise TypeError(f"plugin '{plugin}' registered {item!r} as a {self.kind}, but it is not a "
                            f"specframe.{self.base.__name__}")
        return getattr(item, self.key)

    @staticmethod
    def _describe(item: Any) -> str:
        return repr(item)


class PluginRegistry:
    """Holds the pluggy plugin manager and one `ComponentRegister` per interface."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        labels = {"label": self._label, "note": self._loading_note}
        self.registers = {kind: ComponentRegister(kind, base, **labels) for kind, base in KINDS.items()}
        self._presets = RecordRegister("preset", Preset, "name", **labels)
        self._cli_options = RecordRegister("command-line option", CliOption, "flag", **labels)
        self._models = RecordRegister("model alias", ModelRecipe, "name", **labels)
        self._peers = ComponentRegister("peer", Peer, **labels)
        self._loaded = False
        self.distributions: dict[str, str] = {}  # plugin name -> "dist==version"
        self.failures: dict[str, str] = {}  # plugin name -> why it could not be loaded

    # --- loading -----------------------------------------------------------------------------------

    def register_plugin(self, plugin: Any, name: str | None = None) -> None:
        """Add a plugin object (a module or class with hookimpls) directly, e.g. in tests or notebooks.

        Raises `ConfigurationError` for a hook implementation no hook specification matches (a misspelled
        hook name), and once loading has happened, the registration's own errors (a duplicate name)."""
        name = self.pm.register(plugin, name=name)
        try:
            self._check_hooks(name)
        except ConfigurationError:
            self.pm.unregister(name=name)
            raise
        if self._loaded:
            self._collect([self.pm.get_name(plugin) or name or repr(plugin)], strict=True)

    def load(self) -> None:
        """Load entry points and collect component classes, once.

        A plugin that fails to import or to register is recorded in `failures` (shown by `specframe
        plugins` and in unknown-name errors) and skipped; every other plugin stays usable. The plugins
        providing the defaults load first, so a plugin reusing one of their names is the one refused.
        """
        if self._loaded:
            return
        wanted = os.environ.get("SPECFRAME_LOAD_PLUGINS")
        allow = None if wanted is None else {w.strip() for w in wanted.split(",") if w.strip()}
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: not _provides_defaults(ep)):
            skipped = allow is not None and ep.name not in allow and not _provides_defaults(ep)
            if skipped or self.pm.has_plugin(ep.name):
                continue
            dist = ep.dist
            self.distributions[ep.name] = f"{dist.name}=={dist.version}" if dist else "?"
            try:
                self.pm.register(ep.load(), name=ep.name)
                self._check_hooks(ep.name)
            except Exception as err:  # a broken plugin must not take the others down
                if self.pm.has_plugin(ep.name):
                    self.pm.unregister(name=ep.name)
                self.failures[ep.name] = f"{type(err).__name__}: {err}"
        self._loaded = True
        self._collect([name for name, _ in self.pm.list_name_plugin()])

    def _check_hooks(self, plugin: str) -> None:
        """Refuse a plugin implementing a hook that no specification declares, such as a misspelled
        `register_drafterz`: pluggy keeps such an implementation without calling it (its
        `PluginManager.check_pending` finds them), so the plugin would load and register nothing."""
        specified = [name for name in vars(self.pm.hook) if self.pm.hook.__dict__[name].has_spec()]
        for hook_name, caller in vars(self.pm.hook).items():
            if hook_name.startswith("_") or caller.has_spec():
                continue
            if any(impl.plugin_name == plugin and not impl.optionalhook for impl in caller.get_hookimpls()):
                close = difflib.get_close_matches(hook_name, specified, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ConfigurationError(
                    f"plugin '{plugin}' implements '{hook_name}', which is no specframe hook: {hint}the "
                    f"hooks are {', '.join(sorted(specified))} (see docs/reference/hooks.md)")

    def _collect(self, plugin_names: list[str], strict: bool = False) -> None:
        """Call the registration hooks of the named plugins, remembering which plugin gave what.

        A plugin whose registration fails (a duplicate name, a class of the wrong kind, a malformed
        preset) is removed whole and recorded in `failures`, and the names it would have registered are
        remembered, so that asking for one says why it is missing; with `strict` the error is raised
        after the removal.
        """
        for name in plugin_names:
            offered: list[tuple[ComponentRegister, Any]] = []
            added: list[tuple[ComponentRegister, str]] = []
            try:
                self._call_registration_hooks(name, offered)
                for register, item in offered:
                    added.append((register, register.add(item, name)))
            except Exception as err:
                for register, item in added:
                    register.remove(item)
                self.pm.unregister(name=name)
                if strict:
                    raise
                why = f"{type(err).__name__}: {err}"
                self.failures[name] = why
                for register, item in offered:
                    register.refused(item, name, why, protected=_is_core_plugin)

    def _call_registration_hooks(self, plugin: str, offered: list[tuple[ComponentRegister, Any]]) -> None:
        """Run `plugin`'s registration hooks; every (register, item) it offers is appended to `offered`."""
        hooks = [(kind.registration_hook, self.registers[kind]) for kind in KINDS]
        hooks += [("register_presets", self._presets), ("register_cli_options", self._cli_options),
                  ("register_models", self._models), ("register_peers", self._peers)]
        for hook_name, target in hooks:
            def register(item, _target=target):
                offered.append((_target, item))

            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin_name == plugin:
                    impl.function(register=register)

    def _label(self, plugin: str) -> str:
        """How messages name a plugin: its entry point and, when installed, its distribution."""
        dist = self.distributions.get(plugin)
        return f"plugin '{plugin}' ({dist})" if dist and dist != "?" else f"plugin '{plugin}'"

    def _loading_note(self) -> str:
        """What limited or broke plugin loading, for unknown-name errors ('' when nothing did)."""
        notes = []
        wanted = os.environ.get("SPECFRAME_LOAD_PLUGINS")
        if wanted is not None:
            notes.append(f"SPECFRAME_LOAD_PLUGINS={wanted!r} limits which plugins load; unset it to load all")
        notes += [f"{self._label(p)} failed to load ({why})" for p, why in sorted(self.failures.items())]
        return "; ".join(notes)

    def call_each(self, hook_name: str, **kwargs: Any) -> None:
        """Call every implementation of a hook; one that raises is recorded in `failures` (with the hook's
        name) instead of stopping the others, e.g. a broken `register_commands` must not break the CLI."""
        self.load()
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            try:
                impl.function(**kwargs)
            except Exception as err:  # a broken plugin must not take the others down
                self.failures[impl.plugin_name] = f"{hook_name}: {type(err).__name__}: {err}"

    # --- lookup ------------------------------------------------------------------------------------

    def get(self, kind: ComponentKind | str, name: str) -> type:
        self.load()
        return self.registers[ComponentKind(kind)].get(name)

    def names(self, kind: ComponentKind | str) -> list[str]:
        self.load()
        return self.registers[ComponentKind(kind)].names()

    def backends_for(self, target: Any) -> dict[str, str | None]:
        """Which registered backends serve `target`, in registration order: name -> None where one does,
        else its `unsupported_reason`. Each backend is asked once and speaks for itself only; a check that
        raises answers with its error, so one broken backend cannot hide what the others say."""
        answers: dict[str, str | None] = {}
        names = self.registered(ComponentKind.BACKEND)  # loads the plugins
        classes = dict(self.registers[ComponentKind.BACKEND].items())
        for name in names:
            try:
                answers[name] = classes[name].unsupported_reason(target)
            except Exception as err:  # a broken plugin must not take the others down
                answers[name] = f"its check failed ({type(err).__name__}: {err})"
        return answers

    def registered(self, kind: ComponentKind | str) -> list[str]:
        """The names of `kind` in the order they were registered (the defaults' plugins first)."""
        self.load()
        return self.registers[ComponentKind(kind)].registered()

    def check_requires(self, cls: type) -> None:
        """Refuse (`ConfigurationError`) a component class whose declared `requires` are not all
        available, naming what to install: checked when a pipeline is assembled."""
        for kind, name in requirements(cls):
            self.require(cls, kind, name)

    def require(self, cls: type, kind: ComponentKind | str, name: str) -> type:
        """The class of the component `kind` `name` that `cls` needs, or `ConfigurationError` saying that
        `cls` needs it and how to get it. Plugins call `specframe.kit.components.required`, which also
        refuses a name `cls` did not declare."""
        kind = ComponentKind(kind)
        try:
            return self.get(kind, name)
        except SpecframeError as err:
            raise ConfigurationError(
                f"{self._describe_component(cls)} needs {kind} '{name}' (it declares it in `requires`), "
                f"which is not available: {err} Install (or stop excluding) the plugin that provides {kind} "
                f"'{name}', or choose another {_kind_of(cls) or 'component'}"
            ) from None

    def _describe_component(self, cls: type) -> str:
        """"drafter 'suffix-heads' (plugin 'suffix')", for messages about `cls`."""
        kind = _kind_of(cls)
        name = getattr(cls, "name", cls.__qualname__)
        if kind is None:
            return f"component '{name}'"
        register = self.registers[kind]
        owned = dict(register.items()).get(name) is cls
        return f"{kind} '{name}'" + (f" ({self._label(register.owner(name))})" if owned else "")

    @property
    def presets(self) -> RecordRegister:
        """Bench presets by name (`Preset` records)."""
        self.load()
        return self._presets

    @property
    def cli_options(self) -> RecordRegister:
        """Options of `specframe generate` and `bench` by flag (`CliOption` records)."""
        self.load()
        return self._cli_options

    @property
    def models(self) -> RecordRegister:
        """Model aliases that plugins build on first use (`ModelRecipe` records), by name."""
        self.load()
        return self._models

    @property
    def peers(self) -> ComponentRegister:
        """Bench peers by name (`Peer` subclasses), for `specframe bench --peers`."""
        self.load()
        return self._peers

    def preset(self, name: str) -> Preset | None:
        """The preset registered under `name`, or None."""
        return dict(self.presets.items()).get(name)

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
        for key, register in (("presets", self.presets), ("options", self.cli_options),
                              ("models", self.models), ("peers", self.peers)):
            for item in register.names():
                owner = register.owner(item)
                entry = plugins.setdefault(owner, {"name": owner, "version": "?", "components": {}})
                entry.setdefault(key, []).append(item)
        return {"plugins": sorted(plugins.values(), key=lambda p: p["name"]),
                "components": {kind + "s": reg.names() for kind, reg in self.registers.items()},
                "presets": {name: preset.spec for name, preset in self.presets.items()},
                "peers": self.peers.names(),
                "failed": dict(sorted(self.failures.items()))}


_registry: PluginRegistry | None = None


def requirements(cls: type) -> tuple[tuple[ComponentKind, str], ...]:
    """The components `cls` declares it needs (its `requires`), as (kind, name) pairs; `TypeError` when
    the declaration is malformed."""
    declared = getattr(cls, "requires", ())
    try:
        pairs = tuple((ComponentKind(kind), name) for kind, name in declared)
        if all(isinstance(name, str) and name for _, name in pairs):
            return pairs
    except (TypeError, ValueError):
        pass
    kinds = ", ".join(repr(k.value) for k in ComponentKind)
    raise TypeError(f"{cls.__qualname__}.requires must be a tuple of (kind, name) pairs, the kind one of "
                    f"{kinds} and the name a non-empty string, e.g. (('drafter', 's4c'),); got {declared!r}")


def _kind_of(cls: type) -> ComponentKind | None:
    """The kind of component `cls` is, or None."""
    kinds = [kind for kind, base in KINDS.items() if isinstance(cls, type) and issubclass(cls, base)]
    return kinds[0] if kinds else None


def _is_core_plugin(plugin: str) -> bool:
    """Whether `plugin` provides the core's defaults, whose names nobody may take."""
    return plugin in DEFAULT_PLUGINS


def _provides_defaults(ep) -> bool:
    """Whether entry point `ep` is one of this distribution's plugins providing the core's defaults."""
    return ep.name in DEFAULT_PLUGINS and ep.dist is not None and ep.dist.name == DISTRIBUTION


def get_registry() -> PluginRegistry:
    """The process-wide registry (created on first use)."""
    global _registry
    if _registry is None:
        _registry = PluginRegistry()
    return _registry
