"""The speculative decode loop: draft, build tree, score, verify, commit, observe."""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from specframe.decode.planner import (
    AdaptivePlanner, FixedPlanner, make_adaptive_planner, make_fixed_planner, plans_blind,
)
from specframe.terms.budget import parse_budget
from specframe.terms.cost import CostModel
from specframe.runtime.devices import synchronizer
from specframe.terms.errors import ConfigurationError, PromptError, SpecframeWarning
from specframe.contract.interfaces import BuildContext
from specframe.terms.kinds import DEFAULT_BUDGET
from specframe.terms.metrics import DecodeMetrics, PhaseTimer, now, peak_memory_bytes, reset_peak_memory
from specframe.support.paths import check_writable_dir
from specframe.terms.target import Target
from specframe.plugging.pipeline import Pipeline, assemble, check_request
from specframe.terms.proposal import DraftContext, DraftProposal
from specframe.terms.records import StepEvent, StepOutcome
from specframe.terms.request import check_request_input
from specframe.terms.result import GenerationResult
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.terms.sampling import Sampler, SamplingParams
from specframe.terms.stopping import StopStrings
from specframe.terms.tree import TokenTree


class SpeculativeDecoder:
    """A reusable decoder: one target, one pipeline of components, any number of requests."""

    def __init__(self, target: Target, pipeline: Pipeline, *, budget: int | str = DEFAULT_BUDGET,
                 sampling: SamplingParams | None = None, registry: PluginRegistry | None = None,
                 cost: CostModel | None = None, acceptance_file: str | Path | None = None,
                 progress: bool = True, phase_timing: bool = True,
                 step_timer: Callable[[Callable[[], None] | None], PhaseTimer] = PhaseTimer):
        self.budget, self.adaptive = parse_budget(budget)  # a fixed size, or the cap of "auto"
        self.target, self.pipeline = target, pipeline
        # May be replaced between requests: each request is checked and planned by the sampling it runs with
        self.sampling = sampling or SamplingParams()
        self.registry = registry or get_registry()
        # For budget="auto": None measures the backend's cost once, caches it and scales it to the speed
        # real steps show; a cost model passed here is used as given.
        self.cost = cost
        # For budget="auto": where the acceptance counts persist across decoders (read at the first
        # request, written after each); None keeps them for this decoder only.
        self.acceptance_file = None if acceptance_file is None else Path(acceptance_file)
        if self.acceptance_file is not None:  # before any work, not when the first request is done
            check_writable_dir(self.acceptance_file.parent, "the acceptance_file directory",
                               "pass an acceptance_file in a writable directory (its lock goes there too)")
        self.progress = progress  # show the one-time cost calibration of budget="auto"
        # On an accelerator, wait for the device after every phase of a step so each is charged its own
        # work; False skips those waits (faster: totals stay right, the per-phase split is not measured).
        self.phase_timing = phase_timing
        # Times each step's phases: made at the step's start with the device's synchronizer (None when
        # not timing phases apart), closed at its end. `PhaseTimer` measures them; a replay of recorded
        # outputs (`specframe.bench.replay`) models the forward it does not run.
        self.step_timer = step_timer
        self.planner: FixedPlanner | AdaptivePlanner | None = None  # made at the first request

    @classmethod
    def from_names(cls, target: Target, drafter="pld", tree="chain", verifier="greedy", backend="kv", *,
                   budget: int | str = DEFAULT_BUDGET, sampling: SamplingParams | None = None,
                   registry: PluginRegistry | None = None, phase_timing: bool = True) -> SpeculativeDecoder:
        pipeline = assemble(target, drafter, tree, verifier, backend, sampling, registry)
        return cls(target, pipeline, budget=budget, sampling=sampling, registry=registry,
                   phase_timing=phase_timing)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
                 stop: str | Sequence[str] = (), *, seed: int | None = None) -> GenerationResult:
        """Decode up to `max_new_tokens` after `prompt` (text, or token ids: a list, a 1-D array or
        tensor), stopping at EOS or at a `stop` string (one string, or several).

        `seed` replaces the sampling seed for this request only (e.g. one seed per sample of best-of-n);
        None keeps `sampling.seed`."""
        stop = check_request_input(prompt, max_new_tokens, stop)
        prompt_ids = self._encode(prompt)
        self._check_request(prompt_ids, max_new_tokens, stop)
        sampling = self.sampling if seed is None else replace(self.sampling, seed=seed)
        check_request(self.pipeline, sampling, self.registry)  # `sampling` may have changed since assembly
        planner = self._planner()  # the first request may calibrate the cost: not part of its time
        hook = self.registry.hook
        hook.on_decode_start(prompt_ids=prompt_ids)
        device, sync = self.target.device, synchronizer(self.target.device)
        reset_peak_memory(device)  # on CUDA the peak is this request's, not the process's
        start = now()
        tokens, metrics, reason = self._decode(planner, prompt_ids, max_new_tokens, stop, sampling)
        if sync is not None:
            sync()  # queued work is part of the request's time
        metrics.wall_s = now() - start
        metrics.peak_memory_bytes = peak_memory_bytes(device)
        tokenizer = self.target.tokenizer
        text = tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else None
        result = GenerationResult(tokens, text, reason, metrics)
        self.pipeline.drafter.finish(prompt_ids, result.tokens)  # not timed: the request is over
        if self.acceptance_file is not None and isinstance(self.planner, AdaptivePlanner):
            try:
                self.planner.acceptance.save(self.acceptance_file)
            except (OSError, ConfigurationError) as err:  # the result stands: warn, save with the next
                warnings.warn(SpecframeWarning(
                    f"the acceptance counts could not be saved to {self.acceptance_file} ({err}); they are "
                    "kept and saved after the next request"), stacklevel=2)
        hook.on_decode_end(prompt_ids=prompt_ids, result=result)
        return result

    def _decode(self, planner: FixedPlanner | AdaptivePlanner, prompt_ids: list[int], max_new_tokens: int,
                stop: Sequence[str], sampling: SamplingParams):
        """The loop, in the paper's words. Returns (new tokens, metrics, finish reason)."""
        drafter, tree_builder, verifier, backend = (
            self.pipeline.drafter, self.pipeline.tree_builder, self.pipeline.verifier, self.pipeline.backend)
        sampler = Sampler(sampling, device=self.target.device)
        stops = StopStrings(self.target.tokenizer, stop)
        metrics = DecodeMetrics(prompt_tokens=len(prompt_ids), phase_timing=self.phase_timing)
        sync = synchronizer(self.target.device)  # None on the CPU
        phase_sync = sync if self.phase_timing else None
        drafter.reset()
        planner.start_request(blind=plans_blind(self.pipeline, sampling))  # this request's sampling decides
        t0 = now()
        backend.prefill(prompt_ids)
        if sync is not None:
            sync()  # once per request, even without phase timing: keeps prefill_s and decode tokens/s right
        metrics.prefill_s = now() - t0
        tokens, new, hidden, reason = np.array(prompt_ids, dtype=np.int64), [], None, None
        while reason is None:
            timer = self.step_timer(phase_sync)
            room = min(max_new_tokens - len(new) - 1, self._room(tokens))
            planner.start_step(len(tokens))
            with timer("draft"):
                drafting = room > 0 and planner.should_draft()
                budget = planner.build_budget(room) if drafting else 0
                context = DraftContext(tokens, len(prompt_ids), budget, hidden, sampler)
                proposal = drafter.propose(context) if drafting else DraftProposal.empty()
            with timer("tree"):
                tree = (tree_builder.build(proposal, BuildContext(budget, planner.cost)) if len(proposal)
                        else TokenTree.empty())
                tree, predicted = planner.choose(proposal, tree)
            with timer("forward"):
                scores = backend.score(tree)
            with timer("verify"):
                result = verifier.verify(tree, scores, sampler)
            with timer("commit"):
                backend.commit(scores, result.path, result.bonus)
            emitted = [int(t) for t in tree.tokens[result.path]] + [result.bonus]
            last = result.path[-1] + 1 if result.path else 0
            hidden = scores.hidden[last] if scores.hidden is not None else None
            drafter.observe(StepOutcome(proposal, len(tree), emitted[:-1], result.bonus, hidden))
            emitted, reason = self._finish(new, emitted, max_new_tokens, stops)
            new += emitted
            tokens = np.concatenate([tokens, np.asarray(emitted, dtype=np.int64)])
            times = timer.close()
            planner.observe(tree, result, times)
            skipped = room > 0 and not drafting  # the planner judged drafting not worth it
            metrics.record_step(len(tree), result.accepted, times, result.fallback, predicted, skipped)
            self.registry.hook.on_step(event=StepEvent(
                metrics.steps, len(tree), result.accepted, emitted, times, predicted, not skipped))
        metrics.new_tokens = len(new)
        return new, metrics, reason

    def _planner(self) -> FixedPlanner | AdaptivePlanner:
        """The step planner, made once: for `budget="auto"` this measures (or loads) the backend's cost
        model, which prefills the backend with a synthetic prompt, so it runs before a request's prefill."""
        if self.planner is None and self.adaptive:
            self.planner = make_adaptive_planner(self.pipeline, self.budget, self.cost, self.acceptance_file,
                                                 self.progress, self.phase_timing)
        elif self.planner is None:
            self.planner = make_fixed_planner(self.pipeline, self.budget)
        return self.planner

    def _finish(self, new: list[int], emitted: list[int], max_new_tokens: int, stops: StopStrings):
        """Cut `emitted` at EOS, a stop string or the length limit; say why decoding ends, if it does."""
        eos = self.target.eos_token_ids
        for i, tok in enumerate(emitted):
            if tok in eos:
                return emitted[: i + 1], "eos"
        if len(new) + len(emitted) >= max_new_tokens:
            return emitted[: max_new_tokens - len(new)], "length"
        hit = stops.first_hit(new, emitted)
        if hit is not None:
            return emitted[: hit + 1], "stop"
        return emitted, None

    def _room(self, tokens: np.ndarray) -> int:
        """Tree nodes that still fit the model's context after the pending root."""
        return self.target.max_context - len(tokens) - 1

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.target.tokenizer is None:
                raise PromptError(f"model '{self.target.name}' has no tokenizer: pass token ids")
            return list(self.target.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        return token_ids(prompt)

    def _check_request(self, prompt_ids: list[int], max_new_tokens: int, stop: tuple[str, ...]) -> None:
        """What `check_request_input` cannot check without the model."""
        if not prompt_ids:
            raise PromptError("the prompt is empty: it must hold at least one token")
        if stop and self.target.tokenizer is None:
            raise ConfigurationError(f"stop strings need text, and model '{self.target.name}' has no "
                                     "tokenizer: leave stop unset, or load the model with its tokenizer")
        vocab = self.target.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise PromptError(f"prompt token ids must be in [0, {vocab}) for model '{self.target.name}'")
        limit = self.target.max_context
        if len(prompt_ids) + max_new_tokens > limit:
            raise PromptError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"context of model '{self.target.name}' ({limit} tokens): shorten the prompt or "
                "lower max_new_tokens")


