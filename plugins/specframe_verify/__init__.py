"""Verifiers.

- `greedy`: the longest path whose every token is the target's argmax, plus the bonus token (temperature 0).
- `sample-match` (sample_match.py): lossless sampling for drafts without probabilities, any tree.
- `rejection` (rejection.py): lossless recursive rejection sampling with the real draft q, any tree.
- `block` (block.py): lossless block verification of chains with the real draft q (Sun et al., 2024).
- `traversal` (traversal.py): lossless traversal verification of trees with the real draft q, leaves
  first (Weng et al., 2025); block verification on a chain.
- `typical` (typical.py): Medusa's typical acceptance, LOSSY when sampling.
"""

from __future__ import annotations

import specframe
from specframe import Sampler, TargetScores, TokenTree, Verifier, VerifierCapabilities, VerifyResult
from specframe.kit.drafting import argmax
from specframe_verify.block import BlockVerifier
from specframe_verify.rejection import RejectionVerifier
from specframe_verify.sample_match import SampleMatchVerifier, walk
from specframe_verify.traversal import TraversalVerifier
from specframe_verify.typical import TypicalVerifier


class GreedyVerifier(Verifier):
    """Walk from the root; descend into the child carrying the target's argmax; stop when none does.

    Exactly what plain greedy decoding would emit, so lossless at temperature 0.
    """

    name = "greedy"
    capabilities = VerifierCapabilities(lossless=True, supports_sampling=False, matches_draws=True)

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        # Only the rows on the accepted path are ever reduced.
        return walk(tree, lambda node: argmax(scores.logits[node + 1]))  # (V,) logits after node


@specframe.hookimpl
def register_verifiers(register):
    register(GreedyVerifier)
    register(SampleMatchVerifier)
    register(RejectionVerifier)
    register(BlockVerifier)
    register(TraversalVerifier)
    register(TypicalVerifier)
