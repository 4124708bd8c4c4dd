"""The serving engine: one thread decoding every admitted request in continuous batches.

HTTP handlers (`specframe.serve.app`) check a request (`Engine.check`: prompt length, limits, method and
sampling, before any work) and `submit` it with a `Ticket`, the request's way back. The engine thread
owns the model: between any two steps it admits waiting requests into a free row (their prefill), frees
the rows of requests whose client went away, and steps every method that has rows in flight, handing
each request the text its step added (`StreamDelta`) on its ticket's queue.

A method (a pipeline spec or preset, as `specframe bench --methods` takes) is chosen per request; each
method in use decodes its requests in its own `RowSession` of at most `batch_size` rows, so requests of
one method share a forward and methods take turns step by step. `none` turns speculation off for a
request: it is plain decoding (`none@1`).

Nothing a request does can stop the thread: a failure inside a step ends that method's requests in flight
with an error (what each had decoded is not sent as a success) and the method starts afresh.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, field

from specframe.bench.methods import parse_method
from specframe.decode.loop import SpeculativeDecoder
from specframe.decode.session import Request, RowSession, StreamedRow
from specframe.plugging.pipeline import assemble
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.terms.errors import ConfigurationError, DrafterError, SpecframeError
from specframe.terms.result import GenerationResult, StreamDelta
from specframe.terms.sampling import SamplingParams
from specframe.terms.target import Target

log = logging.getLogger("specframe.serve")

PLAIN = "none@1"  # what a request's `"method": "none"` decodes with


class QueueFull(SpecframeError):
    """The engine's queue of waiting requests is full: answered at once (HTTP 429), never queued."""


class Closing(SpecframeError):
    """The server is shutting down and takes no new request (HTTP 503)."""


@dataclass
class Failure:
    """The end of a request that did not finish (its event stream's last item): `cancelled` (its client
    went away, or the server shut down) or an error inside the engine."""

    message: str
    result: GenerationResult | None = None  # what it decoded, when anything
    cancelled: bool = False


class Ticket:
    """One request's way back from the engine thread to its handler: its events (`StreamDelta`s, the
    last with the result, or a `Failure`) arrive on an asyncio queue of the handler's event loop.
    `cancel` (the client went away) frees its row at the engine's next step."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()

    def put(self, event: StreamDelta | Failure) -> None:
        """From the engine thread: hand `event` to the handler's loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's loop is closed: nobody is listening
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Submission:
    """A checked request, the method that decodes it, and its ticket."""

    method: str
    request: Request
    ticket: Ticket


@dataclass
class MethodRows:
    """One method's decoder, its session of rows in flight and their tickets."""

    label: str
    decoder: SpeculativeDecoder
    session: RowSession
    streams: dict[int, tuple[Ticket, StreamedRow]] = field(default_factory=dict)


@dataclass
class EngineStats:
    """Counters for the metrics endpoint, updated by the engine thread."""

    requests: dict[str, int] = field(default_factory=dict)  # by how they ended
    new_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0

    def count(self, outcome: str, result: GenerationResult | None = None) -> None:
        self.requests[outcome] = self.requests.get(outcome, 0) + 1
        if result is not None:
            metrics = result.metrics
            self.new_tokens += len(result.tokens)
            self.drafted_tokens += metrics.draft_tokens
            self.accepted_tokens += metrics.accepted_draft_tokens
            self.steps += metrics.steps


