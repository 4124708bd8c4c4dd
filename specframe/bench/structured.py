"""The structured-output run: constrained plain decoding, constrained speculative methods and peers
(transformers' `generate` with the same llguidance masks as a logits processor, and any registered peer
that decodes under a JSON schema, such as llama.cpp's grammar decoding, `llamacpp-grammar`), on the
same prompts, each under its own JSON schema.

The shipped suite (`specframe/support/data/structured.jsonl`, written for this project) holds 33 prompts
with their schemas: facts extracted from a passage, function-call arguments, schema-bound answers. Each
method decodes every prompt greedily under its schema; a row reports the share of valid outputs (parsed
and validated against the schema), the share identical to constrained plain decoding, tokens per second
over the whole suite, tau, and the speed over constrained plain decoding. Every method runs once untimed
first; then the methods take turns prompt by prompt (`run_structured`). The run is `specframe bench` on
that suite (`bench_structured`, then `run_structured`):

    specframe bench --suite structured --limit 4 --methods "forced(then=pld)+chain@8" --repeats 1

`specframe bench` also reaches it with a JSONL suite whose rows carry a `schema`, or with any suite and
`--json-schema FILE` (every prompt's first turn under that schema); `bench_structured` is its entry.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from specframe.bench.methods import MethodSpec, baseline_spec, resolve_methods
from specframe.bench.peers import parse_peers, peer_class, peer_runner
from specframe.bench.structured_suite import (
    StructuredPrompt, is_valid, structured_prompts,
)
from specframe.contract.peers import PeerSpec
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.plugging.specs import ComponentSpec
from specframe.terms.constraint import Constraint
from specframe.terms.errors import ConfigurationError, SpecframeError, SpecframeWarning
from specframe.terms.metrics import now
from specframe.terms.sampling import SamplingParams
from specframe.terms.target import Target

TRANSFORMERS = "hf-generate"  # in a structured run: transformers' generate with the constraint's masks
# A decode: (prompt ids, its prompt, its constraint, new tokens at most) -> (new tokens, forwards)
Decode = Callable[[list[int], "StructuredPrompt", Constraint, int], tuple[list[int], int]]


@dataclass
class MethodRun:
    """What one method did over the suite."""

    name: str
    tokens: dict[str, list[int]] = field(default_factory=dict)
    valid: int = 0
    seconds: float = 0.0
    steps: int = 0
    lossless: bool = True  # a peer on other kernels (llama.cpp's) is not: its identity is reported, not owed

    def row(self, plain: MethodRun | None) -> dict:
        new = sum(len(t) for t in self.tokens.values())
        same = sum(plain is not None and t == plain.tokens.get(q) for q, t in self.tokens.items())
        speed = new / self.seconds if self.seconds else 0.0
        plain_speed = (sum(len(t) for t in plain.tokens.values()) / plain.seconds) if plain else 0.0
        return {"method": self.name, "valid": self.valid / max(len(self.tokens), 1),
                "identical": same / max(len(self.tokens), 1), "tokens_per_s": speed,
                "tau": new / self.steps if self.steps else None,
                "speedup": speed / plain_speed if plain_speed else None, "lossless": self.lossless}


def method_decode(target: Target, method: MethodSpec, phase_timing: bool = False) -> Decode:
    """A specframe pipeline decoding one request under its constraint."""
    from specframe.decode.loop import SpeculativeDecoder

    decoder = SpeculativeDecoder.from_names(target, *method.components, budget=method.budget,
                                            phase_timing=phase_timing)

    def decode(ids, prompt, constraint, limit):
        result = decoder.generate(ids, max_new_tokens=limit, constraint=constraint)
        return result.tokens, result.metrics.steps

    return decode


def peer_decode(target: Target, spec: PeerSpec, registry: PluginRegistry | None = None) -> Decode:
    """Peer `spec` decoding one request under its prompt's schema: `hf-generate` is transformers'
    `generate` with the constraint's masks; any other peer decodes through its `decode_schema`."""
    if spec.name == TRANSFORMERS:
        return lambda ids, prompt, constraint, limit: transformers_decode(target, ids, constraint, limit)
    peer = peer_runner(target, spec, SamplingParams(), baseline="plain", registry=registry)

    def decode(ids, prompt, constraint, limit):
        tokens, metrics = peer.decode_schema(ids, limit, prompt.schema)
        return tokens, metrics.steps

    return decode


