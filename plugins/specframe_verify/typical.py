"""`typical`: Medusa's typical acceptance (Cai et al., 2024). LOSSY: the output does NOT follow the target's
distribution when sampling.

A draft token x after a node is accepted when the target finds it "typical enough":

    p(x) > min(threshold, alpha * exp(-H(p)))

with p the processed target distribution at the node (`Sampler.probs`) and H its entropy. The longest
root-to-node path whose tokens all pass is accepted (ties: the higher target log-probability, then the
earlier node), and the bonus token is sampled from the target after it with the shared `Sampler`.

It trades exactness for acceptance: at high temperature it accepts plausible tokens the target would
rarely have sampled and never emits the rest of the tail. The pipeline warns when it is used with
temperature > 0. At temperature 0 (p one-hot, H = 0) only the argmax passes, so it equals greedy
verification and is lossless there.
"""

from __future__ import annotations

import math

import numpy as np

from specframe import (
    ConfigurationError, Sampler, TargetScores, TokenTree, Verifier, VerifierCapabilities, VerifyResult,
)


class TypicalVerifier(Verifier):
    """LOSSY typical acceptance (Medusa). Options: `threshold` (epsilon, default 0.09) and `alpha` (delta,
    default sqrt(threshold), Medusa's choice)."""

    name = "typical"
    capabilities = VerifierCapabilities(lossless=False, needs_draft_probs=False, supports_sampling=True)

    def __init__(self, *, threshold: float = 0.09, alpha: float | None = None):
        super().__init__()
        alpha = math.sqrt(threshold) if alpha is None else alpha
        if not 0 < threshold <= 1 or not 0 < alpha:
            raise ConfigurationError(
                f"verifier 'typical': need 0 < threshold <= 1 and alpha > 0, got threshold={threshold}, "
                f"alpha={alpha}; Medusa uses threshold=0.09, alpha=0.3")
        self.threshold, self.alpha = threshold, alpha

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        import torch

        n = len(tree)
        if n == 0:
            return VerifyResult(path=[], bonus=sampling.sample(scores.logits[0]))
        rows = np.unique(tree.parents + 1)  # packed entries that have children
        p = sampling.probs(scores.logits[torch.from_numpy(rows)])  # (R, V)
        entropy = -torch.special.xlogy(p, p).sum(-1)  # (R,)
        limit = torch.clamp(self.alpha * torch.exp(-entropy), max=self.threshold)  # (R,)
        row_of = {int(r): i for i, r in enumerate(rows)}
        parent_rows = torch.tensor([row_of[int(r)] for r in tree.parents + 1])  # (N,)
        p_token = p[parent_rows, torch.from_numpy(tree.tokens)]  # (N,) target probability of each node
        passes = (p_token > limit[parent_rows]).tolist()
        logp = torch.log(p_token).tolist()
        ok = [False] * n
        score = [0.0] * n  # log-probability of the path down to the node
        for i, parent in enumerate(tree.parents.tolist()):
            ok[i] = passes[i] and (parent < 0 or ok[parent])
            score[i] = logp[i] + (score[parent] if parent >= 0 else 0.0)
        best = max((i for i in range(n) if ok[i]), key=lambda i: (tree.depth[i], score[i], -i), default=None)
        path = [] if best is None else tree.path_to(best)
        bonus = sampling.sample(scores.logits[best + 1 if best is not None else 0])
        return VerifyResult(path=path, bonus=bonus)
