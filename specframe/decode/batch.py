"""What the batch loop (`SpeculativeDecoder.generate_batch`) shares between rows: phases timed once for
every row, and telling a batch of prompts from one prompt.

In a batch each request is a `RequestRow` with its own drafter (`Drafter.spawn`), planner, sampler and
stop checks, so it drafts, verifies and emits exactly as it would alone; only the backend's scoring and
commit are shared (`StateBackend.batch`: one forward for every row where the backend batches). A row
that ends leaves the batch and the next waiting request takes its place (continuous batching), so a
long queue keeps the batch full.

Timing: every row's step timer runs from the step's start, so a row's "other" phase holds the time it
waits while the other rows draft and verify, and the shared forward and commit are charged in full to
every row they served. A row's `wall_s` runs from its admission (its prefill included) to its end: the
latency a user of that request sees, once the batch has room for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from specframe.terms.metrics import now


@dataclass
class Phase:
    seconds: float = 0.0


@contextmanager
def shared_phase(timers, phase: str, sync=None) -> Iterator[Phase]:
    """Time one phase that serves every row (the batch's forward, its commit) and charge it to each;
    the `Phase` yielded holds its seconds once the block ends."""
    start, timed = now(), Phase()
    try:
        yield timed
    finally:
        if sync is not None:
            sync()
        timed.seconds = now() - start
        for timer in timers:
            timer.times[phase] = timer.times.get(phase, 0.0) + timed.seconds


def is_batch(prompt) -> bool:
    """Whether `generate` was given several prompts: a list or tuple of texts or of id sequences (one
    prompt is a text, or one flat sequence of ids)."""
    if not isinstance(prompt, (list, tuple)) or not prompt:
        return False
    return all(isinstance(p, str) or (hasattr(p, "__len__") and not isinstance(p, (bytes, dict)))
               for p in prompt)
