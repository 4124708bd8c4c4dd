"""Deliberately wrong components (mutants) that the exact-law tests must reject.

Each mutant is one fault that has shipped in speculative decoding code somewhere, paired with the
scenario of `specframe.testing.law` aimed at it. `test_lossless_power.py` checks that every mutant scores
p < 1e-6 there while the shipped components pass every scenario at p >= 1e-4; the planner mutant runs
end to end, in `test_lossless_e2e.py`.
"""

from __future__ import annotations

import dataclasses

import torch

from specframe import (
    BuildContext, DraftProposal, DrawMethod, Sampler, TargetScores, TokenTree, TreeBuilder,
    TreeBuilderCapabilities, Verifier, VerifierCapabilities, VerifyResult,
)
from specframe.decode.adaptive import AdaptivePlanner, RowPlan
from specframe.plugging.registry import get_registry

FAULTS = ("q-not-renormalised", "bonus-from-p", "uniform-q", "duplicates-not-skipped")


class MutantRejection(Verifier):
    """Recursive rejection sampling with one `fault`:

    - `q-not-renormalised`: the k-th child is tested against q itself, not q without the k - 1 children
      tried before it (the law of the k-th distinct draw);
    - `bonus-from-p`: when every child is rejected, the bonus is drawn from p instead of the residual;
    - `uniform-q`: the acceptance ratio uses a uniform q instead of the drafter's;
    - `duplicates-not-skipped`: a repeated i.i.d. draw is tried again instead of skipped.
    """

    name = "mutant-rejection"
    capabilities = VerifierCapabilities(lossless=True, uses_draft_probs=True, supports_sampling=True)

    def __init__(self, fault: str):
        super().__init__()
        assert fault in FAULTS, fault
        self.fault = fault

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        path, node = [], -1
        while True:
            p = sampling.probs(scores.logits[node + 1]).double()  # (V,)
            children = tree.children[node + 1]
            child = None
            if children and tree.sampled:
                child, p = self._try(p, children, tree, sampling)
            else:
                token = sampling.draw(p)
                child = tree.child(node, token)
                if child is None:
                    return VerifyResult(path, token)
            if child is None:
                return VerifyResult(path, sampling.draw(p))
            path.append(child)
            node = child

    def _try(self, p: torch.Tensor, children: list[int], tree: TokenTree, sampling: Sampler):
        q = tree.draft_probs[children[0]].double()  # (V,)
        if self.fault == "uniform-q":
            q = torch.full_like(q, 1 / len(q))
        remaining, target, tried = q.clone(), p, set()
        for child in children:
            token = int(tree.tokens[child])
            if token in tried and self.fault != "duplicates-not-skipped":
                continue
            tried.add(token)
            q_k = q if self.fault == "q-not-renormalised" else remaining / remaining.sum()  # (V,)
            if sampling.uniform() * q_k[token] < target[token]:
                return child, target
            residual = (target - q_k).clamp_min(0)
            if residual.sum() > 1e-12:
                target = residual / residual.sum()
            remaining[token] = 0
            if remaining.sum() <= 0:
                break
        return None, (p if self.fault == "bonus-from-p" else target)


class ByScoreChain(TreeBuilder):
    """Mutant builder: the shipped `chain` rule for ranked drafts (follow the best-scored child) applied to
    sampled drafts, which it still claims are draws from q."""

    name = "mutant-chain-by-score"
    capabilities = TreeBuilderCapabilities(keeps_draw_order=True)

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        tree = get_registry().get("tree builder", "chain")().build(as_ranked(proposal), context)
        tree.draw = proposal.draw
        return tree


class KeptAllIsSampled(TreeBuilder):
    """Mutant builder with the rule this project once shipped: the shipped `trie` rule for ranked drafts
    (the best-scored `budget` nodes), labelled sampled whenever every node happened to fit (which depends
    on how many distinct tokens were drawn)."""

    name = "mutant-kept-all"
    capabilities = TreeBuilderCapabilities(keeps_draw_order=True)

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        tree = get_registry().get("tree builder", "trie")().build(as_ranked(proposal), context)
        tree.draw = proposal.draw if len(tree) == len(proposal) else DrawMethod.RETRIEVED
        return tree


