"""The benchmark loop: every method on every prompt, interleaved, resumable, checked against the baseline.

Order: for each prompt, for each repeat, for each turn, every method runs once, the order rotated by one
place per prompt and repeat, so slow drifts of a shared machine (thermal state, other processes) and any
cost of running first or after a given method hit all methods alike. One warm-up generation per method,
on a prompt of no suite, runs before any timing and is not recorded. Sampled runs with `--seed S` draw
repeat r with seed S + r in every method: the repeats are n different samples of each prompt.

Every finished (method, question, turn, repeat) is appended at once to `records.jsonl`, under the lock of
`--out` (`bench_lock`), so that shards running into one directory never interleave their lines; a rerun
with the same `--out` skips what is there, so an interrupted run resumes where it stopped; a drafter that
remembers earlier requests (`suffix`) is handed the skipped requests' recorded outputs
(`Drafter.remember`), so that the requests still to run find the memory an uninterrupted run would have
left them. The output of every lossless method is compared token for token with its baseline's output on
the same turn (greedy only); a difference is printed at once and collected in the results.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from specframe.support.atomic_dirs import (FILE_LOCK_WAIT, exclusive, remove_stale, temp_name_pattern,
                                          write_atomically)
from specframe.decode.loop import SpeculativeDecoder
from specframe.terms.errors import (ConfigurationError, OutputError, SpecframeError, SpecframeWarning,
                                    io_failure)
from specframe.terms.budget import parse_budget
from specframe.terms.kinds import DEFAULT_COMPONENTS, ComponentKind
from specframe.terms.target import Target
from specframe.support.progress import bar as progress_bar
from specframe.plugging.pipeline import calibrate_backend
from specframe.plugging.registry import PluginRegistry
from specframe.plugging.specs import ComponentSpec
from specframe.terms.sampling import SamplingParams

from specframe.bench.methods import MethodSpec, baseline_spec
from specframe.bench.peers import PeerSpec, peer_class, peer_runner
from specframe.support.prompt_suites import BenchPrompt, encode_turn
from specframe.support.untrusted import json_problem
from specframe.bench.synthetic import SyntheticDrafter

WARMUP_TOKENS = 16
WARMUP_PROMPT = "Count from one to ten in words."


class PipelineRunner:
    """A specframe pipeline; `generate` returns (new tokens, `DecodeMetrics.to_dict()`)."""

    def __init__(self, target: Target, spec: MethodSpec, sampling: SamplingParams, registry: PluginRegistry,
                 baseline: str | None, phase_timing: bool = True):
        self.label, self.spec, self.baseline = spec.label, spec, baseline
        self.decoder = SpeculativeDecoder.from_names(target, *spec.components, budget=spec.budget,
                                                     sampling=sampling, registry=registry,
                                                     phase_timing=phase_timing)
        self.lossless = registry.get(ComponentKind.VERIFIER, spec.verifier.name).capabilities.lossless
        drafter = registry.get(ComponentKind.DRAFTER, spec.drafter.name)
        self.remembers = drafter.capabilities.remembers_requests
        self.seed = sampling.seed

    def remember(self, prompt_ids: list[int], tokens: list[int]) -> None:
        """Give a drafter that remembers requests a recorded request it did not decode in this process."""
        self.decoder.pipeline.drafter.remember(prompt_ids, tokens)

    def generate(self, prompt_ids: list[int], max_new_tokens: int,
                 seed: int | None = None) -> tuple[list[int], dict]:
        result = self.decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
        metrics = result.metrics.to_dict()
        stats = getattr(self.decoder.pipeline.drafter, "stats", None)
        if callable(stats):
            metrics["drafter_stats"] = stats()  # e.g. the suffix drafter's cache size and memory
        return result.tokens, metrics


class SyntheticRunner(PipelineRunner):
    """The baseline's pipeline with a `SyntheticDrafter`, fed the baseline's output before each request."""

    def __init__(self, target: Target, acceptance: float, base: MethodSpec, sampling: SamplingParams,
                 registry: PluginRegistry, budget: int | str, phase_timing: bool = True):
        spec = MethodSpec(f"synthetic(p={acceptance:g})", base.drafter, base.tree, base.verifier,
                          base.backend, budget)
        super().__init__(target, spec, sampling, registry, base.label, phase_timing)
        self.drafter = SyntheticDrafter(target, acceptance=acceptance)
        self.decoder.pipeline.drafter = self.drafter


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


@contextmanager
def bench_lock(out: Path) -> Iterator[None]:
    """Hold the lock of the benchmark directory `out` for one update of its files (a record appended, the
    settings checked and written, the reports written). Shards of a suite may run into one `--out` at
    once: each update is short, so a writer waits for the others."""
    lock = out / ".bench.lock"

    def busy() -> ConfigurationError:
        return ConfigurationError(f"{out} stayed locked by another bench run for {FILE_LOCK_WAIT:g} s "
                                  f"({lock}); if no specframe process is running, delete that lock file")

    with exclusive(lock, busy, wait=FILE_LOCK_WAIT, waiting=f"specframe: waiting for another bench run "
                   f"writing to {out} ({lock})"):
        yield


@contextmanager
def writing(path: Path | str, kept: str) -> Iterator[None]:
    """A write under `--out` whose failure (a full disk, mostly) becomes an `OutputError` naming `path`,
    the system's reason and `kept`: what stays in `--out` and how to go on. The CLI prints it as one
    `error:` line instead of a traceback."""
    try:
        yield
    except OSError as err:
        if err.filename is not None and str(err.filename) == str(path):
            err = OSError(err.errno, err.strerror)  # the message names the file once
        raise OutputError(f"bench could not write {path} ({io_failure(err, 'pass another --out')}); "
                          f"{kept}") from None


def records_kept(count: int, path: Path) -> str:
    """What a failed write leaves of a run's records, and how to go on from them."""
    if not count:
        return f"no record was in {path} yet"
    return (f"the {count} record(s) written before stay in {path}: once there is room, rerun the same "
            "command to resume from them")


