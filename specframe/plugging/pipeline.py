"""Assembling a pipeline from component names, with capability checks that fail loudly.

The backend is built with the calibration stored for it handed down (`specframe.plugging.calibration`);
`calibrate_pipeline` is the one place a calibration measured after assembly reaches a pipeline: by a new
backend built with it, never by changing the one built before.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specframe.terms.cost import MeasuredCost
from specframe.terms.errors import CapabilityError, SpecframeWarning, UnsupportedModelError
from specframe.contract.calibration import Calibration
from specframe.contract.extensions import option_defaults
from specframe.contract.interfaces import Drafter, StateBackend, TreeBuilder, Verifier
from specframe.terms.kinds import DEFAULT_COMPONENTS, ComponentKind
from specframe.terms.target import Target
from specframe.plugging.calibration import Build, build_calibrated, cached_cost
from specframe.plugging.options import check_options
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.plugging.specs import ComponentSpec
from specframe.terms.sampling import SamplingParams

Component = str | ComponentSpec | type  # a name, a name with options (`pld(max_ngram=4)`), or a class


@dataclass
class Pipeline:
    """The four components of one speculative decoder, already checked to fit together."""

    drafter: Drafter
    tree_builder: TreeBuilder
    verifier: Verifier
    backend: StateBackend
    # How `assemble` built the backend, to build it again with a calibration measured after assembly
    # (`calibrate_pipeline`); None for a pipeline put together by hand, or a backend whose constructor
    # takes no calibration.
    build_backend: Build | None = field(default=None, repr=False, compare=False)
    # (component classes, greedy) already found to fit: `check_request` checks each mode once
    checked: set[tuple] = field(default_factory=set, init=False, repr=False, compare=False)


def check_compatible(target: Target, drafter: type[Drafter], tree: type[TreeBuilder],
                     verifier: type[Verifier], backend: type[StateBackend],
                     sampling: SamplingParams, registry: PluginRegistry | None = None) -> None:
    """Raise `CapabilityError` listing every mismatch between the chosen component classes, each with the
    registered components (of `registry`, default the process's) that would fit instead."""
    registry = registry or get_registry()
    verifiers = functools.partial(such_as, registry, ComponentKind.VERIFIER)  # hints: which would fit
    trees = functools.partial(such_as, registry, ComponentKind.TREE_BUILDER)
    check_serves(target, backend, registry)
    problems = []
    d, t, v, b = drafter.capabilities, tree.capabilities, verifier.capabilities, backend.capabilities
    if d.needs_hidden_states and not b.provides_hidden_states:
        problems.append(f"drafter '{drafter.name}' needs target hidden states, which backend "
                        f"'{backend.name}' does not provide")
    if v.needs_draft_probs and not d.provides_draft_probs:
        problems.append(f"verifier '{verifier.name}' needs draft probabilities, which drafter "
                        f"'{drafter.name}' does not provide (use a verifier that does not need them"
                        f"{verifiers(lambda c: not c.needs_draft_probs)})")
    if v.needs_draft_probs and not t.keeps_draft_probs:
        problems.append(f"verifier '{verifier.name}' needs draft probabilities, which tree builder "
                        f"'{tree.name}' drops")
    if t.needs_score_kind is not None and d.score_kind is not t.needs_score_kind:
        problems.append(f"tree builder '{tree.name}' ranks nodes by {t.needs_score_kind.value} scores, but "
                        f"drafter '{drafter.name}' scores by {d.score_kind.value}; use a tree builder that "
                        f"takes any score{trees(lambda c: c.needs_score_kind is None)}")
    if not b.supports_trees and d.proposes_trees and not t.makes_chains:
        problems.append(f"backend '{backend.name}' scores chains only, but drafter '{drafter.name}' proposes "
                        f"trees and tree builder '{tree.name}' may keep them; use a tree builder that makes "
                        f"chains{trees(lambda c: c.makes_chains)}")
    if t.needs_draft_probs and not d.provides_draft_probs:
        problems.append(f"tree builder '{tree.name}' expands by draft probabilities, which drafter "
                        f"'{drafter.name}' does not provide")
    problems += sampling_problems(drafter, tree, verifier, sampling, registry)
    if problems:
        raise CapabilityError("these components do not fit together: " + "; ".join(problems))
    warn_if_lossy(verifier, sampling, registry, stacklevel=4)  # the caller of `assemble`


def check_request(pipeline: Pipeline, sampling: SamplingParams,
                  registry: PluginRegistry | None = None) -> None:
    """Refuse (`CapabilityError`) a request whose `sampling` the components of `pipeline` cannot serve
    losslessly, and warn where its verifier is lossy at that sampling: what `check_compatible` checks of
    the sampling, checked again for each request, since a decoder's sampling may change after assembly.
    Each set of component classes is checked once per mode (greedy or sampling)."""
    classes = tuple(type(c) for c in (pipeline.drafter, pipeline.tree_builder, pipeline.verifier))
    key = (*classes, type(pipeline.backend), sampling.greedy)
    if key in pipeline.checked:
        return
    registry = registry or get_registry()
    problems = sampling_problems(*classes, sampling, registry)
    if problems:
        raise CapabilityError(f"these components cannot serve a request at temperature "
                              f"{sampling.temperature}: " + "; ".join(problems))
    warn_if_lossy(classes[2], sampling, registry, stacklevel=5)  # the caller of `generate`
    pipeline.checked.add(key)


def sampling_problems(drafter: type[Drafter], tree: type[TreeBuilder], verifier: type[Verifier],
                      sampling: SamplingParams, registry: PluginRegistry) -> list[str]:
    """The mismatches between the component classes that depend on `sampling`, each with the registered
    components that would fit instead."""
    if sampling.greedy:
        return []
    verifiers = functools.partial(such_as, registry, ComponentKind.VERIFIER)  # hints: which would fit
    trees = functools.partial(such_as, registry, ComponentKind.TREE_BUILDER)
    d, t, v = drafter.capabilities, tree.capabilities, verifier.capabilities
    problems = []
    if v.uses_draft_probs and d.samples_drafts and not (t.keeps_draw_order and t.keeps_draft_probs):
        problems.append(
            f"tree builder '{tree.name}' chooses among the drafts that drafter '{drafter.name}' samples by "
            f"their scores, so the kept drafts are no longer draws from q and verifier '{verifier.name}' "
            "would be biased; with sampled drafts use a tree builder that keeps a draw-order prefix"
            f"{trees(lambda c: c.keeps_draw_order and c.keeps_draft_probs)}, or verify "
            f"'{tree.name}' trees with a lossless verifier that does not use q"
            f"{verifiers(lambda c: samples_losslessly(c) and not c.uses_draft_probs)}")
    if not v.supports_sampling:
        problems.append(f"verifier '{verifier.name}' is greedy only, but temperature is "
                        f"{sampling.temperature} (use a lossless sampling verifier"
                        f"{verifiers(samples_losslessly)}, or temperature 0)")
    return problems


def backend_refusal(target: Target, backend: Component = DEFAULT_COMPONENTS[ComponentKind.BACKEND],
                    registry: PluginRegistry | None = None) -> str | None:
    """Why the backend `backend` (a name, a spec or a class) cannot serve `target` and where to go
    instead, or None when it serves it.

    The backend's `unsupported_reason` says why it cannot; the advice comes from asking every registered
    backend once (`PluginRegistry.backends_for`): "use the 'X' backend" for each that serves the model
    (unless the reason says so already), else each other backend's refusal and that no installed backend
    serves it. No backend asks another: a refusal recommends only backends that accept the model."""
    registry = registry or get_registry()
    cls = _lookup(registry, ComponentKind.BACKEND, backend)[0]
    reason = cls.unsupported_reason(target)
    if not reason:
        return None
    lead = f"backend '{cls.name}' cannot serve model '{target.name}': {reason}"
    others = {name: why for name, why in registry.backends_for(target).items() if name != cls.name}
    serving = [name for name, why in others.items() if why is None]
    if serving:
        advice = [f"the '{name}' backend" for name in serving if f"use the '{name}' backend" not in reason]
        return f"{lead}; use {' or '.join(advice)}" if advice else lead
    refused = "".join(f"; the '{name}' backend refuses it too ({why})" for name, why in others.items())
    return f"{lead}{refused}{', so' if refused else ';'} no installed backend serves it yet"


def check_serves(target: Target, backend: Component, registry: PluginRegistry | None = None) -> None:
    """Raise `UnsupportedModelError` with `backend_refusal` when the backend cannot serve `target`."""
    refusal = backend_refusal(target, backend, registry)
    if refusal:
        raise UnsupportedModelError(refusal)


def warn_if_lossy(verifier: type[Verifier], sampling: SamplingParams, registry: PluginRegistry,
                  stacklevel: int) -> None:
    if not sampling.greedy and not verifier.capabilities.lossless:
        warnings.warn(SpecframeWarning(
            f"verifier '{verifier.name}' is lossy: at temperature {sampling.temperature} the output does not "
            f"follow the target model's distribution; use a lossless verifier"
            f"{such_as(registry, ComponentKind.VERIFIER, samples_losslessly)} for lossless sampling"),
            stacklevel=stacklevel)


def samples_losslessly(capabilities: Any) -> bool:
    return capabilities.lossless and capabilities.supports_sampling


def such_as(registry: PluginRegistry, kind: ComponentKind, fits: Callable[[Any], bool]) -> str:
    """`, such as 'a', 'b' or 'c'`: the registered components of `kind` whose capabilities `fits`
    ('' when none is registered)."""
    names = [f"'{name}'" for name in registry.names(kind) if fits(registry.get(kind, name).capabilities)]
    if not names:
        return ""
    return ", such as " + (f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0])


