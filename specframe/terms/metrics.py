"""Per-request decoding metrics, with the definitions of `docs/explanation/metrics-and-costs.md`.

- tau (mean accepted length) = tokens emitted / verification steps, bonus token included (plain
  decoding has tau = 1); the prefill is not a step.
- alpha (acceptance rate) = accepted draft tokens / draft tokens sent to the target.
- per-position acceptance: unconditional = steps that accepted depth d / steps; conditional = steps that
  accepted depth d / steps that accepted depth d - 1.
- acceptance_histogram[j] = steps that accepted exactly j draft tokens.
- time split per step: draft, tree, forward, verify, commit, other. On an accelerator the device is
  synchronised after each phase only with `phase_timing` on; with it off the split holds launch times
  (work is charged to whichever phase waits for it) while the totals stay right.
- fallback steps: steps that a verifier using draft probabilities (`rejection`) verified by sampling and
  matching instead, by reason (no draft q, deterministic drafts, not sampled in draw order).
- predicted vs realised (budget="auto"): the planner's expected tokens and step time against what the
  steps it predicted emitted and took (docs/explanation/adaptive-speculation.md).
"""

from __future__ import annotations

import resource
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PHASES = ("draft", "tree", "forward", "verify", "commit", "other")
# The clock every timing of this process reads (`set_clock`): wall time, or this process's CPU time, which
# other processes' load on a shared CPU does not inflate (single-threaded torch only: with more threads
# CPU time adds up the threads' time; on an accelerator it misses the device's work).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = [time.perf_counter]


def set_clock(name: str) -> None:
    """Make `now` read the `wall` or the `cpu` clock (see `CLOCKS`)."""
    if name not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {name!r}")
    _clock[0] = CLOCKS[name]


def clock_name() -> str:
    return next(name for name, clock in CLOCKS.items() if clock is _clock[0])


def now() -> float:
    """Seconds on the clock chosen with `set_clock` (wall time unless changed)."""
    return _clock[0]()


