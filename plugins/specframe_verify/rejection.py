"""`rejection`: lossless multi-draft rejection sampling on a token tree, with the real draft distribution q.

This is SpecInfer's multi-step speculative sampling (Miao et al., 2024) in its recursive,
without-replacement form (recursive rejection sampling, Jeon et al., 2024). At a node with processed
target distribution p, whose children x_1, x_2, ... (in draw order) were drawn from the shared row q:

    for k = 1, 2, ...:
        q_k = q with x_1 .. x_{k-1} removed, renormalized    # the law of x_k given the earlier draws
        accept x_k with probability min(1, p(x_k) / q_k(x_k)) and descend into it
        otherwise p <- norm(max(0, p - q_k))                 # the residual
    if every child is rejected, emit a draw from the last residual p as the bonus token.

Assumed sampling of children: the k-th listed child is distributed as q_k given the children before it.
That holds when siblings were drawn *without replacement* from q, and equally when they were drawn
*i.i.d. with replacement* and duplicates were merged at their first appearance (the first new token of
an i.i.d. stream is distributed as q restricted to the unseen tokens): `DrawMethod.SAMPLED` and
`SAMPLED_WITHOUT_REPLACEMENT` are verified by the same rule. Duplicate siblings are skipped. The number of
children may depend on earlier draws (merging sampled sequences into a trie, a budget), never on the
child's own token (see `DrawMethod`).

Why lossless: one step is the speculative sampling lemma: if x ~ q_k, accepting x with probability
min(1, p/q_k) and otherwise drawing from norm(max(0, p - q_k)) yields exactly p. Instead of drawing from
the residual we recurse with the next child, which is distributed as q_{k+1} given everything seen so far
(the acceptance coins are independent of the draft), so by induction from the last child each level
yields exactly its p; and conditioned on the token emitted, the tokens after it are verified the same
way one level down. On a chain (one child per node) this is Leviathan et al.'s algorithm.

Deterministic drafts (`ARGMAX`, `TOPK`), drafts without q (prompt lookup, REST) and sampled drafts that a
tree builder did not keep as a draw-order prefix are verified as if q were one-hot at each child;
rejection sampling then reduces to `sample-match` (draw from p, descend into the child that carries the
draw), which is lossless for any tree. Using the drafter's soft q for tokens it did not sample would not
be. Such a step reports why in `VerifyResult.fallback`, and `DecodeMetrics.fallback_steps` counts them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specframe import (
    DrawMethod, Sampler, SpecframeError, TargetScores, TokenTree, Verifier, VerifierCapabilities,
    VerifyResult,
)

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the verifier loads none
    import torch


def recursive_rejection(p: torch.Tensor, children: list[int], tokens, q: torch.Tensor,
                        sampling: Sampler) -> tuple[int | None, torch.Tensor]:
    """Try `children` (node indices in draw order, tokens `tokens[c]`, all drawn from the (V,) row `q`)
    against the (V,) target distribution `p`. Returns (accepted child or None, residual distribution)."""
    import torch

    remaining = q.to(device=p.device, dtype=torch.float64, copy=True)  # (V,) draft mass not yet drawn
    mass = float(remaining.sum())
    tried: set[int] = set()
    for child in children:
        token = int(tokens[child])
        if token in tried:  # an i.i.d. repeat carries no new draw
            continue
        tried.add(token)
        q_token = float(remaining[token]) / mass  # q_k(token): the law of this child given the earlier ones
        if not q_token > 0:
            raise SpecframeError(
                f"verifier 'rejection': draft token {token} (node {child}) has draft probability 0, so it "
                "cannot have been drawn from the node's draft_probs row; the drafter must report the exact "
                "distribution it sampled from, or declare its draw as 'argmax'/'top-k'")
        if sampling.uniform() * q_token < float(p[token]):  # accept with probability min(1, p / q_k)
            return child, p
        residual = (p - remaining / mass).clamp_min_(0)  # (V,) norm(max(0, p - q_k)) before normalizing
        total = float(residual.sum())
        if total > 1e-12:
            p = residual / total
        else:  # p == q_k up to rounding: rejection had probability ~0; keep p without the rejected token
            p = p.clone()
            p[token] = 0
            p = p / p.sum()
        remaining[token] = 0
        mass = float(remaining.sum())
    return None, p


class RejectionVerifier(Verifier):
    """Recursive rejection sampling with the real draft q on trees. Lossless; see the module docstring.

    Trees whose drafts are not draws from their q rows (retrieved text, argmax or top-k drafts, a tree
    builder that did not keep a draw-order prefix) are verified by sampling and matching, which is
    lossless for any tree; `VerifyResult.fallback` says why, and the decode metrics count such steps.
    """

    name = "rejection"
    capabilities = VerifierCapabilities(lossless=True, uses_draft_probs=True, supports_sampling=True)

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        import torch

        fallback = fallback_reason(tree)
        path: list[int] = []
        node = -1  # the root
        while True:
            logits = scores.logits[node + 1]  # (V,) target logits after the packed entry
            children = tree.children[node + 1]
            if fallback or not children:  # sample, then match
                token = sampling.sample(logits)
                child = tree.child(node, token)
            else:
                p = sampling.probs(logits).to(torch.float64)  # (V,)
                q = tree.draft_probs[children[0]]  # (V,) siblings share the row they were drawn from
                child, residual = recursive_rejection(p, children, tree.tokens, q, sampling)
                token = sampling.draw(residual) if child is None else int(tree.tokens[child])
            if child is None:
                return VerifyResult(path=path, bonus=token, fallback=fallback)
            path.append(child)
            node = child


def fallback_reason(tree: TokenTree) -> str | None:
    """Why `tree` cannot be verified with its q (None when it can, or when it is empty)."""
    if not len(tree) or tree.sampled:
        return None
    if tree.draft_probs is None:
        return "no draft q"
    if tree.draw in (DrawMethod.ARGMAX, DrawMethod.TOPK):
        return "deterministic drafts"
    return "not sampled in draw order"
