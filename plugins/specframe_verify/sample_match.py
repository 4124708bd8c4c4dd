"""`sample-match`: lossless sampling verification for drafts without probabilities (REST, prompt lookup,
static trees), on any tree shape.

Walk from the root. At each node draw one token from the processed target distribution p of that node
(`Sampler.sample`, the same code as plain decoding); if a child carries that token, descend into it,
otherwise emit the drawn token as the bonus and stop.

Why lossless: every emitted token is a fresh draw from p given exactly the tokens emitted before it, and
the tree only decides how many of those draws one target forward pass can serve. The tree is built
before, and independently of, the target's draws, so its shape cannot bias them. At temperature 0 the
draw is the argmax and the walk is the greedy verifier's. Each emitted token consumes exactly one
uniform from the request's generator, so a seeded run emits what plain sampling with the same seed
emits (up to floating-point differences between tree and sequential logits).
"""

from __future__ import annotations

from collections.abc import Callable

from specframe import Sampler, TargetScores, TokenTree, Verifier, VerifierCapabilities, VerifyResult


def walk(tree: TokenTree, pick: Callable[[int], int]) -> VerifyResult:
    """Descend from the root while a child carries `pick(node)`, the target's token after `node` (-1 = the
    root); the first token no child carries is the bonus. Greedy and sample-match differ only in `pick`."""
    path: list[int] = []
    node = -1  # the root
    while True:
        token = pick(node)
        child = tree.child(node, token)
        if child is None:
            return VerifyResult(path=path, bonus=token)
        path.append(child)
        node = child


class SampleMatchVerifier(Verifier):
    """Sample the target at each node and descend while a child carries the sample. Lossless, any tree."""

    name = "sample-match"
    capabilities = VerifierCapabilities(lossless=True, needs_draft_probs=False, supports_sampling=True,
                                        matches_draws=True)

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        return walk(tree, lambda node: sampling.sample(scores.logits[node + 1]))  # (V,) logits after node
