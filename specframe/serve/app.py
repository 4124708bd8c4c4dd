"""`specframe serve`'s HTTP layer: an OpenAI-compatible API on FastAPI over the serving `Engine`.

Endpoints: `POST /v1/completions` and `POST /v1/chat/completions` (whole, or streamed as server-sent
events ending with `data: [DONE]`), `GET /v1/models`, `GET /health` (the model is loaded and the engine
runs) and `GET /metrics` (Prometheus text: requests by outcome, tokens, drafted and accepted tokens,
steps, requests running and waiting).

Every request is checked before any work (its body, its prompt against the context, its method and
sampling): a bad one gets HTTP 400 with an error body in the API's format, an unknown model 404, a full
queue 429 at once, a server shutting down 503. A client that goes away frees its row at the engine's
next step, whether it streamed or waited for the whole answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from specframe.serve.api import ChatRequest, CompletionRequest, Response, Sampled, error_body
from specframe.serve.engine import Closing, Engine, Failure, QueueFull, Ticket
from specframe.support.prompt_suites import chat_ids
from specframe.terms.errors import PromptError, SpecframeError
from specframe.terms.sampling import SamplingParams

class ApiError(Exception):
    """An error answered with `status` and an error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code


def make_app(engine: Engine, model_name: str, *, temperature: float = 0.0, default_max_tokens: int = 256,
             drain_s: float = 30.0) -> FastAPI:
    """The server's app over `engine`, serving the model as `model_name`. A request that sets no
    temperature decodes at `temperature`; one that sets no max_tokens at `default_max_tokens`. At
    shutdown the requests in flight get `drain_s` seconds to finish, then are cancelled."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        await run_in_threadpool(engine.shutdown, drain_s)

    app = FastAPI(title="specframe", lifespan=lifespan)
    answers = Answers(engine, model_name, temperature, default_max_tokens)
    app.exception_handler(RequestValidationError)(invalid_body)
    app.exception_handler(ApiError)(api_error)
    metrics = CollectorRegistry()
    metrics.register(EngineCollector(engine))

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": engine.running, "waiting": engine.waiting}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "specframe"}]}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(generate_latest(metrics).decode(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await answers.answer(body, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        return await answers.answer(body, request, chat=True)

    return app


async def invalid_body(request: Request, err: RequestValidationError) -> JSONResponse:
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}"
                         for e in err.errors())
    return JSONResponse(error_body(problems or "the request body is not valid"), status_code=400)


async def api_error(request: Request, err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(str(err), err.kind, code=err.code), status_code=err.status)


class Answers:
    """The generation endpoints' work: check a request, queue it, answer it whole or streamed."""

    def __init__(self, engine: Engine, model_name: str, temperature: float, default_max_tokens: int):
        self.engine, self.model_name = engine, model_name
        self.temperature, self.default_max_tokens = temperature, default_max_tokens

    async def answer(self, body: Sampled, request: Request, chat: bool):
        engine = self.engine
        if body.model not in (None, self.model_name):
            raise ApiError(404, f"model '{body.model}' is not served here; this server serves "
                           f"'{self.model_name}' (GET /v1/models)", code="model_not_found")
        ids = prompt_ids(engine, body, chat)
        # Unset: the server's default, within its limit and the room the context leaves after the prompt
        limit = body.limit or max(1, min(self.default_max_tokens, engine.max_tokens,
                                         engine.target.max_context - len(ids)))
        temperature = self.temperature if body.temperature is None else body.temperature
        sampling = SamplingParams(temperature=temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed)
        try:
            method, checked = await run_in_threadpool(engine.check, ids, limit, tuple(body.stop), sampling,
                                                      body.method)
            ticket = Ticket()
            engine.submit(method, checked, ticket)
        except QueueFull as err:
            raise ApiError(429, str(err), "rate_limit_error") from None
        except Closing as err:
            raise ApiError(503, str(err), "server_error") from None
        except SpecframeError as err:
            raise ApiError(400, str(err)) from None
        response = Response(chat, self.model_name, method, len(ids))
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(stream(ticket, response, usage), media_type="text/event-stream")
        return await whole(ticket, response, request)