def generate(prompt: str | Sequence[int], *, target: Target | None = None, model: str = "smollm2-135m",
             drafter="pld", tree="chain", verifier="greedy", backend="kv", budget: int | str = DEFAULT_BUDGET,
             max_new_tokens: int = 128, sampling: SamplingParams | None = None,
             stop: Sequence[str] = ()) -> GenerationResult:
    """One-call API: load (or reuse) a target, assemble the pipeline and decode one prompt."""
    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import load_target

    target = target or load_target(model, recipes=model_recipes)
    decoder = SpeculativeDecoder.from_names(target, drafter, tree, verifier, backend, budget=budget,
                                            sampling=sampling)
    return decoder.generate(prompt, max_new_tokens=max_new_tokens, stop=stop)


def token_ids(prompt) -> list[int]:
    """A prompt given as token ids, as a list of ints: a sequence of integers, or a 1-D numpy array or
    torch tensor of them. Anything else (a batch, floats, text pieces) is refused, never truncated."""
    if getattr(prompt, "ndim", 1) != 1:
        raise PromptError(f"prompt token ids must be one flat sequence, got shape {tuple(prompt.shape)}: "
                          "pass one prompt's ids (e.g. ids[0] of a batch)")
    ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
    if bad is not None:
        raise PromptError(f"prompt token ids must be integers, got {bad!r} ({type(bad).__name__}): "
                          "pass text as a str, or the ids of its tokens")
    return [int(t) for t in ids]
