"""What the decode loop (`SpeculativeDecoder`) shares between rows: phases timed once for every row, and
telling a batch of prompts from one prompt.

In a batch each request is a `RequestRow` with its own drafter (`Drafter.spawn`), planner, sampler and
stop checks, so it drafts, verifies and emits exactly as it would alone; only the backend's scoring and
commit are shared (`StateBackend.batch`: one forward for every row where the backend batches). A row
that ends leaves the batch and the next waiting request takes its place (continuous batching), so a
long queue keeps the batch full.

Timing: every row's step timer runs from the step's start, so a row's "other" phase holds the time it
waits while the other rows draft and verify, and the shared forward and commit are charged in full to
every row they served. A row's `wall_s` runs from its admission (its prefill included) to its end: the
latency a user of that request sees, once the batch has room for it. So the rows' splits add up to more
than the call took; `BatchMetrics` keeps the call's own split, each step's phases counted once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from specframe.terms.metrics import PHASES


@dataclass
class Phase:
    seconds: float = 0.0


@contextmanager
def shared_phase(timers: list, phase: str) -> Iterator[Phase]:
    """Time one phase that serves every row (the forward, the commit) with the first row's timer, and
    charge what it measured to every other row; the `Phase` yielded holds its seconds once the block
    ends. Timed by a row's own timer, the phase is measured as that timer measures (waiting for the
    device where it syncs phases, modelled where it models them: `specframe.bench.replay`)."""
    first, timed = timers[0], Phase()
    before = first.times.get(phase, 0.0)
    with first(phase):
        yield timed
    timed.seconds = first.times.get(phase, 0.0) - before
    for timer in timers[1:]:
        timer.times[phase] = timer.times.get(phase, 0.0) + timed.seconds


@dataclass
class BatchMetrics:
    """The time split of one `generate_batch` call as a whole (`SpeculativeDecoder.batch_metrics`).

    A step's draft, tree and verify phases are summed over its rows (the rows take them in turn), its
    forward and commit counted once, and its "other" is the rest of the step (the batch planner's cut,
    every row's bookkeeping). `prefill_s` sums the admissions' prefills. What the call spends outside
    steps and prefills (retiring rows, admitting them) is in neither, so `time` and `prefill_s` add up to
    a little less than the call's seconds."""

    steps: int = 0  # batched steps: one shared scoring each
    prefill_s: float = 0.0
    time: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def record_step(self, seconds: float, shared: dict[str, float],
                    row_times: list[dict[str, float]]) -> None:
        """Count one step that took `seconds`: `shared` holds the phases timed once for every row,
        `row_times` each row's closed timer, whose shared phases and waits ("other") are not added again."""
        step = dict(shared)
        for times in row_times:
            for phase, spent in times.items():
                if phase not in shared and phase != "other":
                    step[phase] = step.get(phase, 0.0) + spent
        step["other"] = seconds - sum(step.values())
        self.steps += 1
        for phase, spent in step.items():
            self.time[phase] = self.time.get(phase, 0.0) + spent

    def to_dict(self) -> dict:
        """Steps, prefill seconds, seconds by phase and milliseconds by phase per batched step."""
        per_step = {k: 1000 * v / self.steps if self.steps else 0.0 for k, v in self.time.items()}
        return {"batch_steps": self.steps, "prefill_s": self.prefill_s, "time_s": dict(self.time),
                "time_per_step_ms": per_step}


def is_batch(prompt) -> bool:
    """Whether `generate` was given several prompts: a list or tuple of texts or of id sequences (one
    prompt is a text, or one flat sequence of ids)."""
    if not isinstance(prompt, (list, tuple)) or not prompt:
        return False
    return all(isinstance(p, str) or (hasattr(p, "__len__") and not isinstance(p, (bytes, dict)))
               for p in prompt)