def reset_peak_memory(device: torch.device | str = "cpu") -> None:
    """Start a new peak for `peak_memory_bytes` on a CUDA device, so it reports one request's peak; the
    process's peak resident set size (other devices) cannot be reset."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device | str = "cpu") -> int:
    """Peak accelerator memory for CUDA devices (since the last `reset_peak_memory`), else the process's
    peak resident set size."""
    import torch

    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


@dataclass
class DecodeMetrics:
    """Counters of one request; derived numbers are properties so they can never disagree."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    time: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    prefill_s: float = 0.0
    wall_s: float = 0.0  # prefill included
    peak_memory_bytes: int = 0
    phase_timing: bool = True  # False: no synchronisation per phase, so `time` is not a measured split
    fallbacks: dict[str, int] = field(default_factory=dict)  # reason -> steps (see `VerifyResult.fallback`)
    # Adaptive speculation (budget="auto"): over the steps it predicted, predicted and realised sums.
    predicted_steps: int = 0
    predicted_tokens: float = 0.0
    predicted_s: float = 0.0
    realised_tokens: int = 0  # accepted + bonus, before cutting at EOS or the length limit
    realised_s: float = 0.0  # step time without drafting (what the cost model predicts)
    drafting_skipped: int = 0  # steps on which the planner did not draft because it did not pay

    def record_step(self, tree_size: int, accepted: int, times: dict[str, float],
                    fallback: str | None = None, predicted=None, skipped: bool = False) -> None:
        """Count one step; `predicted` is the planner's `Prediction` for it, if it made one; `skipped`
        when the planner did not draft because drafting did not pay."""
        self.steps += 1
        self.drafting_skipped += skipped
        if predicted is not None:
            self.predicted_steps += 1
            self.predicted_tokens += predicted.tokens
            self.predicted_s += predicted.seconds
            self.realised_tokens += accepted + 1
            self.realised_s += sum(s for phase, s in times.items() if phase != "draft")
        if fallback:
            self.fallbacks[fallback] = self.fallbacks.get(fallback, 0) + 1
        self.draft_tokens += tree_size
        self.accepted_draft_tokens += accepted
        self.tree_sizes.append(tree_size)
        self.accepted_per_step.append(accepted)
        for phase, seconds in times.items():
            self.time[phase] += seconds

    @property
    def tau(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def alpha(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def fallback_steps(self) -> int:
        """Steps verified by sample-and-match although the verifier uses draft probabilities."""
        return sum(self.fallbacks.values())

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second with the prefill excluded."""
        decode = self.wall_s - self.prefill_s
        return self.new_tokens / decode if decode > 0 else 0.0

    @property
    def acceptance_histogram(self) -> list[int]:
        """Steps that accepted exactly j draft tokens (index j); the name of the records' field too."""
        top = max(self.accepted_per_step, default=0)
        counts = [0] * (top + 1)
        for j in self.accepted_per_step:
            counts[j] += 1
        return counts

    @property
    def histogram(self) -> list[int]:
        """Deprecated name of `acceptance_histogram`."""
        warnings.warn("DecodeMetrics.histogram is deprecated: use DecodeMetrics.acceptance_histogram, the "
                      "name records use", DeprecationWarning, stacklevel=2)
        return self.acceptance_histogram

    @property
    def acceptance_by_depth(self) -> list[float]:
        """Unconditional: share of steps that accepted a token at depth d (index d - 1)."""
        top = max(self.accepted_per_step, default=0)
        return [sum(a >= d for a in self.accepted_per_step) / self.steps for d in range(1, top + 1)]

    @property
    def conditional_acceptance_by_depth(self) -> list[float]:
        """Share of steps accepting depth d among those that accepted depth d - 1 (index d - 1)."""
        top = max(self.accepted_per_step, default=0)
        reached = [sum(a >= d for a in self.accepted_per_step) for d in range(0, top + 1)]
        return [reached[d] / reached[d - 1] for d in range(1, top + 1)]

    @property
    def time_per_step_ms(self) -> dict[str, float]:
        return {k: 1000 * v / self.steps if self.steps else 0.0 for k, v in self.time.items()}

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens, "steps": self.steps,
            "tau": self.tau, "alpha": self.alpha, "draft_tokens": self.draft_tokens,
            "accepted_draft_tokens": self.accepted_draft_tokens,
            "mean_tree_size": sum(self.tree_sizes) / self.steps if self.steps else 0.0,
            "acceptance_by_depth": self.acceptance_by_depth,
            "conditional_acceptance_by_depth": self.conditional_acceptance_by_depth,
            "acceptance_histogram": self.acceptance_histogram,
            "time_s": dict(self.time), "time_per_step_ms": self.time_per_step_ms,
            "prefill_s": self.prefill_s, "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s, "decode_tokens_per_s": self.decode_tokens_per_s,
            "peak_memory_bytes": self.peak_memory_bytes, "phase_timing": self.phase_timing,
            "fallback_steps": self.fallback_steps, "fallbacks": dict(self.fallbacks),
            **self.prediction_summary(),
        }

    def prediction_summary(self) -> dict:
        """Predicted vs realised tokens per step and step time over the steps the planner predicted."""
        n = self.predicted_steps
        return {"predicted_steps": n, "drafting_skipped": self.drafting_skipped,
                "predicted_tokens_per_step": self.predicted_tokens / n if n else None,
                "realised_tokens_per_step": self.realised_tokens / n if n else None,
                "predicted_step_ms": 1000 * self.predicted_s / n if n else None,
                "realised_step_ms": 1000 * self.realised_s / n if n else None}


class PhaseTimer:
    """Accumulates wall time per phase within one step: `with timer("draft"): ...`, then `close()`.
    Made at the step's start."""

    def __init__(self, sync=None):
        self.times: dict[str, float] = {}
        self._sync = sync  # e.g. `specframe.runtime.devices.synchronizer(device)`: GPU work is charged to
                           # its phase
        self._start = now()

    def close(self) -> dict[str, float]:
        """End the step: the time since the timer was made outside every phase is charged to "other".
        Returns the seconds per phase."""
        self.times["other"] = now() - self._start - sum(self.times.values())
        return self.times

    @contextmanager
    def __call__(self, phase: str):
        start = now()
        try:
            yield
        finally:
            if self._sync is not None:
                self._sync()
            self.times[phase] = self.times.get(phase, 0.0) + now() - start
