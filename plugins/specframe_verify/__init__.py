"""Verifiers. `greedy`: the longest path whose every token is the target's argmax, plus the bonus token."""

from __future__ import annotations

import specframe
from specframe import Sampler, TargetScores, TokenTree, Verifier, VerifierCapabilities, VerifyResult


class GreedyVerifier(Verifier):
    """Walk from the root; descend into the child carrying the target's argmax; stop when none does.

    Exactly what plain greedy decoding would emit, so lossless at temperature 0.
    """

    name = "greedy"
    capabilities = VerifierCapabilities(lossless=True, supports_sampling=False)

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        best = scores.logits.argmax(-1).tolist()  # (N + 1,) target argmax after each packed entry
        children, tokens = tree.children, tree.tokens
        path: list[int] = []
        node = -1  # the root
        while True:
            want = best[node + 1]
            nxt = next((c for c in children[node + 1] if tokens[c] == want), None)
            if nxt is None:
                return VerifyResult(path=path, bonus=want)
            path.append(nxt)
            node = nxt


@specframe.hookimpl
def register_verifiers(register):
    register(GreedyVerifier)