def structured_peers(text: str, registry: PluginRegistry | None = None) -> list[PeerSpec]:
    """`--peers` of a structured run: `all` is `hf-generate` and every registered peer that decodes under a
    schema (`decode_schema`), each skipped with a warning where it cannot run; a named peer that cannot
    decode under a schema is refused."""
    registry = registry or get_registry()
    capable = [TRANSFORMERS] + [n for n in registry.peers.registered()
                                if hasattr(registry.peers.get(n), "decode_schema")]
    if text.strip() == "all":
        return [replace(p, optional=True) for p in parse_peers(",".join(capable), registry)]
    peers = parse_peers(text, registry)
    for peer in peers:
        if peer.name not in capable:
            raise ConfigurationError(f"peer '{peer.name}' cannot decode under a schema: a structured run "
                                     f"takes {', '.join(capable)}")
    return peers


def decoders(target: Target, methods: list[MethodSpec], peers: list[PeerSpec], registry: PluginRegistry,
             phase_timing: bool = False) -> list[tuple[str, Decode, bool]]:
    """(label, decode, lossless) of constrained plain decoding, then every method and peer; an optional
    one (from `all`) that cannot be built is skipped with a warning saying why."""
    plain = baseline_spec(ComponentSpec("kv", {}), label="plain")
    built = [("plain", method_decode(target, plain), True)]
    for method in methods:
        try:
            built.append((method.label, method_decode(target, method, phase_timing), True))
        except SpecframeError as err:
            if not method.optional:
                raise
            warnings.warn(f"structured run: skipping '{method.label}': {err}", SpecframeWarning, stacklevel=2)
    for peer in peers:
        try:
            lossless = peer.name == TRANSFORMERS or peer_class(peer, registry).lossless
            built.append((peer.label, peer_decode(target, peer, registry), lossless))
        except SpecframeError as err:
            if not peer.optional:
                raise
            warnings.warn(f"structured run: skipping peer '{peer.label}': {err}", SpecframeWarning,
                          stacklevel=2)
    return built


def run_structured(target: Target, prompts: list[StructuredPrompt], methods: list[MethodSpec],
                   peers: list[PeerSpec], *, max_new_tokens: int, repeats: int = 1, progress: bool = True,
                   phase_timing: bool = False, registry: PluginRegistry | None = None) -> list[MethodRun]:
    """Constrained plain decoding, `methods` and `peers` over `prompts`, each under its schema, after one
    untimed request of each: every one decodes a prompt before any decodes the next, their order rotated
    by one place per prompt (`specframe.bench.loop.rotation`, as every bench run takes turns), so a shared
    machine's drifting load falls on all of them. Each run's tokens are its last repeat's; its time,
    forwards and valid outputs cover every repeat. A progress bar on a terminal."""
    from specframe.bench.loop import rotation
    from specframe.runtime.structured import constraint_for
    from specframe.support.progress import bar

    registry = registry or get_registry()
    constraints = {p.qid: constraint_for(target, json_schema=p.schema) for p in prompts}
    built = decoders(target, methods, peers, registry, phase_timing)
    runs = [(MethodRun(label, lossless=lossless), decode) for label, decode, lossless in built]
    warm = prompts[0]
    for _, decode in runs:
        decode(encode(target, warm), warm, constraints[warm.qid], max_new_tokens)
    turns = [prompt for _ in range(repeats) for prompt in prompts]
    with bar(total=len(runs) * len(turns), show=progress, mininterval=1) as shown:
        for shift, prompt in enumerate(turns):
            ids = encode(target, prompt)
            for run, decode in rotation(runs, shift):
                shown.set_postfix_str(run.name)
                timed_request(target, run, decode, ids, prompt, constraints[prompt.qid], max_new_tokens)
                shown.update(1)
    for run, _ in runs:
        run.valid //= repeats
    return [run for run, _ in runs]


def timed_request(target: Target, run: MethodRun, decode: Decode, ids: list[int], prompt: StructuredPrompt,
                  constraint: Constraint, max_new_tokens: int) -> None:
    """One request of `run`'s method, timed, its tokens, forwards and validity added to `run`."""
    start = now()
    tokens, steps = decode(ids, prompt, constraint, max_new_tokens)
    run.seconds += now() - start
    run.steps += steps
    run.tokens[prompt.qid] = tokens
    run.valid += is_valid(target.tokenizer.decode(tokens, skip_special_tokens=True), prompt.schema)


def table(runs: list[MethodRun], header: str) -> str:
    """The run as a markdown page: `header`, then a row per method against constrained plain decoding."""
    lines = [header, "", "| method | valid | identical to plain | tokens/s | tau | speed over plain |",
             "|---|---|---|---|---|---|"]
    for run in runs:
        row = run.row(runs[0])
        tau = f"{row['tau']:.2f}" if row["tau"] else "-"
        mark = "" if row["lossless"] else " (other kernels)"
        lines.append(f"| `{row['method']}`{mark} | {row['valid']:.0%} | {row['identical']:.0%} | "
                     f"{row['tokens_per_s']:.1f} | {tau} | {row['speedup']:.2f}x |")
    return "\n".join(lines)