def prompt_ids(engine: Engine, body: Sampled, chat: bool) -> list[int]:
    """The request's prompt as token ids: the chat template over its messages, its text encoded, or its
    ids as given."""
    tokenizer = engine.target.tokenizer
    try:
        if chat:
            return chat_ids(tokenizer, [m.text() for m in body.messages], "or call /v1/completions")
        if isinstance(body.prompt, str):
            return list(tokenizer(body.prompt, add_special_tokens=False)["input_ids"])
        return list(body.prompt)
    except (PromptError, ValueError) as err:
        raise ApiError(400, str(err)) from None


async def whole(ticket: Ticket, response: Response, request: Request) -> JSONResponse:
    """Wait for the whole answer, cancelling the request if its client goes away meanwhile (an ASGI
    `http.disconnect` message, listened for beside the answer)."""
    gone = asyncio.ensure_future(client_gone(request))
    try:
        while True:
            event = asyncio.ensure_future(ticket.events.get())
            await asyncio.wait({event, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not event.done():
                event.cancel()
                ticket.cancel()
                return JSONResponse(error_body("the client went away", "cancelled"), status_code=499)
            event = event.result()
            if isinstance(event, Failure):
                return JSONResponse(error_body(event.message, "server_error"),
                                    status_code=503 if event.cancelled else 500)
            if event.result is not None:
                return JSONResponse(response.whole(event.result))
    finally:
        gone.cancel()


async def client_gone(request: Request) -> None:
    """Returns once the client has closed its connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def stream(ticket: Ticket, response: Response, usage: bool) -> AsyncIterator[str]:
    """The answer as server-sent events; a client that goes away cancels the request (the server stops
    this generator, and `finally` tells the engine)."""
    done, first = False, True
    try:
        while not done:
            event = await ticket.events.get()
            if isinstance(event, Failure):
                done = True
                yield sse(error_body(event.message, "server_error"))
                break
            done = event.result is not None
            if event.text or done:
                yield sse(response.chunk(event.text, event.result, first))
                first = False
            if done and usage:
                yield sse(response.usage_chunk(event.result))
        yield "data: [DONE]\n\n"
    finally:
        if not done:
            ticket.cancel()


def sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


class Server(uvicorn.Server):
    """uvicorn's server whose shutdown (Ctrl-C, SIGTERM) first drains the engine: no new request is
    taken (503), those in flight get `drain_s` seconds to finish and are then cancelled, each client
    told so, before uvicorn closes the connections."""

    def __init__(self, config: uvicorn.Config, engine: Engine, drain_s: float):
        super().__init__(config)
        self.engine, self.drain_s = engine, drain_s

    async def shutdown(self, sockets=None) -> None:
        await run_in_threadpool(self.engine.shutdown, self.drain_s)
        await super().shutdown(sockets)


def run(engine: Engine, model_name: str, host: str, port: int, *, drain_s: float = 30.0,
        log_level: str = "info", **app_options) -> None:
    """Serve `engine` on `host`:`port` until stopped (`make_app`'s options; `Server`'s shutdown)."""
    app = make_app(engine, model_name, drain_s=drain_s, **app_options)
    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level), engine, drain_s).run()


class EngineCollector:
    """The engine's counters as Prometheus metrics, read at each scrape."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        stats = self.engine.stats
        requests = CounterMetricFamily("specframe_requests", "Requests ended, by outcome", labels=["outcome"])
        for outcome, count in sorted(stats.requests.items()):
            requests.add_metric([outcome], count)
        yield requests
        for name, value, text in (("generated_tokens", stats.new_tokens, "Tokens generated"),
                                  ("drafted_tokens", stats.drafted_tokens, "Draft tokens scored"),
                                  ("accepted_tokens", stats.accepted_tokens, "Draft tokens accepted"),
                                  ("steps", stats.steps, "Decoding steps, summed over requests")):
            yield CounterMetricFamily(f"specframe_{name}", text, value=value)
        yield GaugeMetricFamily("specframe_requests_running", "Requests decoding", value=self.engine.running)
        yield GaugeMetricFamily("specframe_requests_waiting", "Requests queued", value=self.engine.waiting)
