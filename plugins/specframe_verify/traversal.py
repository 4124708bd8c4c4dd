"""`traversal`: traversal verification of a tree of sampled drafts (Weng et al., "Traversal Verification
for Speculative Tree Decoding", 2025), with the real draft distribution q.

Token-level verifiers (`rejection`) descend from the root and drop a whole subtree as soon as its first
token is rejected. Traversal verification walks the tree depth first and judges each node, leaves first,
by the weight of the whole path from the root to it, as block verification (block.py) judges the
prefixes of a chain; on a chain it performs exactly block verification's steps.

Every node carries a weight w and a target row P (the target's distribution after it); the root starts
with w = 1 and the target's row. At a node, its children x_1, x_2, ... are visited in draw order
(repeated tokens of an i.i.d. stream are skipped with their subtrees, as `rejection` skips them):

    q_k = q with x_1 .. x_{k-1} removed, renormalized      # the law of x_k given the earlier draws
    visit x_k with weight min(1, w * P(x_k) / q_k(x_k)) and its own target row;
    if nothing in x_k's subtree was accepted:
        s = sum(max(0, w * P - q_k))
        P <- norm(max(0, w * P - q_k)),   w <- s / (s + 1 - w)
    after the last child: accept this node with probability w; if accepted, the path from the root to
    it is kept and the bonus token is drawn from its current P.

The first node accepted ends the step. The root's weight stays 1 (s / (s + 0)), so the root is always
accepted when nothing below it is: the bonus then comes from the root's last residual, exactly as in
recursive rejection sampling.

Why lossless (`docs/explanation/lossless-sampling.md` gives the proof sketch): by induction over the
subtrees, a node visited with weight w and row P accepts something in its subtree (itself included) with
probability exactly w, and the first token it emits after itself, given that it accepts, is distributed
as P; later tokens as the target. The update of (w, P) after a rejected child is what makes the next
child's visit, and the node's own test, complete that law. The draws must follow the contract of
`DrawMethod` (children in draw order, presence decided before the token is drawn), as for `rejection`.

Trees that are no draws from q (drafts without q, deterministic drafts, a builder that chose by score)
are verified by sampling and matching, as `rejection` does, and say so in `VerifyResult.fallback`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specframe import Sampler, TargetScores, TokenTree, Verifier, VerifierCapabilities, VerifyResult
from specframe_verify.joint import draft_ratio, keep, residual, sample_and_match
from specframe_verify.rejection import fallback_reason

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the verifier loads none
    import torch


class TraversalVerifier(Verifier):
    """Traversal verification with the real draft q on trees: depth first, leaves before their parents,
    each node judged by the weight of its whole path. Lossless; see the module docstring."""

    name = "traversal"
    capabilities = VerifierCapabilities(lossless=True, needs_draft_probs=True, uses_draft_probs=True,
                                        supports_sampling=True)

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        fallback = fallback_reason(tree)
        if fallback:
            return sample_and_match(tree, scores, sampling, fallback)
        return self.judge(tree, scores, sampling)

    def judge(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        """Verify a tree of draws from its q (what `fallback_reason` lets through)."""
        return traverse(self.name, tree, scores, sampling)


def traverse(name: str, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
    """Traversal verification of the sampled tree `tree` (see the module docstring)."""
    import torch

    def target_row(node: int) -> torch.Tensor:  # (V,) the processed target distribution after `node`
        return sampling.probs(scores.logits[node + 1]).to(torch.float64)

    def visit(node: int, weight: float, p: torch.Tensor | None) -> VerifyResult | None:
        """Verify the subtree of `node` (-1 = the root) entered with `weight` and target row `p` (None:
        not computed yet, the target's own row); the accepted path and bonus, or None if all rejected."""
        children = tree.children[node + 1]
        if children:
            p = target_row(node) if p is None else p
            q = tree.draft_probs[children[0]].to(device=p.device, dtype=torch.float64)  # (V,) shared row
            remaining, mass, tried = q.clone(), float(q.sum()), set()
            for child in children:
                token = int(tree.tokens[child])
                if token in tried:  # an i.i.d. repeat carries no new draw: skipped with its subtree
                    continue
                tried.add(token)
                q_k = remaining / mass  # (V,) the law of this child given the siblings drawn before it
                chance = draft_ratio(name, weight, float(p[token]), float(q_k[token]), token, child)
                if chance > 0:  # a subtree entered with weight 0 accepts nothing: no need to walk it
                    found = visit(child, chance, None)
                    if found is not None:
                        return found
                weight, p = residual(weight, p, q_k, token)
                remaining[token] = 0
                mass = float(remaining.sum())
                if not mass > 0:  # every token of q was drawn: no further sibling can follow
                    break
        if not keep(sampling, weight):
            return None
        bonus = sampling.sample(scores.logits[node + 1]) if p is None else sampling.draw(p)
        return VerifyResult(path=tree.path_to(node) if node >= 0 else [], bonus=bonus)

    found = visit(-1, 1.0, None)
    assert found is not None, "traversal verification accepts the root with probability 1"
    return found