def assemble(target: Target, drafter: Component = DEFAULT_COMPONENTS[ComponentKind.DRAFTER],
             tree: Component = DEFAULT_COMPONENTS[ComponentKind.TREE_BUILDER],
             verifier: Component = DEFAULT_COMPONENTS[ComponentKind.VERIFIER],
             backend: Component = DEFAULT_COMPONENTS[ComponentKind.BACKEND],
             sampling: SamplingParams | None = None, registry: PluginRegistry | None = None, *,
             options: dict[ComponentKind, dict] | None = None) -> Pipeline:
    """Look up, check and instantiate the four components.

    Each is a registered name, which may carry options (`pld(max_ngram=4)`, or a `ComponentSpec`), or a
    component class, used as it is (registered or not). `options` maps a kind to more constructor
    options, over those of the spec. The backend is handed the calibration stored for it on this
    machine, if any (`specframe.plugging.calibration.build_calibrated`).
    """
    registry = registry or get_registry()
    sampling = sampling or SamplingParams()
    options = options or {}
    parts = [_lookup(registry, kind, c) for kind, c in zip(ComponentKind, (drafter, tree, verifier, backend))]
    classes = [cls for cls, _ in parts]
    check_compatible(target, *classes, sampling, registry)
    d, t, v, b = [(cls, {**option_defaults(kind, cls.name), **spec_options, **options.get(kind, {})})
                  for kind, (cls, spec_options) in zip(ComponentKind, parts)]
    want_hidden = d[0].capabilities.needs_hidden_states
    build = backend_builder(target, *b, want_hidden=want_hidden)
    pipeline = Pipeline(
        drafter=_construct(ComponentKind.DRAFTER, *d, target),
        tree_builder=_construct(ComponentKind.TREE_BUILDER, *t),
        verifier=_construct(ComponentKind.VERIFIER, *v),
        backend=(build_calibrated(build) if build is not None
                 else _construct(ComponentKind.BACKEND, *b, target, want_hidden=want_hidden)),
        build_backend=build,
    )
    pipeline.checked.add((*classes, sampling.greedy))  # requests of this mode need no second check
    return pipeline


