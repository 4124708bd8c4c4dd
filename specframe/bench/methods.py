"""What `--methods` accepts: pipeline specs such as `rest(c=16)+trie+greedy@16`, or named presets.

A pipeline spec is `DRAFTER[+TREE[+VERIFIER[+BACKEND]]][@BUDGET]`; each part is a component spec
(`name(key=value, ...)`) looked up in the plugin registry, so methods added by any installed plugin work
without touching this module. Missing parts default to the core's defaults (`chain`, `greedy`, `kv`); the
budget (tree nodes per step) defaults to `--budget`. A preset is a short name for a pipeline spec,
registered by a plugin through the `register_presets` hook; it is usable only when every component it
names is registered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from specframe.terms.budget import parse_budget
from specframe.terms.errors import ConfigurationError, UnknownComponentError
from specframe.contract.extensions import Preset
from specframe.terms.kinds import DEFAULT_COMPONENTS, PLAIN_DRAFTER, ComponentKind
from specframe.plugging.registry import PluginRegistry
from specframe.plugging.specs import ComponentSpec


@dataclass(frozen=True)
class MethodSpec:
    """One specframe pipeline to benchmark, under a stable label (the key of its records)."""

    label: str
    drafter: ComponentSpec
    tree: ComponentSpec
    verifier: ComponentSpec
    backend: ComponentSpec
    budget: int | str  # tree nodes, or "auto" / "auto:CAP"
    optional: bool = False  # from `all`: skipped with a warning when it cannot be built for the target
    preset: Preset | None = None  # the preset it was named by, if any

    @property
    def components(self) -> tuple[ComponentSpec, ...]:
        return (self.drafter, self.tree, self.verifier, self.backend)


SAMPLING_BASELINE_VERIFIER = "sample-match"  # with no drafts: one draw from p per token, plain sampling


def baseline_spec(backend: ComponentSpec, label: str = "baseline", greedy: bool = True) -> MethodSpec:
    """Plain decoding (drafter `none`) through `backend`: what every speedup is measured against. Sampled
    runs (`greedy` False) verify with `sample-match`, which, given no drafts, samples each token from the
    target's distribution with the request's generator, as plain sampling does."""
    verifier = DEFAULT_COMPONENTS[ComponentKind.VERIFIER] if greedy else SAMPLING_BASELINE_VERIFIER
    return MethodSpec(label, ComponentSpec(PLAIN_DRAFTER, {}),
                      ComponentSpec(DEFAULT_COMPONENTS[ComponentKind.TREE_BUILDER], {}),
                      ComponentSpec(verifier, {}), backend, budget=1)


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


def parse_method(text: str, registry: PluginRegistry, default_budget: int | str = "auto") -> MethodSpec:
    """A `MethodSpec` from a preset name or a pipeline spec; every component is looked up in `registry`."""
    label = text.strip()
    body, budget = split_budget(label)
    preset = registry.preset(body)
    if preset is not None:
        body, preset_budget = split_budget(preset.spec)
        budget = preset_budget if budget is None else budget
    budget = default_budget if budget is None else budget
    try:
        parse_budget(budget)
    except ConfigurationError as err:
        raise ConfigurationError(f"method '{label}': {err}") from None
    parts = split_parts(body)
    if len(parts) > 4 or not all(parts):
        presets = ", ".join(registry.presets.names()) or "none registered"
        raise ConfigurationError(f"method '{label}': expected DRAFTER[+TREE[+VERIFIER[+BACKEND]]][@BUDGET], "
                                 f"e.g. 'pld+chain+greedy@8', or a preset ({presets})")
    specs = [ComponentSpec.parse(p) for p in parts]
    specs += [ComponentSpec(DEFAULT_COMPONENTS[kind], {}) for kind in list(ComponentKind)[len(parts):]]
    for kind, spec in zip(ComponentKind, specs):
        try:
            registry.get(kind, spec.name)
        except UnknownComponentError as err:
            if preset:
                raise UnknownComponentError(kind, spec.name, err.known) from None
            raise
    return MethodSpec(label, *specs, budget=budget, preset=preset)


def split_budget(text: str) -> tuple[str, int | str | None]:
    """`rest+trie@16` -> ('rest+trie', 16), `pld@auto:24` -> ('pld', 'auto:24'); no '@' -> (text, None)."""
    match = re.fullmatch(r"(.*?)@\s*(\d+|auto(?::\d+)?)\s*", text.strip())
    if not match:
        return text.strip(), None
    budget = match.group(2)
    return match.group(1).strip(), int(budget) if budget.isdigit() else budget


def usable_presets(registry: PluginRegistry) -> dict[str, Preset]:
    """The registered presets whose components are all registered, by name."""
    usable = {}
    for name, preset in registry.presets.items():
        names = [ComponentSpec.parse(p).name for p in split_parts(split_budget(preset.spec)[0])]
        if all(n in registry.names(kind) for kind, n in zip(ComponentKind, names)):
            usable[name] = preset
    return usable


def resolve_methods(texts: list[str], registry: PluginRegistry,
                    default_budget: int | str = "auto") -> list[MethodSpec]:
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
