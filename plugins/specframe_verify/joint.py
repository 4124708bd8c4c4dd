"""What block and traversal verification share: a draft's acceptance weight, the residual row and weight
after a rejection, a coin that draws no uniform when the answer is certain, and the sample-and-match
fallback for trees that are no draw from q. Both rules are explained in `block.py` and `traversal.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specframe import Sampler, SpecframeError, TargetScores, TokenTree, VerifyResult
from specframe_verify.sample_match import walk

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the verifiers loads none
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



def sample_and_match(tree: TokenTree, scores: TargetScores, sampling: Sampler, why: str) -> VerifyResult:
    """What `rejection` does with a tree that is no draw from q: sample-match, with the reason."""
    result = walk(tree, lambda node: sampling.sample(scores.logits[node + 1]))  # (V,) logits after node
    result.fallback = why
    return result
