"""The OpenAI API's request and response bodies, as `specframe serve` reads and writes them.

Requests are parsed by pydantic: a field of the wrong type, a value out of range, or a parameter this
server does not implement set to anything but its neutral value (`n` above 1, `logprobs`, `echo`,
penalties) is refused with HTTP 400 and an error body in the API's format (`error_body`). Fields this
server does not know are ignored, as OpenAI-compatible servers do. Two fields are this server's own:
`method` (the speculative method for this request, `"none"` for plain decoding) and `top_k`.

Responses carry `usage` and, beside it, `speculation`: the request's method, steps, drafted and accepted
draft tokens and tau (mean tokens a step emitted), the metrics this server exists to show.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specframe.terms.result import GenerationResult

FINISH_REASONS = {"eos": "stop", "stop": "stop", "constraint": "stop", "length": "length",
                  "cancelled": "cancelled", "error": "error"}


class StreamOptions(BaseModel):
    include_usage: bool = False


class Unsupported(BaseModel):
    """Parameters of the API this server does not implement: accepted only at their neutral value."""

    model_config = ConfigDict(extra="ignore")

    n: int = 1
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None
    tools: list | None = None
    response_format: dict | None = None

    @model_validator(mode="after")
    def neutral(self):
        set_to = {name: getattr(self, name) for name in ("logprobs", "top_logprobs", "best_of", "logit_bias",
                                                         "tools", "response_format")}
        bad = [f"{name}={value!r}" for name, value in set_to.items() if value not in (None, False, {}, [])]
        bad += [f"n={self.n}"] if self.n != 1 else []
        bad += ["echo=true"] if self.echo else []
        bad += [f"{name}={getattr(self, name)}" for name in ("presence_penalty", "frequency_penalty")
                if getattr(self, name)]
        if bad:
            raise ValueError(f"this server does not implement {', '.join(bad)}: leave them unset")
        return self


class Sampled(Unsupported):
    """What every generation request has: limits, sampling, stop strings, streaming and the method."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = Field(None, validate_default=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    method: str | None = Field(None, min_length=1, description="specframe: the speculative method for this "
                               "request (a preset or pipeline spec; 'none' = plain decoding)")

    @field_validator("stop")
    @classmethod
    def stop_list(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stops

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(Sampled):
    prompt: str | list[int] | list[str] | list[list[int]]

    @field_validator("prompt")
    @classmethod
    def one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError(f"{len(value)} prompts in one request: send one prompt per request (the "
                                 "server batches concurrent requests itself)")
            value = value[0]
        if not value:
            raise ValueError("the prompt is empty")
        return value


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict]

    def text(self) -> dict:
        """The message as the chat template takes it (text parts joined; other parts refused)."""
        if isinstance(self.content, str):
            return {"role": self.role, "content": self.content}
        parts = [p.get("text") for p in self.content if p.get("type") == "text"]
        if len(parts) != len(self.content) or not all(isinstance(p, str) for p in parts):
            raise ValueError("only text content parts are supported")
        return {"role": self.role, "content": "".join(parts)}


class ChatRequest(Sampled):
    messages: list[Message] = Field(min_length=1)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """An error in the OpenAI API's format."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, result: GenerationResult) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": len(result.tokens),
            "total_tokens": prompt_tokens + len(result.tokens)}


def speculation(method: str, result: GenerationResult) -> dict:
    """This request's speculation metrics."""
    metrics = result.metrics
    return {"method": method, "steps": metrics.steps, "drafted_tokens": metrics.draft_tokens,
            "accepted_tokens": metrics.accepted_draft_tokens, "tau": round(metrics.tau, 4),
            "drafting_skipped_steps": metrics.drafting_skipped}


class Response:
    """The bodies of one response, completion or chat, whole or streamed chunk by chunk."""

    def __init__(self, chat: bool, model: str, method: str, prompt_tokens: int):
        self.chat, self.model, self.method, self.prompt_tokens = chat, model, method, prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict:
        kind = "text_completion" if not self.chat else "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, result: GenerationResult) -> dict:
        reason = FINISH_REASONS.get(result.finish_reason, result.finish_reason)
        text = result.text or ""
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                  if self.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        return {**self._head(False), "choices": [choice], "usage": usage(self.prompt_tokens, result),
                "speculation": speculation(self.method, result)}

    def chunk(self, text: str, result: GenerationResult | None = None, first: bool = False) -> dict:
        reason = None if result is None else FINISH_REASONS.get(result.finish_reason, result.finish_reason)
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, result: GenerationResult) -> dict:
        """The last chunk of a stream asked for usage (`stream_options.include_usage`): no choices."""
        return {**self._head(True), "choices": [], "usage": usage(self.prompt_tokens, result),
                "speculation": speculation(self.method, result)}
