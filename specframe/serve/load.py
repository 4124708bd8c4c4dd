"""The load generator of `specframe serve-bench`: requests sent to an OpenAI-compatible server over HTTP as
a Poisson process, every one streamed and timed.

A *stream* is one method (or peer) at one request rate: N requests, each sent at its arrival time and
read as server-sent events. The arrival times are seeded exponential gaps, so a run is repeatable and
every method at a rate meets the same arrivals with the same prompts (a paired comparison). Each request
ends as a `RequestRecord`: when it was sent, when its first text arrived, when it ended, its tokens (the
server's `usage` where it reports one, else its chunks with text counted), finish reason, text and the
server's `speculation` object. A request refused (HTTP 4xx or 5xx), broken off or outliving its timeout
is an error record, never a hang. The statistics over a stream are `specframe.serve.load_report`'s.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass

from specframe.support.prompt_suites import load_suite
from specframe.terms.errors import ConfigurationError

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
DONE = "[DONE]"


@dataclass(frozen=True)
class LoadRequest:
    """One request of a stream: the question it asks (the first turn of a suite question), and whether it
    goes to the chat endpoint (chat prompts) or the completions endpoint (raw text such as HumanEval)."""

    index: int
    qid: str
    prompt: str
    chat: bool

    @property
    def endpoint(self) -> str:
        return CHAT if self.chat else COMPLETIONS


@dataclass
class RequestRecord:
    """What one request met, in seconds from its stream's start (None: it never got there)."""

    index: int
    qid: str
    scheduled_s: float
    sent_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    chunks: int = 0  # chunks that carried text
    usage_tokens: int | None = None  # completion_tokens of the server's usage, where it sent one
    finish_reason: str | None = None
    text: str = ""
    error: str | None = None
    speculation: dict | None = None

    @property
    def tokens(self) -> int:
        """Output tokens: the server's count, else one per chunk with text (a server that streams a token
        per chunk, as llama.cpp's does)."""
        return self.chunks if self.usage_tokens is None else self.usage_tokens

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens": self.tokens, "tokens_from": "chunks" if self.usage_tokens is None
                else "usage", "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "latency_s": self.latency_s}

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: from sending to the first chunk with text."""
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (end - first token) / (tokens - 1)."""
        if self.first_token_s is None or self.end_s is None or self.tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.tokens - 1)

    @property
    def latency_s(self) -> float | None:
        """End-to-end latency: from sending to the stream's end."""
        return None if self.end_s is None or self.sent_s is None else self.end_s - self.sent_s


class StreamError(Exception):
    """A request the server refused or broke off: the message is the error record's."""


def arrival_times(rate: float, count: int, seed: int | str) -> list[float]:
    """Seconds from a stream's start at which its `count` requests are sent: a Poisson process of `rate`
    requests per second, its exponential gaps drawn from `random.Random(seed)`."""
    if rate <= 0:
        raise ConfigurationError(f"a request rate must be above 0 requests/s, got {rate:g}")
    draw, at, times = random.Random(seed), 0.0, []
    for _ in range(count):
        at += draw.expovariate(rate)
        times.append(at)
    return times


def suite_requests(suite: str, limit: int | None, count: int, offset: int = 0) -> list[LoadRequest]:
    """`count` requests from the first turns of `suite` (read as `specframe bench` reads it, at most
    `limit` questions per category), from question `offset` on, wrapping round the suite."""
    prompts = load_suite(suite, limit)
    if not prompts:
        raise ConfigurationError(f"suite '{suite}' has no questions")
    picked = [prompts[(offset + i) % len(prompts)] for i in range(count)]
    return [LoadRequest(i, p.qid, p.turns[0], p.chat) for i, p in enumerate(picked)]


