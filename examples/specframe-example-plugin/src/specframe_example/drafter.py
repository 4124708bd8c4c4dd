"""`bigram`: a drafter that learns, while it decodes, which token tends to follow which.

It keeps successor counts over the prompt and everything emitted so far, updated incrementally (the
counts of a request are dropped in `reset`). A proposal is a small tree: the `width` most frequent
successors of the last token, each continued by a chain of most frequent successors up to `depth`
tokens deep. Node scores are the chain's relative frequencies multiplied along the path.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from specframe import (
    ConfigurationError, DraftContext, Drafter, DrafterCapabilities, DraftProposal, DrawMethod,
)


class BigramDrafter(Drafter):
    name = "bigram"
    capabilities = DrafterCapabilities(proposes_trees=True)

    def __init__(self, target, *, width: int = 2, depth: int = 6):
        super().__init__(target)
        if width < 1 or depth < 1:
            raise ConfigurationError(f"drafter 'bigram': width and depth must be >= 1, got {width}, {depth}")
        self.width, self.depth = width, depth
        self.reset()

    def reset(self) -> None:
        self.successors: dict[int, Counter] = defaultdict(Counter)
        self.counted = 0  # tokens of the current request already counted as successors

    def _count(self, tokens: np.ndarray) -> None:
        """Add the bigrams ending in tokens[counted:] to the counts."""
        previous, following = tokens[max(self.counted - 1, 0):-1], tokens[max(self.counted, 1):]
        for prev, nxt in zip(previous.tolist(), following.tolist()):
            self.successors[prev][nxt] += 1
        self.counted = len(tokens)

    def _ranked(self, token: int, k: int) -> list[tuple[int, float]]:
        """Up to k (successor, relative frequency) pairs of `token`, most frequent first."""
        counts = self.successors.get(token)
        if not counts:
            return []
        total = sum(counts.values())
        return [(t, c / total) for t, c in counts.most_common(k)]

    def propose(self, context: DraftContext) -> DraftProposal:
        if len(context.tokens) < self.counted:  # a new request without reset(): start over
            self.reset()
        self._count(context.tokens)
        if context.budget < 1:
            return DraftProposal.empty()
        tokens, parents, scores = [], [], []
        for first, freq in self._ranked(int(context.tokens[-1]), self.width):
            tokens.append(first), parents.append(-1), scores.append(freq)
            node, last, score = len(tokens) - 1, first, freq
            for _ in range(self.depth - 1):
                ranked = self._ranked(last, 1)
                if not ranked:
                    break
                last, freq = ranked[0]
                score *= freq
                tokens.append(last), parents.append(node), scores.append(score)
                node = len(tokens) - 1
        if not tokens:
            return DraftProposal.empty()
        return DraftProposal(np.array(tokens), np.array(parents), np.array(scores), draw=DrawMethod.TOPK)
