"""Requests decoding together on one backend's rows: the loop every entry point shares.

A `RowSession` holds the requests in flight on `StateBackend.rows(size)`: `add` admits one (its prefill),
`step` advances every active row by one speculative step (draft, plan, score, verify, commit, advance:
`SpeculativeDecoder`'s one loop) and hands back the rows that ended, `cancel` ends one early. Requests may
join and leave between any two steps, which is continuous batching: `generate_batch` feeds a session from
a list, `stream` from one prompt, and the server (`specframe.serve`) from its request queue.

`StreamedRow` turns a row's growing tokens into what each step adds (`StreamDelta`: text and token ids),
holding back a character whose bytes are not all generated yet (`TextDeltas`), so the deltas of a request
add up to its result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specframe.contract.interfaces import BatchBackend
from specframe.decode.batch import BatchMetrics, shared_phase
from specframe.decode.row import RequestRow
from specframe.terms.constraint import Constraint
from specframe.terms.errors import DrafterError
from specframe.terms.metrics import now, peak_memory_bytes
from specframe.terms.result import GenerationResult, StreamDelta
from specframe.terms.sampling import SamplingParams
from specframe.runtime.devices import synchronizer


@dataclass(frozen=True)
class Request:
    """One request as the loop takes it: prompt ids, stop strings and the new-token limit, checked
    (`SpeculativeDecoder.request`), with its sampling and its constraint (None: free)."""

    prompt_ids: list[int]
    stop: tuple[str, ...]
    max_new_tokens: int
    sampling: SamplingParams
    constraint: Constraint | None = None


class RowSession:
    """The requests in flight on one backend's rows (see the module docstring).

    `decoder` is the `SpeculativeDecoder` whose pipeline, planner and observers the rows use; at most
    `size` rows decode at once. Each request drafts with a spawn of the pipeline's drafter, or with the
    pipeline's own one at `size` 1 (as `generate` always has). `metrics` holds the session's time split,
    each step's shared phases counted once."""

    def __init__(self, decoder, size: int, *, logprobs: bool = False):
        self.decoder, self.size, self.logprobs = decoder, size, logprobs
        # First: at budget="auto" the first request may calibrate, which replaces the pipeline's backend
        # by one built with the measured calibration (not part of any request's time)
        self.planner = decoder.step_planner()
        self.rows: BatchBackend = decoder.pipeline.backend.rows(size)
        self.active: dict[int, RequestRow] = {}  # backend row key -> its request's row
        self._starts: dict[int, float] = {}
        self.metrics = BatchMetrics()

    @property
    def full(self) -> bool:
        return len(self.active) >= self.size

    def add(self, request: Request) -> int:
        """Admit `request` (its prefill is part of its own time); returns its row key. The session must
        have room (`full` is False)."""
        if self.full:
            raise RuntimeError(f"the session decodes {self.size} rows at most: wait for one to end")
        decoder = self.decoder
        drafter = decoder.pipeline.drafter if self.size == 1 else decoder.pipeline.drafter.spawn()
        row = decoder.make_row(drafter, self.planner.row(), request.prompt_ids, request.max_new_tokens,
                               request.stop, request.sampling, self.logprobs, request.constraint)
        decoder.registry.hook.on_decode_start(prompt_ids=request.prompt_ids)
        row.start()
        start = now()
        key = self.rows.add(request.prompt_ids)
        self._sync()
        row.metrics.prefill_s = now() - start
        self.metrics.prefill_s += row.metrics.prefill_s
        self.active[key], self._starts[key] = row, start
        return key

    def step(self) -> dict[int, GenerationResult]:
        """One step of every active row (in the paper's words: each row drafts and builds its tree, the
        planner keeps what pays with every row in view, one scoring of all the trees, each row verified,
        one commit, each row advanced); the rows that ended leave, and their results come back by key.

        A drafter's failure ends every active row: the `DrafterError` raised carries each row's verified
        tokens as `partial`, a dict by key of results whose finish reason is "error"."""
        if not self.active:
            return {}
        try:
            self._step_rows()
        except DrafterError as err:
            err.partial = {key: self._end(key, self.decoder.partial_result(row), tell=False)
                           for key, row in list(self.active.items())}
            raise
        return {key: self._retire(key) for key, row in list(self.active.items()) if row.reason is not None}

    def cancel(self, key: int) -> GenerationResult:
        """End row `key` now (a client went away): what it decoded, finish reason "cancelled"; its drafter
        and the observers are not told of a response that was not finished."""
        row = self.active[key]
        result = self.decoder.partial_result(row)
        result.finish_reason = "cancelled"
        return self._end(key, result, tell=False)

    def _step_rows(self) -> None:
        decoder, active, rows = self.decoder, self.active, self.rows
        phase_sync = synchronizer(decoder.target.device) if decoder.phase_timing else None
        step_start = now()
        timers = {key: decoder.step_timer(phase_sync) for key in active}
        trees = {key: row.draft(timers[key]) for key, row in active.items()}
        for key, (tree, predicted) in self.planner.cut(trees, {k: row.planner for k, row in active.items()},
                                                       rows).items():
            active[key].keep(tree, predicted)
            trees[key] = tree
        with shared_phase(list(timers.values()), "forward") as forward:
            scores = rows.score(trees)
        verdicts = {key: row.verify(scores[key], timers[key]) for key, row in active.items()}
        with shared_phase(list(timers.values()), "commit") as commit:
            rows.commit({key: (scores[key], v.path, v.bonus) for key, v in verdicts.items()})
        drafting = sum(timer.times.get("draft", 0.0) for timer in timers.values())
        self.planner.observe_step(forward.seconds, now() - step_start, drafting)
        for key, row in active.items():
            row.advance(scores[key], verdicts[key], timers[key])
        self.metrics.record_step(now() - step_start, {"forward": forward.seconds, "commit": commit.seconds},
                                 [timer.times for timer in timers.values()])

    def _retire(self, key: int) -> GenerationResult:
        """A row that ended leaves: its result, its drafter told, its observers told."""
        self._sync()  # queued work is part of the request's time
        return self._end(key, self.decoder.finish_row(self.active[key]), tell=True)

    def _end(self, key: int, result: GenerationResult, tell: bool) -> GenerationResult:
        row = self.active.pop(key)
        start = self._starts.pop(key)
        row.metrics.new_tokens = len(row.new)
        row.metrics.wall_s = now() - start
        row.metrics.peak_memory_bytes = peak_memory_bytes(self.decoder.target.device)
        self.rows.remove(key)
        if tell:
            self.decoder.registry.hook.on_decode_end(prompt_ids=row.prompt_ids, result=result)
        return result

    def _sync(self) -> None:
        sync = synchronizer(self.decoder.target.device)
        if sync is not None:
            sync()


