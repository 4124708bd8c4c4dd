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

from specframe import Sampler, TargetScores, TokenTree, Verifier, VerifierCapabilities, VerifyResult


def child_with_token(tree: TokenTree, node: int, token: int) -> int | None:
    """The first child of `node` (-1 = root) carrying `token`, or None."""
    return next((c for c in tree.children[node + 1] if tree.tokens[c] == token), None)


class SampleMatchVerifier(Verifier):
    """Sample the target at each node and descend while a child carries the sample. Lossless, any tree."""

    name = "sample-match"
    capabilities = VerifierCapabilities(lossless=True, needs_draft_probs=False, supports_sampling=True)

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        path: list[int] = []
        node = -1  # the root
        while True:
            token = sampling.sample(scores.logits[node + 1])  # (V,) logits after the packed entry
            child = child_with_token(tree, node, token)
            if child is None:
                return VerifyResult(path=path, bonus=token)
            path.append(child)
            node = child
