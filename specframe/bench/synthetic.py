"""`--synthetic-acceptance P`: a drafter whose acceptance rate is set, to measure pure framework overhead.

The `SyntheticDrafter` knows the answer: before each request the harness hands it the baseline's output
for the same prompt. It proposes the next `budget` reference tokens and corrupts each one with probability
1 - P, so the conditional acceptance at every depth is P. Everything else is real (tree building, the
target forward on the whole tree, greedy verification, cache commit), drafting itself costs next to
nothing, and the output stays identical to plain decoding. Comparing the measured speedup with the ideal
`tau * t(1) / t(N)` shows what the framework's own bookkeeping costs.
"""

from __future__ import annotations

import numpy as np

from specframe.terms.errors import ConfigurationError
from specframe.contract.interfaces import Drafter
from specframe.terms.proposal import DraftContext, DraftProposal, DrawMethod


class SyntheticDrafter(Drafter):
    """Proposes the reference continuation, each token kept with probability `acceptance`."""

    name = "synthetic"

    def __init__(self, target, *, acceptance: float, seed: int = 0):
        super().__init__(target)
        if not 0.0 <= acceptance <= 1.0:
            raise ConfigurationError(f"--synthetic-acceptance must be in [0, 1], got {acceptance}")
        self.acceptance, self.seed = acceptance, seed
        self.reference: list[int] = []
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.seed)  # the same corruption pattern on every repeat

    def propose(self, context: DraftContext) -> DraftProposal:
        done = len(context.tokens) - context.prompt_len
        draft = np.array(self.reference[done:done + context.budget], dtype=np.int64)  # (n,)
        if not len(draft):
            return DraftProposal.empty()
        wrong = self.rng.random(len(draft)) >= self.acceptance  # (n,)
        draft[wrong] = (draft[wrong] + 1) % self.target.vocab_size
        n = len(draft)
        return DraftProposal(draft, np.arange(n) - 1, np.ones(n), draw=DrawMethod.RETRIEVED)
