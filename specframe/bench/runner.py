"""The runners of `specframe bench`: a specframe pipeline (`PipelineRunner`), the synthetic method, and
`build_runners`, which puts the baselines, the methods, the synthetic method and the peers in the order
the loop (`specframe.bench.loop`) rotates.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

from specframe.decode.loop import SpeculativeDecoder
from specframe.terms.errors import ConfigurationError, SpecframeError, SpecframeWarning
from specframe.terms.budget import parse_budget
from specframe.terms.kinds import DEFAULT_COMPONENTS, ComponentKind
from specframe.terms.target import Target
from specframe.support.prompt_suites import WARMUP_PROMPT  # noqa: F401 - re-exported for the CLI and loop
from specframe.plugging.pipeline import calibrate_backend
from specframe.plugging.registry import PluginRegistry
from specframe.plugging.specs import ComponentSpec
from specframe.terms.sampling import SamplingParams
from specframe.terms.metrics import now
from specframe.runtime.devices import synchronize

from specframe.bench.methods import MethodSpec, baseline_spec
from specframe.bench.peers import PeerSpec, peer_class, peer_runner
from specframe.bench.synthetic import SyntheticDrafter
# RecordStore, check_settings, read_records, read_settings and RECORD_METRICS are read from here by tests
# and scripts written before the store had a module of its own (specframe/bench/store.py).
from specframe.bench.store import (RECORD_METRICS, RecordStore, call_metrics, check_settings,  # noqa: F401
                                   read_records, read_settings)

CONTROL_DRAFTER = "none"  # the drafter that proposes nothing: a method with it decodes plainly
WARMUP_TOKENS = 16


class PipelineRunner:
    """A specframe pipeline: `generate` decodes one request, `generate_batch` a list of them B rows at a
    time; both return the new tokens and what a record keeps of the call."""

    def __init__(self, target: Target, spec: MethodSpec, sampling: SamplingParams, registry: PluginRegistry,
                 baseline: str | None, phase_timing: bool = True):
        self.label, self.spec, self.baseline = spec.label, spec, baseline
        self.target, self.sampling, self.registry = target, sampling, registry
        self.phase_timing = phase_timing
        self.decoder = self.fresh()
        self.lossless = registry.get(ComponentKind.VERIFIER, spec.verifier.name).capabilities.lossless
        drafter = registry.get(ComponentKind.DRAFTER, spec.drafter.name)
        self.remembers = drafter.capabilities.remembers_requests
        self.seed = sampling.seed
        # plain decoding as a method: a control, whose distance from its baseline is the bench's noise
        self.control = baseline is not None and spec.drafter.name == CONTROL_DRAFTER

    def fresh(self) -> SpeculativeDecoder:
        """A new decoder of this method: no memory of earlier requests, a planner that learned nothing."""
        spec = self.spec
        return SpeculativeDecoder.from_names(self.target, *spec.components, budget=spec.budget,
                                             sampling=self.sampling, registry=self.registry,
                                             phase_timing=self.phase_timing)

    def start_suite(self) -> None:
        """Before the first chunk of a batch run's (B, repeat): a drafter that remembers requests (suffix)
        gets a decoder with no memory, so that every B and repeat decodes the suite alike rather than
        copying the answers of the ones before it. The chunks after it keep that decoder, so that each
        finds the answers of the chunks before it (and its planner what they taught it), as one call over
        the whole suite would."""
        if self.remembers:
            self.decoder = self.fresh()

    def remember(self, prompt_ids: list[int], tokens: list[int]) -> None:
        """Give a drafter that remembers requests a recorded request it did not decode in this process."""
        self.decoder.pipeline.drafter.remember(prompt_ids, tokens)

    def generate(self, prompt_ids: list[int], max_new_tokens: int,
                 seed: int | None = None) -> tuple[list[int], dict]:
        """One request's new tokens and its metrics (`DecodeMetrics.to_dict()`)."""
        result = self.decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
        metrics = result.metrics.to_dict()
        stats = getattr(self.decoder.pipeline.drafter, "stats", None)
        if callable(stats):
            metrics["drafter_stats"] = stats()  # e.g. the suffix drafter's cache size and memory
        return result.tokens, metrics

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       size: int) -> tuple[list[list[int]], dict]:
        """Every prompt's new tokens, `size` rows at a time, and the metrics of the whole call
        (`specframe.bench.store.call_metrics`)."""
        device = self.target.device
        synchronize(device)
        start = now()
        results = self.decoder.generate_batch(prompts, max_new_tokens, batch_size=size)
        synchronize(device)
        wall = now() - start
        rows = [r.metrics for r in results]
        return [r.tokens for r in results], call_metrics(
            wall, [m.new_tokens for m in rows], [m.wall_s for m in rows], sum(m.steps for m in rows),
            sum(m.accepted_draft_tokens for m in rows), self.decoder.batch_metrics.to_dict())


class SyntheticRunner(PipelineRunner):
    """The baseline's pipeline with a `SyntheticDrafter`, fed the baseline's output before each request."""

    def __init__(self, target: Target, acceptance: float, base: MethodSpec, sampling: SamplingParams,
                 registry: PluginRegistry, budget: int | str, phase_timing: bool = True):
        spec = MethodSpec(f"synthetic(p={acceptance:g})", base.drafter, base.tree, base.verifier,
                          base.backend, budget)
        super().__init__(target, spec, sampling, registry, base.label, phase_timing)
        self.drafter = SyntheticDrafter(target, acceptance=acceptance)
        self.decoder.pipeline.drafter = self.drafter
        self.control = False  # it drafts: its base's drafter is replaced


