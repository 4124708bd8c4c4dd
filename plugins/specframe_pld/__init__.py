"""`pld`: prompt lookup decoding (Saxena, 2023), and `none`: plain decoding through the same loop.

Prompt lookup matches the latest n tokens (n from `max_ngram` down to `min_ngram`) against the earlier
prompt + generated text and proposes the tokens that followed the match. Unlike the original (first
match in the text) we prefer the most recent matches, and with `matches > 1` merge the continuations of
several matches into a trie weighted by frequency, for tree builders to choose from.

Defaults (n-grams of 4 down to 2, 12 tokens) were chosen on a CPU, where a verification step of 8-12
tokens costs well over a single step (docs/explanation/metrics-and-costs.md), so weak one-token matches
cost more than they win. Simulated on greedy SmolLM2 outputs for HumanEval, matching down to one token
gave a higher tau than these defaults but a lower predicted speedup.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import specframe
from specframe import ConfigurationError, DraftContext, DraftProposal, Drafter, DrafterCapabilities, ScoreKind


class NoDrafter(Drafter):
    """Proposes nothing: every step decodes exactly one token (the plain-decoding baseline)."""

    name = "none"

    def propose(self, context: DraftContext) -> DraftProposal:
        return DraftProposal.empty()


def find_matches(tokens: np.ndarray, ngram: int, limit: int) -> np.ndarray:
    """Start positions j (most recent first, at most `limit`) where tokens[j:j+ngram] equals the last
    `ngram` tokens and at least one token follows the match."""
    n = len(tokens)
    if n <= ngram:
        return np.zeros(0, np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(tokens[: n - 1], ngram)  # (n - ngram, ngram)
    hits = np.flatnonzero((windows == tokens[n - ngram:]).all(axis=1))
    return hits[::-1][:limit]


class PromptLookupDrafter(Drafter):
    name = "pld"
    capabilities = DrafterCapabilities(proposes_trees=True, score_kind=ScoreKind.FREQUENCY)

    # every step tries each n-gram length from max_ngram down: a few dozen at most are useful
    option_limits = {"max_ngram": (1, 64), "min_ngram": (1, 64), "num_tokens": (1, 4096),
                     "matches": (1, 4096)}

    def __init__(self, target, *, max_ngram: int = 4, min_ngram: int = 2, num_tokens: int = 12,
                 matches: int = 1):
        super().__init__(target)
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigurationError(f"pld: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if num_tokens < 1 or matches < 1:
            raise ConfigurationError("pld: num_tokens and matches must be >= 1")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.num_tokens, self.matches = num_tokens, matches

    def propose(self, context: DraftContext) -> DraftProposal:
        tokens = context.tokens
        length = min(self.num_tokens, context.budget)
        if length < 1:
            return DraftProposal.empty()
        for ngram in range(self.max_ngram, self.min_ngram - 1, -1):
            starts = find_matches(tokens, ngram, self.matches)
            if len(starts):
                continuations = [tokens[s + ngram: s + ngram + length] for s in starts]
                proposal = DraftProposal.from_sequences([c for c in continuations if len(c)])
                # The matched n-gram length labels the nodes: longer matches are accepted more often,
                # and adaptive speculation learns that per label (`DraftProposal.group`).
                return replace(proposal, group=np.full(len(proposal), ngram))
        return DraftProposal.empty()


@specframe.hookimpl
def register_drafters(register):
    register(NoDrafter)
    register(PromptLookupDrafter)


@specframe.hookimpl
def register_presets(register):
    register(specframe.Preset("pld", "pld+chain+greedy", help="prompt lookup, chains (the default pipeline)"))
    register(specframe.Preset("pld-trie", "pld(matches=4)+trie+greedy",
                              help="prompt lookup merging four matches into a trie"))
