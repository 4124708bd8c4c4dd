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

from specframe import Sampler, TargetScores, TokenTree, VerifyResult
from specframe_verify.joint import draft_ratio, keep, residual
from specframe_verify.traversal import TraversalVerifier, traverse

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the verifier loads none
    pass

class BlockVerifier(TraversalVerifier):
    """Block verification of a chain with the real draft q: each prefix is judged as a whole, longest
    first. Lossless; see the module docstring. Branching trees are verified by traversal verification,
    which is the same rule on a chain; trees that are no draws from q, as `traversal` verifies them."""

    name = "block"

    def judge(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        if any(len(kids) > 1 for kids in tree.children):
            return traverse(self.name, tree, scores, sampling)
        return block_verify(self.name, tree, scores, sampling)


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
