"""What a bench peer is: another system's decoding, timed beside specframe's methods on the same prompts
(`specframe bench --peers NAME`). Plugins subclass `Peer` and register the class through `register_peers`.

A peer declares its name, its options with their defaults, whether `--peers all` runs it, whether its
outputs are compared with its baseline's, which backend's plain decoding it is measured against, and why
it cannot run on a target; `decode` runs one request and returns its new tokens and `DecodeMetrics`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from specframe.terms.metrics import DecodeMetrics
    from specframe.terms.sampling import SamplingParams
    from specframe.terms.target import Target

# What a peer's record leaves unknown: its draft counts and phases are not observable from outside it.
UNOBSERVED = ("alpha", "draft_tokens", "accepted_draft_tokens", "mean_tree_size", "time_s",
              "time_per_step_ms")


@dataclass(frozen=True)
class PeerSpec:
    """One entry of `--peers`: its label as written, the peer's name and every option (defaults filled in)."""

    label: str
    name: str
    options: dict = field(default_factory=dict)
    optional: bool = False  # chosen by `all`: skipped with a warning where it cannot run on the target


class Peer(ABC):
    """Runs one peer on one target. Constructed by the bench as `cls(target, spec, sampling, baseline=...)`
    once per run; importing the class allocates nothing (import heavy libraries in `__init__`)."""

    name: ClassVar[str]
    options: ClassVar[Mapping[str, Any]] = MappingProxyType({})  # every option `NAME(key=value)` may set
    in_all: ClassVar[bool] = False  # run by `--peers all` (skipped with a warning where it cannot run)
    lossless: ClassVar[bool] = True  # greedy outputs are compared token for token with its baseline's
    # Measured against plain decoding through this backend where a method uses it (llama.cpp's peers against
    # `llamacpp`); None, or where no method uses it: against the first baseline.
    baseline_backend: ClassVar[str | None] = None

    def __init__(self, target: Target, spec: PeerSpec, sampling: SamplingParams, baseline: str = "baseline"):
        self.target, self.spec, self.label, self.baseline = target, spec, spec.label, baseline
        self.seed = sampling.seed

    @classmethod
    def unsupported_reason(cls, target: Target) -> str | None:
        """Why this peer cannot run on `target` (a message naming the peer and what to do), or None."""
        return None

    @abstractmethod
    def decode(self, prompt_ids: list[int], max_new_tokens: int,
               seed: int | None) -> tuple[list[int], DecodeMetrics]:
        """One request: its new tokens and its metrics (prompt and new tokens, steps and tokens per step
        as far as the peer shows them, prefill and wall seconds, peak memory)."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int,
                 seed: int | None = None) -> tuple[list[int], dict]:
        """One request as the bench records it: the new tokens and `DecodeMetrics.to_dict()`, with the decode
        rate after the first token (the prefill forward produced it) and `UNOBSERVED` None."""
        tokens, metrics = self.decode(prompt_ids, max_new_tokens, self.seed if seed is None else seed)
        record = metrics.to_dict()
        decode_s = metrics.wall_s - metrics.prefill_s
        record["decode_tokens_per_s"] = (len(tokens) - 1) / decode_s if decode_s > 0 else 0.0
        record.update(dict.fromkeys(UNOBSERVED))
        return tokens, record
