"""`block`: block verification of a chain of sampled drafts (Sun et al., "Block Verification
Accelerates Speculative Decoding", 2024), with the real draft distribution q.

Token-wise rejection sampling (Leviathan et al.) accepts the i-th draft only if it accepts every draft
before it, one token at a time. Block verification judges each prefix of the chain as a whole. For a
chain x_1 .. x_g, with target rows P_i (after x_1 .. x_{i-1}) and draft rows Q_i (what x_i was drawn
from), it computes the prefix weights

    w_0 = 1,   w_i = min(1, w_{i-1} * P_i(x_i) / Q_i(x_i))

and, for every prefix length i, the residual mass left after its next draft,

    r_i = max(0, w_i * P_{i+1} - Q_{i+1})    (Q_{g+1} = 0: no draft after the last one)
    s_i = sum(r_i),   h_i = s_i / (s_i + 1 - w_i)   (so h_g = w_g, and h_0 = 1).

Then it tries the prefixes from the longest down: keep the first i drafts with probability h_i
(i = g, g - 1, ...); the first prefix kept is accepted and the bonus token is drawn from norm(r_i),
which is the target row P_{g+1} when the whole chain is kept. One uniform per prefix tried, none for a
prefix kept with probability 1.

Why lossless (`docs/explanation/lossless-sampling.md` gives the proof sketch): given x_1 .. x_i, the
chance that at least i drafts are kept is exactly w_i, and for every k the k-th emitted token, given the
tokens before it and that the step emits a k-th token, is distributed as the target row there. On one
draft this is Leviathan et al.'s rule; on longer chains it keeps at least as many drafts on average,
since w_i >= the product of the token-wise acceptance probabilities min(1, P_j / Q_j).

A tree with branches is verified by `traversal` (traversal.py), which generalizes this rule to trees and
performs exactly the same steps, with the same uniforms, on a chain. Trees that are no draws from q
(drafts without q, deterministic drafts, a builder that chose by score) are verified by sampling and
matching, as `rejection` does, and say so in `VerifyResult.fallback`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specframe import (
    Sampler, SpecframeError, TargetScores, TokenTree, Verifier, VerifierCapabilities, VerifyResult,
)
from specframe_verify.rejection import fallback_reason
from specframe_verify.sample_match import walk

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the verifier loads none
    import torch

TINY = 1e-12  # below this a residual mass is rounding: the event that needs it has probability ~0


def draft_ratio(name: str, weight: float, p_token: float, q_token: float, token: int, node: int) -> float:
    """min(1, weight * p / q) for a draft `token` (at `node`) that q gave probability `q_token`."""
    if not q_token > 0:
        raise SpecframeError(
            f"verifier '{name}': draft token {token} (node {node}) has draft probability 0, so it cannot "
            "have been drawn from the node's draft_probs row; the drafter must report the exact "
            "distribution it sampled from, or declare its draw as 'argmax'/'top-k'")
    return min(1.0, weight * p_token / q_token)


def residual(weight: float, p: torch.Tensor, q: torch.Tensor, token: int) -> tuple[float, torch.Tensor]:
    """After the draft `token` from (V,) `q` below a prefix of weight `weight` and target row (V,) `p`
    was rejected (with everything after it): the prefix's new weight s / (s + 1 - weight) and its new
    target row norm(max(0, weight * p - q)), where s is the residual mass. Where rounding leaves no mass,
    the row is p without `token`."""
    rest = (weight * p - q).clamp_min_(0)  # (V,) residual before normalizing
    mass = float(rest.sum())
    slack = 1 - weight  # exactly 0 at the root, whose weight stays exactly 1
    if mass + slack <= TINY:  # weight ~1 and p ~q: the rejection had probability ~0
        kept = p.clone()
        kept[token] = 0
        return 1.0, kept / kept.sum() if float(kept.sum()) > 0 else p
    if mass <= TINY:  # the weight drops to ~0: this prefix is (almost) never kept, any row will do
        return mass / (mass + slack), p
    return mass / (mass + slack), rest / mass


def keep(sampling: Sampler, chance: float) -> bool:
    """True with probability `chance`; no uniform is drawn when the answer is certain."""
    if chance >= 1:
        return True
    if chance <= 0:
        return False
    return sampling.uniform() < chance


class BlockVerifier(Verifier):
    """Block verification of a chain with the real draft q: each prefix is judged as a whole, longest
    first. Lossless; see the module docstring. Branching trees are verified by traversal verification,
    which is the same rule on a chain."""

    name = "block"
    capabilities = VerifierCapabilities(lossless=True, needs_draft_probs=True, uses_draft_probs=True,
                                        supports_sampling=True)

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        fallback = fallback_reason(tree)
        if fallback:
            return sample_and_match(tree, scores, sampling, fallback)
        if any(len(kids) > 1 for kids in tree.children):
            from specframe_verify.traversal import traverse

            return traverse(self.name, tree, scores, sampling)
        return block_verify(self.name, tree, scores, sampling)


def sample_and_match(tree: TokenTree, scores: TargetScores, sampling: Sampler, why: str) -> VerifyResult:
    """What `rejection` does with a tree that is no draw from q: sample-match, with the reason."""
    result = walk(tree, lambda node: sampling.sample(scores.logits[node + 1]))  # (V,) logits after node
    result.fallback = why
    return result


def block_verify(name: str, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
    """Block verification of the chain `tree` (each node has at most one child, all sampled)."""
    import torch

    chain = tree.paths[0] if len(tree) else []  # node indices, root's child first
    parents = [-1, *chain[:-1]]  # the node before each draft (-1 = the root)
    p = [sampling.probs(scores.logits[node + 1]).to(torch.float64) for node in parents]  # g rows (V,)
    weights = [1.0]
    for i, node in enumerate(chain):
        token = int(tree.tokens[node])
        q_row = tree.draft_probs[node].to(dtype=torch.float64)  # (V,) the row x_{i+1} was drawn from
        weights.append(draft_ratio(name, weights[-1], float(p[i][token]),
                                   float(q_row[token]) / float(q_row.sum()), token, node))
    if keep(sampling, weights[-1]):  # the whole chain; the bonus comes from the target row after it
        return VerifyResult(path=chain, bonus=sampling.sample(scores.logits[chain[-1] + 1 if chain else 0]))
    for i in range(len(chain) - 1, -1, -1):  # then each shorter prefix, longest first
        q_row = tree.draft_probs[chain[i]].to(device=p[i].device, dtype=torch.float64)  # (V,)
        chance, bonus_row = residual(weights[i], p[i], q_row / q_row.sum(), int(tree.tokens[chain[i]]))
        if keep(sampling, chance):
            return VerifyResult(path=chain[:i], bonus=sampling.draw(bonus_row))
    raise AssertionError("block verification keeps the empty prefix with probability 1")