def request_body(request: LoadRequest, model: str, max_tokens: int, method: str | None) -> dict:
    """The streamed OpenAI request of `request`, greedy, asking for usage in its last chunk; `method` is
    specframe's per-request method field (None: the server's own method, and nothing a peer would not
    understand)."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if request.chat:
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    if method is not None:
        body["method"] = method
    return body


def read_event(line: str) -> dict | str | None:
    """One line of a server-sent event stream: its JSON payload, `DONE` for `data: [DONE]`, None for
    anything else (blank lines, comments, event names)."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:"):].strip()
    if data == DONE:
        return DONE
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        raise StreamError(f"the server sent an event that is not JSON: {short(data)}") from None


def absorb(record: RequestRecord, chunk: dict, now: float) -> None:
    """Add one streamed chunk (completions' `text` or chat's `delta.content`) to `record`, seen at `now`."""
    if not isinstance(chunk, dict):
        raise StreamError(f"the server sent an event that is not a JSON object: {short(json.dumps(chunk))}")
    if chunk.get("error"):
        raise StreamError(f"error event: {short(json.dumps(chunk['error']))}")
    for choice in chunk.get("choices") or ():
        text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        if text:
            record.first_token_s = now if record.first_token_s is None else record.first_token_s
            record.text += text
            record.chunks += 1
        record.finish_reason = choice.get("finish_reason") or record.finish_reason
    usage = chunk.get("usage") or {}
    if usage.get("completion_tokens") is not None:
        record.usage_tokens = int(usage["completion_tokens"])
    if chunk.get("speculation"):
        record.speculation = chunk["speculation"]


def short(text: str, limit: int = 200) -> str:
    """`text` on one line, cut to `limit` characters, for an error record."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


async def read_stream(client, url: str, body: dict, record: RequestRecord, start: float) -> None:
    """POST `body` to `url` and read its event stream into `record` until `data: [DONE]`."""
    async with client.stream("POST", url, json=body) as response:
        if response.status_code >= 400:
            detail = (await response.aread()).decode("utf-8", "replace")
            raise StreamError(f"HTTP {response.status_code}: {short(detail)}")
        async for line in response.aiter_lines():
            event = read_event(line)
            if event == DONE:
                return
            if event is not None:
                absorb(record, event, time.perf_counter() - start)
    raise StreamError("the stream ended before its [DONE] event")


async def send(client, url: str, body: dict, record: RequestRecord, start: float, timeout: float) -> None:
    """Send one request at its scheduled time and fill `record`; any failure becomes its error."""
    import httpx

    await asyncio.sleep(max(0.0, record.scheduled_s - (time.perf_counter() - start)))
    record.sent_s = time.perf_counter() - start
    try:
        await asyncio.wait_for(read_stream(client, url, body, record, start), timeout)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        record.error = f"timeout: no end within {timeout:g} s"
    except httpx.HTTPError as err:
        record.error = f"{type(err).__name__}: {short(str(err)) or 'connection failed'}"
    except StreamError as err:
        record.error = str(err)
    finally:
        record.end_s = time.perf_counter() - start


async def run_stream(base_url: str, requests: list[LoadRequest], bodies: list[dict], arrivals: list[float],
                     *, timeout: float, transport=None, on_done=None) -> list[RequestRecord]:
    """Send `bodies` (one per request of `requests`) to the server at `base_url`, each at its arrival time
    (seconds from now), all streamed at once, and return their records; `on_done(record)` is called as
    each ends. `transport` is an httpx transport, for tests."""
    import httpx

    records = [RequestRecord(r.index, r.qid, at) for r, at in zip(requests, arrivals)]
    limits = httpx.Limits(max_connections=len(requests) or 1, max_keepalive_connections=len(requests) or 1)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout), limits=limits,
                                 transport=transport) as client:
        start = time.perf_counter()

        async def one(request: LoadRequest, body: dict, record: RequestRecord) -> None:
            await send(client, request.endpoint, body, record, start, timeout)
            if on_done is not None:
                on_done(record)

        await asyncio.gather(*(one(r, b, rec) for r, b, rec in zip(requests, bodies, records)))
    return records
