"""What `--methods` accepts: pipeline specs such as `rest(c=16)+trie+greedy@16`, or named presets.

A pipeline spec is `DRAFTER[+TREE[+VERIFIER[+BACKEND]]][@BUDGET]`; each part is a component spec
(`name(key=value, ...)`) looked up in the plugin registry, so methods added by any installed plugin work
without touching this module. Missing parts default to `chain`, `greedy` and `kv`; the budget (tree nodes
per step) defaults to `--budget`. A preset is a short name for a pipeline spec; it is usable only when
every component it names is registered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from specframe.errors import ConfigurationError, UnknownComponentError
from specframe.registry import ComponentSpec, PluginRegistry

KINDS = ("drafter", "tree builder", "verifier", "backend")
DEFAULTS = ("none", "chain", "greedy", "kv")

# Named pipelines. Each is usable only when the plugins providing its components are installed.
# `rest` reads $SPECFRAME_DATASTORE; `s4c` the heads shipped for the model.
PRESETS = {
    "pld": "pld+chain+greedy",
    "pld-trie": "pld(matches=4)+trie+greedy",
    "rest": "rest+trie+greedy",
    "rest-live": "rest(live=1)+trie+greedy",
    "s4c": "s4c+static+greedy",
    "draft-model": "draft-model(layers=8)+chain+greedy",
}


@dataclass(frozen=True)
class MethodSpec:
    """One specframe pipeline to benchmark, under a stable label (the key of its records)."""

    label: str
    drafter: ComponentSpec
    tree: ComponentSpec
    verifier: ComponentSpec
    backend: ComponentSpec
    budget: int
    optional: bool = False  # from `all`: skipped with a warning when it cannot be built for the target

    @property
    def components(self) -> tuple[ComponentSpec, ...]:
        return (self.drafter, self.tree, self.verifier, self.backend)


def baseline_spec(backend: ComponentSpec, label: str = "baseline") -> MethodSpec:
    """Plain decoding (drafter `none`) through `backend`: what every speedup is measured against."""
    return MethodSpec(label, ComponentSpec("none", {}), ComponentSpec("chain", {}),
                      ComponentSpec("greedy", {}), backend, budget=1)


def split_parts(text: str, sep: str = "+") -> list[str]:
    """Split on `sep` outside parentheses: `rest(w=a+b)+trie` -> ['rest(w=a+b)', 'trie']."""
    parts, depth, current = [], 0, []
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == sep and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


def parse_method(text: str, registry: PluginRegistry, default_budget: int = 8) -> MethodSpec:
    """A `MethodSpec` from a preset name or a pipeline spec; every component is looked up in `registry`."""
    label = text.strip()
    match = re.fullmatch(r"(.*?)@\s*(\d+)\s*", label)
    body, budget = (match.group(1).strip(), int(match.group(2))) if match else (label, default_budget)
    if budget < 1:
        raise ConfigurationError(f"method '{label}': the budget after '@' must be >= 1 tree node")
    preset = PRESETS.get(body)
    parts = split_parts(preset if preset else body)
    if len(parts) > 4 or not all(parts):
        raise ConfigurationError(f"method '{label}': expected DRAFTER[+TREE[+VERIFIER[+BACKEND]]][@BUDGET], "
                                 f"e.g. 'pld+chain+greedy@8', or a preset ({', '.join(PRESETS)})")
    specs = [ComponentSpec.parse(p) for p in parts] + [ComponentSpec(d, {}) for d in DEFAULTS[len(parts):]]
    for kind, spec in zip(KINDS, specs):
        try:
            registry.get(kind, spec.name)
        except UnknownComponentError as err:
            if preset:
                raise UnknownComponentError(kind, spec.name, err.known) from None
            raise
    return MethodSpec(label, *specs, budget=budget)


def usable_presets(registry: PluginRegistry) -> dict[str, str]:
    """Preset name -> spec, for the presets whose components are all registered."""
    usable = {}
    for name, spec in PRESETS.items():
        names = [ComponentSpec.parse(p).name for p in split_parts(spec)]
        if all(n in registry.names(kind) for kind, n in zip(KINDS, names)):
            usable[name] = spec
    return usable


def resolve_methods(texts: list[str], registry: PluginRegistry, default_budget: int = 8) -> list[MethodSpec]:
    """Parse `--methods`; `all` expands to every usable preset (those that then fail to build for the
    target, e.g. `rest` without a datastore, are skipped with a warning). Duplicated labels are refused."""
    methods: list[MethodSpec] = []
    for text in texts:
        if text.strip() == "all":
            methods += [replace(parse_method(name, registry, default_budget), optional=True)
                        for name in usable_presets(registry)]
        else:
            methods.append(parse_method(text, registry, default_budget))
    labels = [m.label for m in methods]
    duplicates = sorted({x for x in labels if labels.count(x) > 1} | ({"baseline"} & set(labels)))
    if duplicates:
        raise ConfigurationError(f"method labels must be unique and not 'baseline': {', '.join(duplicates)} "
                                 "(the plain-decoding baseline always runs)")
    return methods