def backend_builder(target: Target, cls: type[StateBackend], options: dict, *,
                    want_hidden: bool = False) -> Build | None:
    """How to build the backend `cls(target, want_hidden=..., **options)` with a calibration handed down
    (`StateBackend.__init__`'s `calibration`), or None where its constructor takes none (it neither
    declares `calibration` nor passes unknown keywords on to `StateBackend.__init__`)."""
    params = inspect.signature(cls.__init__).parameters
    if "calibration" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None

    def build(calibration: Calibration | None = None) -> StateBackend:
        return _construct(ComponentKind.BACKEND, cls, options, target, want_hidden=want_hidden,
                          calibration=calibration)

    return build


def calibrate_pipeline(pipeline: Pipeline, progress: bool = True) -> MeasuredCost:
    """The step cost measured for the pipeline's backend on this machine, which `budget="auto"` plans with
    (the decoder asks at its first request: `specframe.decode.adaptive.make_adaptive_planner`).

    Where a calibration was stored when the pipeline was assembled, the backend was handed it then, and
    that is the answer. Else the stored one is read again (another process may have measured it since),
    or it is measured now on backends built for measuring and stored
    (`specframe.plugging.calibration.cached_cost`); then the pipeline's backend is replaced by one built
    with it handed down, so that it pads its forwards as the cost was measured. This is the only place a
    pipeline's backend is replaced, and only before the pipeline decodes with that calibration: read
    `pipeline.backend` after it. A pipeline put together by hand keeps its backend (see `cached_cost`)."""
    backend, build = pipeline.backend, pipeline.build_backend
    if backend.calibration.cost is not None:
        return backend.calibration.cost
    cost = cached_cost(backend, build, progress=progress)
    if build is not None:
        pipeline.backend = build(Calibration.of(cost))
    return cost