class StreamedRow:
    """What one streamed request has given out so far (`SpeculativeDecoder.stream`, the server)."""

    def __init__(self, tokenizer):
        self.text = TextDeltas(tokenizer)
        self.sent = 0  # tokens given out

    def after_step(self, tokens: Sequence[int], result: GenerationResult | None) -> StreamDelta | None:
        """The delta of a step after which the row holds `tokens` (its result's, once `result` is given):
        None while the step added no text (a character's first bytes), so ids go out with their text."""
        text = self.text.push(tokens) if result is None else self.text.flush(tokens)
        if not text and result is None:
            return None
        delta = StreamDelta(text, list(tokens[self.sent:]), result)
        self.sent = len(tokens)
        return delta


class TextDeltas:
    """The text a request's new tokens add, step by step (`SpeculativeDecoder.stream`, the server).

    `push(tokens)` takes every new token so far and returns the text not yet given out. The whole text is
    decoded each time (as the result's text is, special tokens skipped), and a trailing U+FFFD is held
    back: it is a character whose remaining bytes come with the next tokens. `flush` returns the rest at
    the end, so the deltas concatenate to the result's text wherever decoding a prefix of the tokens
    gives a prefix of the text (byte-level BPE and SentencePiece tokenizers do; the tests check the
    default model's). Without a tokenizer the text stays empty."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.sent = ""

    def push(self, tokens: Sequence[int]) -> str:
        text = self._text(tokens)
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        return self._give(text)

    def flush(self, tokens: Sequence[int]) -> str:
        return self._give(self._text(tokens))

    def _text(self, tokens: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def _give(self, text: str) -> str:
        if not text.startswith(self.sent):  # a decoding that rewrote earlier text (clean-up rules):
            return ""  # what was given out stands; wait until the text extends it again
        delta, self.sent = text[len(self.sent):], text
        return delta