def usable_methods(methods: list[MethodSpec], target: Target) -> list[MethodSpec]:
    """`methods` without the presets from `all` that say they cannot run on `target` (each skipped with a
    warning naming its reason); a preset named on its own fails with its reason."""
    usable = []
    for method in methods:
        try:
            check_preset(method, target)
        except SpecframeError as err:
            if not method.optional:
                raise
            warnings.warn(f"bench: skipping preset '{method.label}': {err}", SpecframeWarning, stacklevel=3)
            continue
        usable.append(method)
    return usable


def build_runners(target: Target, methods: list[MethodSpec], peers: list[PeerSpec], sampling: SamplingParams,
                  registry: PluginRegistry, synthetic_acceptance: float | None = None,
                  default_budget: int | str = "auto", phase_timing: bool = True) -> list:
    """Baselines first (plain decoding through each backend the methods use; the default backend `kv`
    when it can serve the target), then the methods, the synthetic method and the peers, who are measured
    against the first (a peer with a `baseline_backend` against plain decoding through it, where a method
    uses it: llama.cpp's peers against `llamacpp`). A preset that says it cannot run on the target fails
    with its reason, or from `all` is skipped with a warning."""
    methods = usable_methods(methods, target)  # before the baselines: a skipped preset's backend needs none
    default = DEFAULT_COMPONENTS[ComponentKind.BACKEND]
    backends: dict[str, ComponentSpec] = {}
    if registry.get(ComponentKind.BACKEND, default).unsupported_reason(target) is None:
        backends[default] = ComponentSpec(default, {})
    for method in methods:
        backends.setdefault(spec_text(method.backend), method.backend)
    if not backends:
        raise ConfigurationError("no backend to run the plain-decoding baseline on: name one in a method, "
                                 "e.g. 'pld+chain+greedy+ssm-tree'")
    bases = [baseline_spec(b, "baseline" if key == default else f"baseline[{key}]", sampling.greedy)
             for key, b in backends.items()]
    synthetic = [] if synthetic_acceptance is None else [replace(bases[0], budget=default_budget)]
    calibrate_first(target, [*methods, *synthetic], registry)
    base_of = {spec_text(b.backend): b.label for b in bases}
    runners: list = [PipelineRunner(target, b, sampling, registry, None, phase_timing) for b in bases]
    for method in methods:
        try:
            base = base_of[spec_text(method.backend)]
            runners.append(PipelineRunner(target, method, sampling, registry, base, phase_timing))
        except SpecframeError as err:
            if not method.optional:
                raise
            warnings.warn(f"bench: skipping preset '{method.label}': {err}", SpecframeWarning, stacklevel=2)
    if synthetic_acceptance is not None:
        runners.append(SyntheticRunner(target, synthetic_acceptance, bases[0], sampling, registry,
                                       default_budget, phase_timing))
    for peer in peers:
        cls = peer_class(peer, registry)
        reason = cls.unsupported_reason(target)
        if reason is not None:
            if not peer.optional:
                raise ConfigurationError(reason)
            warnings.warn(f"bench: skipping {reason}", SpecframeWarning, stacklevel=2)
            continue
        baseline = base_of.get(cls.baseline_backend, bases[0].label)
        runners.append(peer_runner(target, peer, sampling, baseline, registry))
    return runners


def calibrate_first(target: Target, methods: list[MethodSpec], registry: PluginRegistry) -> None:
    """Calibrate the backend of every `budget="auto"` method before any runner is built: a backend is
    handed its calibration when it is built and keeps the padding it was built with, so the plain
    baselines, built first, then pad their forwards as the methods they are measured against do. A method
    that cannot run is left to `build_runners`, which fails or warns with its reason."""
    for method in methods:
        if not parse_budget(method.budget)[1]:
            continue
        try:
            check_preset(method, target)
            drafter = registry.get(ComponentKind.DRAFTER, method.drafter.name)
            calibrate_backend(target, method.backend, registry,
                              want_hidden=drafter.capabilities.needs_hidden_states)
        except SpecframeError:
            if not method.optional:
                raise


def check_preset(method: MethodSpec, target: Target) -> None:
    """Raise `ConfigurationError` with the reason the method's preset gives for not running on `target`."""
    preset = method.preset
    reason = preset.unusable(target) if preset is not None and preset.unusable is not None else None
    if reason:
        raise ConfigurationError(f"preset '{preset.name}' cannot run on model '{target.name}': {reason}")


def spec_text(spec: ComponentSpec) -> str:
    """`name` or `name(k=v, ...)`: the canonical text of a component spec."""
    options = ", ".join(f"{k}={v!r}" for k, v in sorted(spec.options.items()))
    return f"{spec.name}({options})" if options else spec.name


def check_run_args(target: Target, repeats: int, max_new_tokens: int) -> None:
    """Refuse settings that would fail only once the run started, before anything is written to --out."""
    if target.tokenizer is None:
        raise ConfigurationError(f"benchmarking model '{target.name}' needs its tokenizer")
    check_counts(repeats, max_new_tokens)


def check_counts(repeats: int, max_new_tokens: int) -> None:
    """Refuse a run of no repeats or no tokens."""
    if repeats < 1:
        raise ConfigurationError(f"--repeats must be >= 1, got {repeats}")
    if max_new_tokens < 1:
        raise ConfigurationError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
