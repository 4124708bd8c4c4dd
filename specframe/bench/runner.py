"""The benchmark loop: every method on every prompt, interleaved, resumable, checked against the baseline.

Order: for each prompt, for each repeat, for each turn, every method runs once, the order rotated by one
place per prompt and repeat, so slow drifts of a shared machine (thermal state, other processes) and any
cost of running first or after a given method hit all methods alike. One warm-up generation per method,
on a prompt of no suite, runs before any timing and is not recorded. Sampled runs with `--seed S` draw
repeat r with seed S + r in every method: the repeats are n different samples of each prompt.

Every finished (method, question, turn, repeat) is appended at once to the bench's record store
(`specframe.bench.store`, layout `REQUESTS`: `records.jsonl`); a rerun with the same `--out` skips what
is there, so an interrupted run resumes where it stopped; a drafter that
remembers earlier requests (`suffix`) is handed the skipped requests' recorded outputs
(`Drafter.remember`), so that the requests still to run find the memory an uninterrupted run would have
left them. The output of every lossless method is compared token for token with its baseline's output on
the same turn (greedy only); a difference is printed at once and collected in the results.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

from specframe.decode.loop import SpeculativeDecoder
from specframe.terms.errors import ConfigurationError, SpecframeError, SpecframeWarning
from specframe.terms.budget import parse_budget
from specframe.terms.kinds import DEFAULT_COMPONENTS, ComponentKind
from specframe.terms.target import Target
from specframe.support.progress import bar as progress_bar
from specframe.plugging.pipeline import calibrate_backend
from specframe.plugging.registry import PluginRegistry
from specframe.plugging.specs import ComponentSpec
from specframe.terms.sampling import SamplingParams
from specframe.terms.metrics import now
from specframe.runtime.devices import synchronize

from specframe.bench.methods import MethodSpec, baseline_spec
from specframe.bench.peers import PeerSpec, peer_class, peer_runner
from specframe.support.prompt_suites import BenchPrompt, encode_turn
from specframe.bench.synthetic import SyntheticDrafter
# RecordStore, check_settings, read_records, read_settings and RECORD_METRICS are read from here by tests
# and scripts written before the store had a module of its own (specframe/bench/store.py).
from specframe.bench.store import (RECORD_METRICS, RecordStore, call_metrics, check_settings,  # noqa: F401
                                   read_records, read_settings)

CONTROL_DRAFTER = "none"  # the drafter that proposes nothing: a method with it decodes plainly
WARMUP_TOKENS = 16
WARMUP_PROMPT = "Count from one to ten in words."


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


def build_runners(target: Target, methods: list[MethodSpec], peers: list[PeerSpec], sampling: SamplingParams,
                  registry: PluginRegistry, synthetic_acceptance: float | None = None,
                  default_budget: int | str = "auto", phase_timing: bool = True) -> list:
    """Baselines first (plain decoding through each backend the methods use; the default backend `kv`
    when it can serve the target), then the methods, the synthetic method and the peers, who are measured
    against the first (a peer with a `baseline_backend` against plain decoding through it, where a method
    uses it: llama.cpp's peers against `llamacpp`). A preset that says it cannot run on the target fails
    with its reason, or from `all` is skipped with a warning."""
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
            check_preset(method, target)
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


@dataclass
class Mismatch:
    method: str
    baseline: str
    qid: str
    category: str
    turn: int
    repeat: int
    position: int  # first differing token index
    baseline_text: str
    method_text: str

    def describe(self) -> str:
        return (f"LOSSLESS MISMATCH: '{self.method}' differs from '{self.baseline}' on question {self.qid} "
                f"turn {self.turn + 1} repeat {self.repeat + 1} at new token {self.position}: "
                f"baseline ...{self.baseline_text!r} vs method ...{self.method_text!r}")


@dataclass
class BenchRun:
    """What a finished run hands to the reports."""

    records: list[dict]
    runners: list
    prompts: list[BenchPrompt]
    mismatches: list[Mismatch] = field(default_factory=list)
    identity_checked: bool = True  # greedy runs; sampled outputs are not compared


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


def run_bench(target: Target, prompts: list[BenchPrompt], runners: list, *, repeats: int,
              max_new_tokens: int, out: Path, check_identity: bool = True, warmup: bool = True,
              progress: bool = True, first_index: int = 0) -> BenchRun:
    """Run every runner on every turn of every prompt `repeats` times; see the module docstring.
    `first_index` is the place of `prompts[0]` in the whole suite (it sets the rotation), for a worker
    that runs part of it (`specframe.bench.distributed`)."""
    check_run_args(target, repeats, max_new_tokens)
    out.mkdir(parents=True, exist_ok=True)
    store = RecordStore(out / "records.jsonl")
    wanted = [(r.label, p.qid, t, rep) for p in prompts for rep in range(repeats)
              for t in range(len(p.turns)) for r in runners]
    todo = [k for k in wanted if k not in store.records]
    run = BenchRun([], runners, prompts, identity_checked=check_identity)
    bar = progress_bar(total=len(wanted), initial=len(wanted) - len(todo), desc="bench", unit="gen",
                       show=progress, mininterval=1)
    if warmup and todo:
        warm_up([r for r in runners if r.label in {k[0] for k in todo}], target.tokenizer, prompts[0].chat,
                max_new_tokens, bar)
    for index, prompt in enumerate(prompts):
        for rep in range(repeats):
            order = rotation(runners, (first_index + index) * repeats + rep)
            answers: dict[str, list[str]] = {r.label: [] for r in runners}
            for turn in range(len(prompt.turns)):
                for runner in order:
                    record = run_turn(runner, store, prompt, turn, rep, repeats, answers[runner.label],
                                      target.tokenizer, max_new_tokens, bar)
                    run.records.append(record)
                    answers[runner.label].append(target.tokenizer.decode(record["tokens"],
                                                                         skip_special_tokens=True))
                if check_identity:
                    check_turn(order, store, prompt.qid, turn, rep, target.tokenizer, run, bar)
    bar.close()
    return run


def warm_up(runners: list, tokenizer, chat: bool, max_new_tokens: int, bar, rows: int = 1) -> None:
    """One short untimed call of each runner before any timed one (a first request may calibrate, a first
    batched step pay setup), on a prompt of no suite: methods that remember earlier responses (`suffix`)
    learn nothing from it. At `rows` > 1 the call is a batch of that many rows of the prompt."""
    warm = BenchPrompt("warmup", "warmup", (WARMUP_PROMPT,), chat)
    ids, tokens = encode_turn(tokenizer, warm, 0, []), min(WARMUP_TOKENS, max_new_tokens)
    for runner in runners:
        if isinstance(runner, SyntheticRunner):
            runner.drafter.reference = []
        bar.set_postfix_str(f"warming up {runner.label}")
        if rows > 1:
            runner.generate_batch([ids] * rows, tokens, rows)
        else:
            runner.generate(ids, tokens)


def run_turn(runner, store: RecordStore, prompt: BenchPrompt, turn: int, rep: int, repeats: int,
             answers: list[str], tokenizer, max_new_tokens: int, bar) -> dict:
    """The record of `runner` on one turn of one repeat: read from `store` where a stopped run measured it
    already (a drafter that remembers earlier requests is then told of it), else measured and stored."""
    record = store.get(runner.label, prompt.qid, turn, rep)
    if record is not None:
        if getattr(runner, "remembers", False):
            # Resuming: the drafter's memory of earlier requests gets this one as well, so the requests
            # still to run see what an uninterrupted run would have shown them.
            runner.remember(encode_turn(tokenizer, prompt, turn, answers), record["tokens"])
        return record
    ids = encode_turn(tokenizer, prompt, turn, answers)
    if isinstance(runner, SyntheticRunner):
        runner.drafter.reference = store.get(runner.baseline, prompt.qid, turn, rep)["tokens"]
    seed = request_seed(runner, rep)
    bar.set_postfix_str(f"{runner.label} on {prompt.qid} turn {turn + 1}, repeat {rep + 1}/{repeats}")
    tokens, metrics = runner.generate(ids, max_new_tokens, seed=seed)
    record = {"method": runner.label, "qid": prompt.qid, "category": prompt.category, "turn": turn,
              "repeat": rep, "tokens": tokens, "metrics": metrics, "seed": seed}
    store.add(record)
    bar.update()
    return record


def check_turn(runners: list, store: RecordStore, qid: str, turn: int, rep: int, tokenizer, run: BenchRun,
               bar) -> None:
    """Compare each lossless runner's output on one turn with its baseline's; a difference is recorded in
    `run.mismatches` and shown at once."""
    for mismatch in turn_mismatches(runners, store, qid, turn, rep, tokenizer):
        run.mismatches.append(mismatch)
        bar.write(f"\033[1;31m{mismatch.describe()}\033[0m", file=sys.stderr)


def turn_mismatches(runners: list, store: RecordStore, qid: str, turn: int, rep: int,
                    tokenizer) -> list[Mismatch]:
    """Where each lossless runner's recorded output on one turn departs from its baseline's."""
    found = []
    for runner in runners:
        if runner.baseline is not None and runner.lossless:
            mine, base = (store.get(label, qid, turn, rep) for label in (runner.label, runner.baseline))
            found += [m for m in [compare(mine, base, runner.baseline, tokenizer)] if m]
    return found


def request_seed(runner, repeat: int) -> int | None:
    """The sampling seed of one request: `--seed` plus the repeat, so the repeats of a sampled run are
    n different samples (best-of-n) while every method draws with the same seed on the same repeat; None
    (fresh seeds) without `--seed`."""
    seed = runner.seed
    return None if seed is None else seed + repeat


def rotation(runners: list, shift: int) -> list:
    """The runners rotated by `shift`, so that no method always runs first (or right after another),
    with synthetic runners moved last: they need their baseline's output on the same turn."""
    shift %= len(runners)
    order = runners[shift:] + runners[:shift]
    return [r for r in order if not isinstance(r, SyntheticRunner)] + [
        r for r in order if isinstance(r, SyntheticRunner)]


def compare(record: dict, base: dict, baseline: str, tokenizer) -> Mismatch | None:
    """The first token where `record` departs from its baseline `base`, or None when identical."""
    a, b = base["tokens"], record["tokens"]
    if a == b:
        return None
    position = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, position - 8)
    return Mismatch(record["method"], baseline, record["qid"], record["category"], record["turn"],
                    record["repeat"], position, tokenizer.decode(a[lo:position + 8]),
                    tokenizer.decode(b[lo:position + 8]))