class Engine:
    """Decodes the submitted requests of `target` (see the module docstring). `method` is the default
    method; `batch_size` caps each method's rows in flight, `queue_size` the requests waiting for one
    (a request beyond it is refused at once with `QueueFull`)."""

    def __init__(self, target: Target, method: str, *, batch_size: int = 8, queue_size: int = 64,
                 max_tokens: int | None = None, registry: PluginRegistry | None = None):
        if batch_size < 1 or queue_size < 0:
            raise ConfigurationError(f"batch_size must be at least 1 and queue_size at least 0, got "
                                     f"{batch_size} and {queue_size}")
        self.target, self.batch_size, self.queue_size = target, batch_size, queue_size
        self.max_tokens = max_tokens or target.max_context
        self.registry = registry or get_registry()
        self.default_method = self.method_label(method)
        self.stats = EngineStats()
        self._methods: dict[str, MethodRows] = {}
        self._waiting: deque[Submission] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._assembling = threading.Lock()
        self.rows(self.default_method)  # assembled (and calibrated) before the first request

    # -- from the handlers ------------------------------------------------------------------------------

    def method_label(self, method: str | None) -> str:
        """The label of `method` (None: the default), parsed and checked: an unknown name raises."""
        if method is None:
            return self.default_method
        method = PLAIN if method.strip() == "none" else method
        return parse_method(method, self.registry).label

    def check(self, prompt_ids: list[int], max_tokens: int, stop: tuple[str, ...],
              sampling: SamplingParams, method: str | None = None) -> tuple[str, Request]:
        """A request checked before any work: its method's label and the `Request` it decodes. Raises a
        `SpecframeError` saying what to fix (an unknown method, a prompt too long for the context, a
        max_tokens over the server's limit, a sampling the method's verifier cannot serve)."""
        if max_tokens > self.max_tokens:
            raise ConfigurationError(f"max_tokens is {max_tokens}, over this server's limit of "
                                     f"{self.max_tokens}: ask for fewer tokens")
        label = self.method_label(method)
        decoder = self.rows(label).decoder
        return label, decoder.request(prompt_ids, max_tokens, stop, sampling=sampling)

    def submit(self, method: str, request: Request, ticket: Ticket) -> None:
        """Queue a checked request; refused at once when the queue is full or the server is closing."""
        with self._wake:
            if self._closing:
                raise Closing("the server is shutting down: send the request to another server")
            if len(self._waiting) >= self.queue_size:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (the queue holds "
                                f"{self.queue_size}): retry later")
            self._waiting.append(Submission(method, request, ticket))
            self._wake.notify()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return sum(len(rows.streams) for rows in list(self._methods.values()))

    def methods(self) -> list[str]:
        return list(self._methods)

    # -- the thread -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specframe-engine", daemon=True)
        self._thread.start()

    def shutdown(self, drain_s: float = 30.0) -> None:
        """Take no new request; let the requests in flight and waiting finish for up to `drain_s`
        seconds, then cancel the rest (their clients get what was decoded, finish reason "cancelled")."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is None:
            return
        self._thread.join(drain_s)
        if self._thread.is_alive():
            with self._wake:
                for submission in self._waiting:
                    submission.ticket.cancel()
                for rows in self._methods.values():
                    for ticket, _ in rows.streams.values():
                        ticket.cancel()
                self._wake.notify()
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self.running and not self._closing:
                    self._wake.wait()
                if self._closing and not self._waiting and not self.running:
                    return
                admitted = self._take_admissible()
            for submission in admitted:
                self._admit(submission)
            for rows in list(self._methods.values()):
                self._drop_cancelled(rows)
                if rows.streams:
                    self._step(rows)

    def _take_admissible(self) -> list[Submission]:
        """The waiting requests that a free row of their method can take now, oldest first (a method
        whose rows are full does not hold back the others)."""
        taken, kept, room = [], deque(), {}
        for submission in self._waiting:
            if submission.ticket.cancelled.is_set():
                self.stats.count("cancelled")
                submission.ticket.put(Failure(self._cancel_reason(), cancelled=True))
                continue
            rows = self._methods.get(submission.method)
            free = room.setdefault(submission.method, self.batch_size - (len(rows.streams) if rows else 0))
            if free > 0:
                room[submission.method] -= 1
                taken.append(submission)
            else:
                kept.append(submission)
        self._waiting = kept
        return taken

    def _cancel_reason(self) -> str:
        if self._closing:
            return "cancelled: the server shut down before the request finished"
        return "cancelled: the client went away"

    def _admit(self, submission: Submission) -> None:
        try:
            rows = self.rows(submission.method)
            key = rows.session.add(submission.request)
        except Exception as err:  # one request's failure must not stop the engine
            log.exception("request could not start")
            self.stats.count("error")
            submission.ticket.put(Failure(f"the request could not start ({type(err).__name__}: {err})"))
            return
        rows.streams[key] = (submission.ticket, StreamedRow(self.target.tokenizer))

    def _drop_cancelled(self, rows: MethodRows) -> None:
        for key, (ticket, _) in list(rows.streams.items()):
            if ticket.cancelled.is_set():
                result = rows.session.cancel(key)
                del rows.streams[key]
                self.stats.count("cancelled", result)
                ticket.put(Failure(self._cancel_reason(), result, cancelled=True))

    def _step(self, rows: MethodRows) -> None:
        try:
            self._emit(rows, rows.session.step())
        except DrafterError as err:
            self._fail_all(rows, str(err), err.partial or {})
        except Exception as err:  # a bug in a component: end this method's rows, go on
            log.exception("a decoding step failed")
            self._fail_all(rows, f"decoding failed ({type(err).__name__}: {err})", {})

    def _emit(self, rows: MethodRows, ended: dict[int, GenerationResult]) -> None:
        """Hand every request of `rows` what the step added; those that ended leave."""
        for key, (ticket, streamed) in list(rows.streams.items()):
            result = ended.get(key)
            tokens = rows.session.active[key].new if result is None else result.tokens
            delta = streamed.after_step(tokens, result)
            if result is not None:  # counted before its client can read the end
                del rows.streams[key]
                self.stats.count(result.finish_reason, result)
            if delta is not None:
                ticket.put(delta)

    def _fail_all(self, rows: MethodRows, message: str, partial: dict) -> None:
        """End every request of `rows` with `message`; its session starts afresh (the backend's rows may
        hold a half-done step)."""
        for key, (ticket, _) in rows.streams.items():
            self.stats.count("error")
            ticket.put(Failure(message, partial.get(key)))
        rows.streams.clear()
        rows.session = RowSession(rows.decoder, self.batch_size)

    def rows(self, label: str) -> MethodRows:
        """Method `label`'s decoder and rows, assembled at its first use (by the handler that checks its
        first request) and kept."""
        with self._assembling:
            return self._methods.get(label) or self._assemble(label)

    def _assemble(self, label: str) -> MethodRows:
        method = parse_method(label, self.registry)
        pipeline = assemble(self.target, method.drafter, method.tree, method.verifier, method.backend,
                            registry=self.registry)
        decoder = SpeculativeDecoder(self.target, pipeline, budget=method.budget, registry=self.registry,
                                     progress=False)
        # A session of its own: a method's first session makes its planner (at budget="auto", after
        # calibrating the backend's cost once on this machine, or loading it)
        rows = self._methods[label] = MethodRows(label, decoder, RowSession(decoder, self.batch_size))
        return rows