def encode(target: Target, prompt: StructuredPrompt) -> list[int]:
    from specframe.support.prompt_suites import BenchPrompt, encode_turn

    return encode_turn(target.tokenizer, BenchPrompt(prompt.qid, prompt.category, (prompt.prompt,),
                                                     prompt.chat), 0, [])


class GuidanceProcessor:
    """A transformers logits processor masking each step's scores by `constraint` after the tokens
    generated so far (one row)."""

    def __init__(self, constraint: Constraint, prompt_length: int):
        self.state, self.prompt_length, self.seen = constraint.start(), prompt_length, prompt_length
        self.complete_at: int | None = None  # new tokens when the constraint was complete with no EOS left

    def __call__(self, input_ids, scores):
        import torch

        if self.complete_at is not None:  # a target without EOS: generate runs on, its tokens are cut
            return scores
        for token in input_ids[0, self.seen:].tolist():
            self.state = self.state.advance(token)
        self.seen = input_ids.shape[1]
        mask = torch.from_numpy(self.state.allowed())
        if not mask.any():
            self.complete_at = self.seen - self.prompt_length
            return scores
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
        allowed[: len(mask)] = mask[: scores.shape[-1]]
        return scores.masked_fill(~allowed, float("-inf"))


def transformers_decode(target: Target, ids: list[int], constraint: Constraint, limit: int):
    """transformers' greedy `generate` with `GuidanceProcessor`: (new tokens, forwards)."""
    import torch
    from transformers import LogitsProcessorList

    processor = GuidanceProcessor(constraint, len(ids))
    with torch.inference_mode():
        prompt = torch.tensor([ids], device=target.device)  # (1, L)
        out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=limit, logits_processor=LogitsProcessorList([processor]),
                                    pad_token_id=min(target.eos_token_ids, default=0))
    tokens = out[0, len(ids):].tolist()
    return tokens[: processor.complete_at], len(tokens)


# `specframe bench` options a structured run does not honour, and the values that leave them out.
UNSUPPORTED = {"batch": [1], "ray": None, "shard": None, "turns": None, "synthetic-acceptance": None,
               "keep": "all", "batch-chunk": None}


def check_bench(options: dict, sampling: SamplingParams) -> None:
    """Refuse what a structured run cannot do: it decodes greedily, one request at a time, first turns."""
    for name, default in UNSUPPORTED.items():
        if options.get(name, default) != default:
            raise ConfigurationError(f"--{name} is not available in a structured run (--suite structured, a "
                                     "suite with schemas, or --json-schema): leave it out")
    if not sampling.greedy:
        raise ConfigurationError("a structured run decodes greedily (its outputs are checked against "
                                 "constrained plain decoding): leave --temperature at 0")


def bench_structured(target_loader: Callable[[], Target], suite: str, methods: list[str], out: Path, *,
                     json_schema: dict | None, peers: str, limit: int | None, repeats: int,
                     max_new_tokens: int, budget: int | str, progress: bool = True,
                     phase_timing: bool = False) -> list[MethodRun]:
    """`specframe bench` on a structured suite: prompts, schemas, methods and peers checked, then the
    model loaded (`target_loader`), the run, and `structured_results.md` and `.json` written under `out`.
    Prints the page."""
    from specframe.bench.report import command_text
    from specframe.bench.runner import check_counts

    registry = get_registry()
    prompts = structured_prompts(suite, limit, json_schema)
    check_counts(repeats, max_new_tokens)
    specs = resolve_methods(methods, registry, budget)
    peer_specs = structured_peers(peers, registry)
    target = target_loader()
    runs = run_structured(target, prompts, specs, peer_specs, max_new_tokens=max_new_tokens,
                          repeats=repeats, progress=progress, phase_timing=phase_timing, registry=registry)
    header = (f"{len(prompts)} prompts of {suite}, each under its schema, greedy, at most "
              f"{max_new_tokens} new tokens, {repeats} timed run(s) of each, {target.name}")
    page = table(runs, header)
    (out / "structured_results.md").write_text(page + "\n", "utf-8")
    rows = [run.row(runs[0]) for run in runs]
    record = {"header": header, "command": command_text(None), "rows": rows}  # the page's provenance
    (out / "structured_results.json").write_text(json.dumps(record, indent=1), "utf-8")
    print(page)
    print(f"written under {out}: structured_results.md, structured_results.json")
    return runs
