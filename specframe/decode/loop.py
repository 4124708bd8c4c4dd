"""The speculative decoder: a request checked, then decoded through the one loop (`session.RowSession`:
draft, build tree, score, verify, commit, observe), alone (`generate`), step by step (`stream`) or with
others (`generate_batch`, `best_of`)."""

from __future__ import annotations

import numbers
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from specframe.terms.budget import parse_budget
from specframe.terms.constraint import Constraint
from specframe.terms.cost import CostModel
from specframe.terms.errors import ConfigurationError, DrafterError, PromptError, SpecframeWarning
from specframe.terms.kinds import DEFAULT_BUDGET
from specframe.terms.metrics import PhaseTimer, reset_peak_memory
from specframe.terms.request import check_request_input
from specframe.terms.result import GenerationResult, StreamDelta
from specframe.terms.sampling import SamplingParams
from specframe.terms.target import Target
from specframe.support.paths import check_writable_dir
from specframe.plugging.pipeline import Pipeline, assemble, check_request
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.decode.batch import BatchMetrics, is_batch
from specframe.decode.adaptive import AdaptivePlanner, make_adaptive_planner
from specframe.decode.planner import FixedPlanner, StepPlanner, make_fixed_planner, plans_blind
from specframe.decode.constrained import check_constraint
from specframe.decode.row import RequestRow
from specframe.decode.session import Request, RowSession, StreamedRow

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
        # Made at the first request and kept: what it learns of the machine, of acceptance and of whether
        # dear drafting pays serves every later request, alone or in a batch
        self.planner: FixedPlanner | AdaptivePlanner | None = None
        # The time split of the latest `generate_batch` call as a whole: each row's own split holds the
        # shared forward and commit in full, so the rows' splits add up to more than the call took.
        self.batch_metrics: BatchMetrics | None = None

    @classmethod
    def from_names(cls, target: Target, drafter="pld", tree="chain", verifier="greedy", backend="kv", *,
                   budget: int | str = DEFAULT_BUDGET, sampling: SamplingParams | None = None,
                   registry: PluginRegistry | None = None, phase_timing: bool = True) -> SpeculativeDecoder:
        pipeline = assemble(target, drafter, tree, verifier, backend, sampling, registry)
        return cls(target, pipeline, budget=budget, sampling=sampling, registry=registry,
                   phase_timing=phase_timing)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
                 stop: str | Sequence[str] = (), *, seed: int | None = None,
                 constraint: Constraint | None = None) -> GenerationResult:
        """Decode up to `max_new_tokens` after `prompt` (text, or token ids: a list, a 1-D array or
        tensor), stopping at EOS or at a `stop` string (one string, or several).

        `seed` replaces the sampling seed for this request only (e.g. one seed per sample of best-of-n);
        None keeps `sampling.seed`. With `verifier="sample-match"` (or greedy decoding) the text is a
        function of the prompt, the seed and the pipeline alone: plain sampling's with that seed, at any
        budget, on a fresh or a warm decoder. `rejection` over sampled drafts (`draft-model`, `s4c`) decides
        on the tree's tokens, so its text for a seed also depends on the tree: it is reproducible at a
        fixed budget, not at `budget="auto"`, whose trees follow the step times and acceptance the planner
        measured; the lossy `typical` depends on the tree with any drafter ("Seeds and reproducibility" in
        docs/explanation/lossless-sampling.md). Several prompts (a list of texts, or of id lists) go to
        `generate_batch` and a list of results comes back (each row with `seed`, as if alone).

        `constraint` (structured output: `specframe.constraint_for` makes one from a JSON schema, a regular
        expression or a grammar) restricts the new tokens: they follow the target's law masked to what
        the constraint allows at each position (mask, then temperature, top-k, top-p); greedy is the
        argmax of the masked logits; speculation stays lossless (docs/explanation/structured-output.md)."""
        if is_batch(prompt):
            return self.generate_batch(prompt, max_new_tokens, stop, constraint=constraint,
                                       seeds=None if seed is None else [seed] * len(prompt))
        request = self.request(prompt, max_new_tokens, stop, seed=seed, constraint=constraint)
        try:
            return self._decode_rows([request], size=1)[0]
        except DrafterError as err:  # what was decoded is verified: it goes with the error
            if isinstance(err.partial, list):
                err.partial = err.partial[0]
            raise

    def generate_batch(self, prompts: Sequence[str | Sequence[int]],
                       max_new_tokens: int | Sequence[int] = 128, stop: str | Sequence[str] = (), *,
                       seeds: Sequence[int | None] | None = None, batch_size: int | None = None,
                       logprobs: bool = False,
                       constraint: Constraint | Sequence[Constraint | None] | None = None
                       ) -> list[GenerationResult]:
        """Decode several prompts together, each to its own end (EOS, a stop string, `max_new_tokens`):
        every step drafts and builds a tree for each row, scores all the trees together (in one forward
        where the backend batches: `StateBackend.batch`), then verifies and commits each row on its own.
        Returns one result per prompt, in order; each is what `generate` gives for that prompt alone.
        `max_new_tokens` is one limit for every prompt, or one per prompt.

        `seeds[i]` is prompt i's sampling seed (None keeps `sampling.seed`): a row samples from its own
        generator, never from another row's. With `verifier="sample-match"` a row's text is therefore what
        `generate(prompts[i], seed=seeds[i])` gives, whatever else is in the batch, at any budget. With
        `rejection` over sampled drafts that holds at a fixed budget only: at
        `budget="auto"` the rows' trees are sized together, so a row's tree, and with it its text, depends
        on the other rows and on measured times (see `generate`). `batch_size` caps the rows
        decoded at once: when a row ends, the next waiting prompt takes its place (continuous batching);
        None decodes all prompts at once. A result's `wall_s` runs from its row's start to its end.
        `logprobs` fills each result's `logprob` (the target's log-probability of its tokens).
        Afterwards `batch_metrics` holds the call's time split, every step's phases counted once.
        `constraint` is one constraint for every prompt, or one per prompt (None: that row is free); each
        row holds its own constraint state (see `generate`)."""
        if isinstance(prompts, str) or not len(prompts):
            raise PromptError("generate_batch takes a non-empty list of prompts (texts or token id lists); "
                              "for one prompt call generate")
        seeds = [None] * len(prompts) if seeds is None else list(seeds)
        if len(seeds) != len(prompts):
            raise ConfigurationError(f"{len(seeds)} seeds for {len(prompts)} prompts: pass one per prompt")
        if batch_size is not None and batch_size < 1:
            raise ConfigurationError(f"batch_size must be at least 1, got {batch_size}")
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(limits) != len(prompts):
            raise ConfigurationError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts: pass one "
                                     "limit, or one per prompt")
        constraints = self._constraints(constraint, len(prompts))
        requests = [Request(*self._checked(prompt, limit, stop), limit, self._sampling(seed), constrained)
                    for prompt, limit, seed, constrained in zip(prompts, limits, seeds, constraints)]
        return self._decode_rows(requests, batch_size or len(prompts), logprobs)

    def best_of(self, prompt: str | Sequence[int], n: int, max_new_tokens: int = 128,
                stop: str | Sequence[str] = (), *, seed: int | None = None) -> list[GenerationResult]:
        """`n` samples of `prompt` decoded as one batch whose rows share the prompt (the `kv` backend reads
        it once), best first: by the mean log-probability the target gives a sample's tokens
        (`GenerationResult.logprob` over its length). Sample i draws with seed `seed + i` (default: the
        sampling's seed, else 0). With `verifier="sample-match"` each sample is what
        `generate(prompt, seed=seed + i)` gives, at any budget; with `rejection` over sampled drafts only
        at a fixed budget (see `generate_batch`)."""
        if self.sampling.greedy:
            raise ConfigurationError("best_of draws n samples, and greedy decoding gives one answer n times: "
                                     "set sampling=SamplingParams(temperature=...) above 0")
        if n < 1:
            raise ConfigurationError(f"best_of needs n >= 1 samples, got {n}")
        first = seed if seed is not None else (self.sampling.seed or 0)
        samples = self.generate_batch([prompt] * n, max_new_tokens, stop, seeds=[first + i for i in range(n)],
                                      logprobs=True)
        return sorted(samples, key=lambda r: -r.logprob / max(len(r.tokens), 1))

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
               stop: str | Sequence[str] = (), *, seed: int | None = None,
               constraint: Constraint | None = None) -> Iterator[StreamDelta]:
        """`generate`, step by step: yields a `StreamDelta` after every step that emitted text (the text it
        adds and the ids of the tokens it committed), the last one with the request's `result`. The
        deltas' texts concatenate to `result.text` and their ids to `result.tokens`, which are what
        `generate` gives for the same arguments. Closing the iterator early frees the request's row.

        >>> for delta in decoder.stream("def fib(n):", max_new_tokens=64):
        ...     print(delta.text, end="", flush=True)
        """
        request = self.request(prompt, max_new_tokens, stop, seed=seed, constraint=constraint)
        session = RowSession(self, 1)
        key = session.add(request)
        streamed = StreamedRow(self.target.tokenizer)
        try:
            while key in session.active:
                ended = session.step().get(key)
                delta = streamed.after_step(session.active[key].new if ended is None else ended.tokens, ended)
                if delta is not None:
                    yield delta
        except DrafterError as err:  # what was decoded is verified: it goes with the error
            err.partial = err.partial[key]
            raise
        finally:
            if key in session.active:  # the caller stopped reading
                session.cancel(key)
            self._save_acceptance()

    def request(self, prompt: str | Sequence[int], max_new_tokens: int = 128, stop: str | Sequence[str] = (),
                *, seed: int | None = None, sampling: SamplingParams | None = None,
                constraint: Constraint | None = None) -> Request:
        """One request checked against this decoder's model and pipeline, before any work (an empty or
        over-long prompt, an unservable sampling or constraint is refused here with a clear error): what a
        `RowSession` of this decoder admits. `sampling` replaces the decoder's for this request (the
        server's requests each carry their own), `seed` then replaces its seed."""
        return Request(*self._checked(prompt, max_new_tokens, stop), max_new_tokens,
                       self._sampling(seed, sampling), self._constraints(constraint, 1)[0])

    def _decode_rows(self, requests: Sequence[Request], size: int, logprobs: bool = False
                     ) -> list[GenerationResult]:
        """`requests` decoded at most `size` at a time in one `RowSession`: a row that ends leaves and the
        next waiting request takes its place. Their results in order."""
        session = RowSession(self, size, logprobs=logprobs)
        self.batch_metrics = session.metrics
        reset_peak_memory(self.target.device)  # on CUDA the peak is this call's, not the process's
        waiting = deque(range(len(requests)))
        index_of: dict[int, int] = {}  # row key -> request index
        results: list[GenerationResult | None] = [None] * len(requests)
        while waiting or session.active:
            while waiting and not session.full:  # a free place: the next request takes it
                index = waiting.popleft()
                index_of[session.add(requests[index])] = index
            try:
                ended = session.step()
            except DrafterError as err:  # every row's verified tokens go with the error
                for key, result in err.partial.items():
                    results[index_of[key]] = result
                err.partial = results
                raise
            for key, result in ended.items():
                results[index_of.pop(key)] = result
        self._save_acceptance()
        return results

    def _save_acceptance(self) -> None:
        """Persist the acceptance counts after a call, when the decoder was given an `acceptance_file`."""
        if self.acceptance_file is None or not self.adaptive or self.planner is None:
            return
        try:
            self.planner.acceptance.save(self.acceptance_file)
        except (OSError, ConfigurationError) as err:  # the results stand: warn, save with the next call
            warnings.warn(SpecframeWarning(
                f"the acceptance counts could not be saved to {self.acceptance_file} ({err}); they are kept "
                "and saved after the next request"), stacklevel=3)

    def _checked(self, prompt, max_new_tokens: int, stop) -> tuple[list[int], tuple[str, ...]]:
        """A request's prompt ids and stop strings, refused with a clear error before any work."""
        stop = check_request_input(prompt, max_new_tokens, stop)
        prompt_ids = self._encode(prompt)
        self._check_request(prompt_ids, max_new_tokens, stop)
        return prompt_ids, stop

    def _constraints(self, constraint, rows: int) -> list[Constraint | None]:
        """One constraint per row (`constraint` is one for all, or a sequence of one per row), each checked
        against the pipeline and the target before any work (`check_constraint`)."""
        many = isinstance(constraint, (list, tuple))
        constraints = list(constraint) if many else [constraint] * rows
        if len(constraints) != rows:
            raise ConfigurationError(f"{len(constraints)} constraints for {rows} prompts: pass one "
                                     "constraint, or one per prompt (None for a free row)")
        for one in {id(c): c for c in constraints if c is not None}.values():
            check_constraint(one, self.pipeline, self.target)
        return constraints

    def _sampling(self, seed: int | None, sampling: SamplingParams | None = None) -> SamplingParams:
        """The request's sampling (`sampling`, else the decoder's; `seed` replacing its seed), checked
        against the pipeline."""
        sampling = sampling or self.sampling
        sampling = sampling if seed is None else replace(sampling, seed=seed)
        check_request(self.pipeline, sampling, self.registry)  # `sampling` may have changed since assembly
        return sampling

    def make_row(self, drafter, planner, prompt_ids: list[int], max_new_tokens: int, stop: Sequence[str],
                 sampling: SamplingParams, logprobs: bool = False,
                 constraint: Constraint | None = None) -> RequestRow:
        """A request's decoding state, drafted by `drafter` and planned by `planner`."""
        return RequestRow(self.target, self.pipeline, drafter, planner, prompt_ids, max_new_tokens, stop,
                          sampling, blind=plans_blind(self.pipeline, sampling), hook=self.registry.hook,
                          phase_timing=self.phase_timing, logprobs=logprobs, constraint=constraint)

    def finish_row(self, row: RequestRow) -> GenerationResult:
        """The result of a row that ended; its drafter learns the response (not timed: the request is
        over)."""
        tokenizer = self.target.tokenizer
        text = tokenizer.decode(row.new, skip_special_tokens=True) if tokenizer is not None else None
        result = GenerationResult(row.new, text, row.reason, row.metrics, row.logprob)
        row.drafter.finish(row.prompt_ids, result.tokens)
        return result

    def partial_result(self, row: RequestRow) -> GenerationResult:
        """What a row whose drafter failed decoded until then (finish_reason "error"); the drafter is not
        told, since it failed."""
        tokenizer = self.target.tokenizer
        text = tokenizer.decode(row.new, skip_special_tokens=True) if tokenizer is not None else None
        row.metrics.new_tokens = len(row.new)
        return GenerationResult(list(row.new), text, "error", row.metrics, row.logprob)

    def step_planner(self) -> StepPlanner:
        """The decoder's planner, made at its first request and kept (what it learns serves every later
        call, alone or in a batch): `FixedPlanner` at a fixed budget, `AdaptivePlanner` at
        `budget="auto"`. Making `AdaptivePlanner` loads the backend's measured cost, or measures it on
        backends built for measuring and replaces the pipeline's backend by one built with it
        (`specframe.plugging.pipeline.calibrate_pipeline`): so it runs before a request's prefill, and
        before anything reads `self.pipeline.backend` for that request."""
        if self.planner is None and self.adaptive:
            self.planner = make_adaptive_planner(self.pipeline, self.budget, self.cost, self.acceptance_file,
                                                 self.progress, self.phase_timing)
        elif self.planner is None:
            self.planner = make_fixed_planner(self.pipeline, self.budget)
        return self.planner

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