def append_line(path: Path, line: str) -> None:
    """Append one record's line to `path` (the one place records are written)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(line)


def end_cut_line(path: Path) -> None:
    """End a last line cut short (an interrupted or failed write), so the next record starts on a line of
    its own; the cut line fails to parse and its run is simply redone."""
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
        if cut:
            append_line(path, "\n")


# Temporary files of the reports and settings `write_atomically` writes into --out.
OUT_TEMPORARIES = re.compile("|".join(temp_name_pattern(f"{name}.", ".tmp")
                                      for name in ("settings.json", "results.json", "results.md")))


class RecordStore:
    """Append-only JSONL of finished runs, keyed by (method, question, turn, repeat).

    Records are appended under the directory's lock, after checking that `settings.json` still holds the
    settings it held when the store was opened: a run started meanwhile into the same directory with
    other settings would otherwise mix its records with this one's."""

    def __init__(self, path: Path):
        self.path = path
        self.records: dict[tuple, dict] = {}
        with bench_lock(path.parent):
            self.settings = _settings_in(path.parent)
            if path.exists():
                text = path.read_text("utf-8", errors="replace")  # records are ASCII: damage fails to parse
                for record in parse_records(text, path):
                    self.records[self.key(record)] = record
                with writing(path, records_kept(len(self.records), path)):
                    end_cut_line(path)

    @staticmethod
    def key(record: dict) -> tuple:
        return record["method"], record["qid"], record["turn"], record["repeat"]

    def __len__(self) -> int:
        return len(self.records)

    def get(self, method: str, qid: str, turn: int, repeat: int) -> dict | None:
        return self.records.get((method, qid, turn, repeat))

    def add(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        with writing(self.path, records_kept(len(self.records), self.path)), bench_lock(self.path.parent):
            if _settings_in(self.path.parent) != self.settings:
                raise ConfigurationError(
                    f"{self.path.parent / 'settings.json'} was replaced while this run was writing to "
                    f"{self.path.parent} (another bench run with other settings, or --fresh, started "
                    "there): run one benchmark per --out, or shards of one run with the same settings")
            append_line(self.path, line)
        self.records[self.key(record)] = record


def _settings_in(out: Path) -> dict | None:
    """The settings recorded in `out/settings.json`, None when there are none."""
    path = out / "settings.json"
    return read_settings(path) if path.exists() else None


def read_records(path: Path) -> list[dict]:
    """The finished runs of a `records.jsonl`, in order, without changing the file (for reports and
    scripts that read a run; `RecordStore` reads the same way)."""
    return parse_records(path.read_text("utf-8", errors="replace"), path)


def parse_records(text: str, path: Path) -> list[dict]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        parsed = json_problem(line)  # why a line is not JSON, or (its value,)
        if isinstance(parsed, str):
            continue  # a line cut short by an interrupted write: that run is simply redone
        record = parsed[0]
        check_record(record, path, number)
        records.append(record)
    return records


RECORD_FIELDS = {"method": str, "qid": str, "category": str, "turn": int, "repeat": int, "tokens": list,
                 "metrics": dict}
# The metrics the reports read from every record (specframe/bench/report.py).
RECORD_METRICS = ("new_tokens", "steps", "draft_tokens", "accepted_draft_tokens", "acceptance_histogram",
                  "time_s", "prefill_s", "wall_s", "tokens_per_s", "decode_tokens_per_s", "peak_memory_bytes")


def check_record(record, path: Path, number: int) -> None:
    """Refuse a line of `records.jsonl` that parses as JSON but is not a finished run (`{}`, `null`, a
    record without metrics): resuming would otherwise fail later with a KeyError deep in the reports."""
    problem = record_problem(record)
    if problem:
        raise ConfigurationError(
            f"{path}, line {number} is not a benchmark record: {problem}. Delete that line to redo the run "
            "it stood for, or pass --fresh to discard every earlier record")


def record_problem(record) -> str | None:
    """What is wrong with one parsed record, or None when it holds every field the bench reads."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {json.dumps(record)[:40]}"
    for name, kind in RECORD_FIELDS.items():
        if name not in record:
            return f"field '{name}' is missing"
        value = record[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"field '{name}' should be a JSON {_JSON_KIND[kind]}, got {json.dumps(value)[:40]}"
    missing = [m for m in RECORD_METRICS if m not in record["metrics"]]
    if missing:
        return f"its metrics lack {', '.join(missing)}"
    return None


_JSON_KIND = {str: "string", int: "integer", list: "list", dict: "object"}


@dataclass
class BenchRun:
    """What a finished run hands to the reports."""

    records: list[dict]
    runners: list
    prompts: list[BenchPrompt]
    mismatches: list[Mismatch] = field(default_factory=list)
    identity_checked: bool = True  # greedy runs; sampled outputs are not compared


def check_settings(out: Path, settings: dict) -> None:
    """Refuse to resume into a directory holding records made with other settings; record the settings
    otherwise. A `settings.json` with no records beside it binds nothing (a run that failed before its
    first record, e.g. on a bad option, leaves one), so it is simply replaced."""
    path, records = out / "settings.json", out / "records.jsonl"
    with bench_lock(out):
        remove_stale(out, OUT_TEMPORARIES, f"temporary files in {out}")
        recorded = records.exists() and parse_records(records.read_text("utf-8", "replace"), records)
        if path.exists() and recorded:
            old = read_settings(path)
            changed = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
            if changed:
                raise ConfigurationError(
                    f"{out} holds results made with other settings ({changed}, as (old, new)); "
                    "resume with the same settings, or pass another --out (or --fresh to start over)")
        else:
            with writing(path, "nothing was run yet"):
                write_atomically(path, json.dumps(settings, indent=2))


def read_settings(path: Path) -> dict:
    """The settings recorded by an earlier run, refused with a way out when the file is damaged."""
    old = json_problem(path.read_bytes())  # why it is not JSON, or (its value,)
    if isinstance(old, str):
        old, problem = None, f"it is not valid JSON ({old})"
    else:
        old = old[0]
        problem = None if isinstance(old, dict) else f"expected a JSON object, got {json.dumps(old)[:40]}"
    if problem:
        raise ConfigurationError(
            f"{path} is damaged: {problem}. Delete it to resume (if the records beside it were made with "
            "the settings you pass now), or pass --fresh to start over")
    return old


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


def warm_up(runners: list, tokenizer, chat: bool, max_new_tokens: int, bar) -> None:
    """One short request of each runner before any timed one (a first request may calibrate), on a prompt
    of no suite: methods that remember earlier responses (`suffix`) learn nothing from it."""
    warm = BenchPrompt("warmup", "warmup", (WARMUP_PROMPT,), chat)
    ids = encode_turn(tokenizer, warm, 0, [])
    for runner in runners:
        if isinstance(runner, SyntheticRunner):
            runner.drafter.reference = []
        bar.set_postfix_str(f"warming up {runner.label}")
        runner.generate(ids, min(WARMUP_TOKENS, max_new_tokens))


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
    for runner in runners:
        if runner.baseline is not None and runner.lossless:
            mine, base = (store.get(label, qid, turn, rep) for label in (runner.label, runner.baseline))
            mismatch = compare(mine, base, runner.baseline, tokenizer)
            if mismatch:
                run.mismatches.append(mismatch)
                bar.write(f"\033[1;31m{mismatch.describe()}\033[0m", file=sys.stderr)


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
