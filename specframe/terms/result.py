"""What one request produced: its new tokens, their text, why it ended and its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from specframe.terms.metrics import DecodeMetrics


@dataclass
class GenerationResult:
    """Returned by `SpeculativeDecoder.generate`, and passed to the `on_decode_end` observer hook."""

    tokens: list[int]  # new tokens only
    text: str | None
    # "length", "eos" or "stop" ("error" in a `DrafterError`'s partial result; "constraint" when a constraint
    # is complete and the target has no end-of-sequence token it allows)
    finish_reason: str
    metrics: DecodeMetrics = field(default_factory=DecodeMetrics)
    # The sum of the target's log-probabilities (its raw logits, before temperature or top-k/top-p) of the
    # new tokens, when asked for (`generate_batch(..., logprobs=True)`, `best_of`); None otherwise.
    logprob: float | None = None


@dataclass
class StreamDelta:
    """What one step of a streamed request added (`SpeculativeDecoder.stream`): the text it adds and the
    ids of the tokens it committed; the last delta of a request carries its `result`."""

    text: str
    token_ids: list[int]
    result: GenerationResult | None = None

    @property
    def done(self) -> bool:
        return self.result is not None