def calibrate_backend(target: Target, backend: Component = DEFAULT_COMPONENTS[ComponentKind.BACKEND],
                      registry: PluginRegistry | None = None, *, want_hidden: bool = False,
                      progress: bool = True) -> MeasuredCost:
    """The step cost of the backend `backend` (a name, a spec with options, or a class) on `target`: the
    stored calibration, or one measured now on backends built for measuring and stored, as the first
    `budget="auto"` request of a pipeline on it would (`calibrate_pipeline`). For a caller that assembles
    several pipelines on that backend: calibrated first, every one of them is handed the calibration when
    it is built (a bench's plain baseline pads its forwards as its `budget="auto"` methods do)."""
    registry = registry or get_registry()
    cls, spec_options = _lookup(registry, ComponentKind.BACKEND, backend)
    check_serves(target, cls, registry)
    options = {**option_defaults(ComponentKind.BACKEND, cls.name), **spec_options}
    build = backend_builder(target, cls, options, want_hidden=want_hidden)
    built = build(None) if build is not None else _construct(ComponentKind.BACKEND, cls, options, target,
                                                             want_hidden=want_hidden)
    return cached_cost(built, build, progress=progress)


def check_specs(drafter: Component = DEFAULT_COMPONENTS[ComponentKind.DRAFTER],
                tree: Component = DEFAULT_COMPONENTS[ComponentKind.TREE_BUILDER],
                verifier: Component = DEFAULT_COMPONENTS[ComponentKind.VERIFIER],
                backend: Component = DEFAULT_COMPONENTS[ComponentKind.BACKEND],
                registry: PluginRegistry | None = None) -> None:
    """Refuse unknown component names and options without a model: what `assemble` checks first, for a
    command line to run before it spends seconds loading one. What needs the model (whether a backend
    can serve it, a datastore's tokenizer) is still checked by `assemble`."""
    registry = registry or get_registry()
    for kind, component in zip(ComponentKind, (drafter, tree, verifier, backend)):
        cls, options = _lookup(registry, kind, component)
        check_options(kind, cls, options)


def _lookup(registry: PluginRegistry, kind: ComponentKind, component: Component) -> tuple[type, dict]:
    """A component's class and the options its spec carries, once the components the class declares it
    needs (`requires`) are found available."""
    if isinstance(component, type):
        cls, options = component, {}
    else:
        spec = component if isinstance(component, ComponentSpec) else ComponentSpec.parse(component)
        cls, options = registry.get(kind, spec.name), spec.options
    registry.check_requires(cls)
    return cls, options


def _construct(kind: ComponentKind, cls: type, options: dict, *args, **kwargs):
    """Instantiate a component after checking its options against the constructor's signature."""
    check_options(kind, cls, options)
    return cls(*args, **kwargs, **options)