def as_ranked(proposal: DraftProposal) -> DraftProposal:
    """The same proposal labelled top-k, so the shipped builders pick by score."""
    return dataclasses.replace(proposal, draw=DrawMethod.TOPK)


class GreedyRowPlan(RowPlan):
    """A row's plan that takes every request for a greedy one (`ByScorePlanner`'s rows)."""

    def start_request(self, blind: bool = False) -> None:
        super().start_request(blind=False)


class ByScorePlanner(AdaptivePlanner):
    """Mutant adaptive planner: plans every request as a greedy one, so it keeps or cuts sampled draft
    nodes by their drawn tokens' scores even when the verifier then uses q (a planner whose mode was fixed
    by a decoder's first, greedy request). A tree it keeps whole stays sampled, and whether it was kept
    whole depends on what was drawn."""

    def row(self) -> RowPlan:
        return GreedyRowPlan(self)

    @classmethod
    def for_decoder(cls, decoder) -> ByScorePlanner:
        """The planner `decoder` (`budget="auto"`, with a cost model given) would make, as this mutant."""
        drafter, verifier = decoder.pipeline.drafter, decoder.pipeline.verifier
        return cls(decoder.cost, decoder.budget, learn_speed=False,
                   drafting_grows_with_budget=drafter.capabilities.drafting_grows_with_budget,
                   matches_draws=verifier.capabilities.matches_draws)


TRAVERSAL_FAULTS = ("residual-from-child-row", "weight-not-joint", "kept-with-old-weight", "bonus-from-p",
                    "q-not-renormalised")


class MutantTraversal(Verifier):
    """Traversal verification (block verification on a chain) with one `fault`:

    - `residual-from-child-row`: after a child's subtree is rejected, the residual is built from the
      rejected child's target row instead of its parent's (the residual from the wrong node);
    - `weight-not-joint`: a node is judged by min(1, p / q) of its own token alone, not by the weight of
      its whole path (a block accepted without its joint test);
    - `kept-with-old-weight`: after its children are rejected, a node is kept with the weight it came in
      with instead of s / (s + 1 - w) (the wrong acceptance rule);
    - `bonus-from-p`: the bonus is drawn from the node's target row, never from its residual;
    - `q-not-renormalised`: the k-th sibling is tested against q, not q without the earlier siblings.
    """

    name = "mutant-traversal"
    capabilities = VerifierCapabilities(lossless=True, needs_draft_probs=True, uses_draft_probs=True,
                                        supports_sampling=True)

    def __init__(self, fault: str):
        super().__init__()
        assert fault in TRAVERSAL_FAULTS, fault
        self.fault = fault

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        rows = [sampling.probs(row).double() for row in scores.logits]  # (V,) target row after each entry
        found = self._visit(tree, -1, 1.0, rows[0], rows, sampling)
        assert found is not None
        return found

    def _visit(self, tree, node, weight, p, rows, sampling):
        own = p
        children = tree.children[node + 1]
        if children:
            q = tree.draft_probs[children[0]].double()  # (V,)
            remaining, tried = q.clone(), set()
            for child in children:
                token = int(tree.tokens[child])
                if token in tried:
                    continue
                tried.add(token)
                q_k = q if self.fault == "q-not-renormalised" else remaining / remaining.sum()  # (V,)
                base = 1.0 if self.fault == "weight-not-joint" else weight
                chance = min(1.0, base * float(p[token]) / float(q_k[token]))
                if chance > 0:
                    found = self._visit(tree, child, chance, rows[child + 1], rows, sampling)
                    if found is not None:
                        return found
                row = rows[child + 1] if self.fault == "residual-from-child-row" else p
                rest = (weight * row - q_k).clamp_min(0)  # (V,)
                mass = float(rest.sum())
                if mass > 1e-12:
                    new_weight = mass / (mass + (1 - weight)) if mass + (1 - weight) > 1e-12 else 1.0
                    weight = weight if self.fault == "kept-with-old-weight" else new_weight
                    p = rest / mass
                remaining[token] = 0
                if remaining.sum() <= 0:
                    break
        if weight < 1 and not sampling.uniform() < weight:
            return None
        bonus = sampling.draw(own if self.fault == "bonus-from-p" else p)
        return VerifyResult(tree.path_to(node) if node >= 0 else [], bonus)
