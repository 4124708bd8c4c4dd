"""Random proposals and trees, a synthetic target for verifier checks, and two reference components.

The reference components exist so that a conformance check of one component can run with the others
fixed: `FirstNodesTreeBuilder` keeps branching trees (the first-party `chain` would hide tree bugs in a
backend or verifier), and `NoisyTargetDrafter` is a drafter with a real draft distribution q for tree
builders and verifiers that need one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specframe.contract.interfaces import (
    BuildContext, Drafter, DrafterCapabilities, TreeBuilder, TreeBuilderCapabilities,
)
from specframe.terms.proposal import DraftContext, DraftProposal, DrawMethod, ScoreKind
from specframe.terms.records import TargetScores
from specframe.terms.tree import TokenTree


def random_parents(rng: np.random.Generator, n: int, max_children: int = 3) -> np.ndarray:
    """(n,) parents of a random forest in topological order, each node (the root too) with at most
    `max_children` children, so fewer than n nodes come back when no parent has room left."""
    parents: list[int] = []
    kids: dict[int, int] = {}
    for i in range(n):
        open_ = [p for p in range(-1, i) if kids.get(p, 0) < max_children]
        if not open_:
            break
        p = int(open_[int(rng.integers(len(open_)))])
        kids[p] = kids.get(p, 0) + 1
        parents.append(p)
    return np.array(parents, np.int64)


def random_proposal(rng: np.random.Generator, vocab_size: int, n: int | None = None, *,
                    with_probs: bool = False, draw: DrawMethod = DrawMethod.RETRIEVED) -> DraftProposal:
    """A random proposal of about `n` nodes (random size up to 24 when None), optionally with draft probs.

    With probabilities, each node's children are drawn from one random q row the way `draw` says, and
    every child carries that row (see `grow`), so the proposal is what a sampling drafter could produce.
    """
    n = int(rng.integers(0, 25)) if n is None else n
    if not with_probs:
        parents = random_parents(rng, n)
        return DraftProposal(rng.integers(0, vocab_size, len(parents)), parents, rng.random(len(parents)),
                             draw=draw)
    tokens, parents, probs = grow(rng, n, lambda node, token, depth: _random_dist(rng, vocab_size), draw)
    scores = np.log(probs[torch.arange(len(tokens)), torch.from_numpy(tokens)].double().numpy() + 1e-12)
    return DraftProposal(tokens, parents, scores, draft_probs=probs, draw=draw, score_kind=ScoreKind.LOG_PROB)


def grow(rng: np.random.Generator, n: int, q_after, draw: DrawMethod, max_children: int = 3,
         max_depth: int | None = None) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """Draft a tree top-down as a sampling drafter does: up to `n` nodes, each node's children drawn from
    `q_after(node, token, depth)` (node -1 is the root), listed in draw order.

    SAMPLED draws are i.i.d. and a repeated token merges into its first appearance (the `DrawMethod`
    contract); SAMPLED_WITHOUT_REPLACEMENT draws distinct tokens; ARGMAX/TOPK take the most likely ones.
    Returns tokens (N,), parents (N,) and the q row each node was drawn from, (N, V).
    """
    tokens: list[int] = []
    parents: list[int] = []
    depth: list[int] = []
    rows: list[torch.Tensor] = []
    frontier = [(-1, -1, 0)]  # (node, token, depth), breadth first
    while frontier and len(tokens) < n:
        node, token, d = frontier.pop(0)
        if max_depth is not None and d >= max_depth:
            continue
        q = q_after(node, token, d)  # (V,)
        width = min(int(rng.integers(1, max_children + 1)), n - len(tokens))
        for tok in _draw(rng, q, width, draw):
            tokens.append(int(tok)), parents.append(node), depth.append(d + 1), rows.append(q)
            frontier.append((len(tokens) - 1, int(tok), d + 1))
    probs = torch.stack(rows) if rows else torch.zeros(0, 1)  # (N, V)
    return np.array(tokens, np.int64), np.array(parents, np.int64), probs


def _random_dist(rng: np.random.Generator, vocab_size: int) -> torch.Tensor:
    logits = rng.normal(size=vocab_size) * 1.5
    return torch.from_numpy(np.exp(logits) / np.exp(logits).sum()).float()  # (V,)


def _draw(rng: np.random.Generator, q: torch.Tensor, k: int, draw: DrawMethod) -> list[int]:
    """Up to `k` distinct sibling tokens drawn from q as `draw` says, in draw order."""
    p = q.double().numpy()
    p = p / p.sum()
    k = min(k, int((p > 0).sum()))
    if draw in (DrawMethod.ARGMAX, DrawMethod.TOPK):
        return np.argsort(-p, kind="stable")[:k].tolist()
    if draw is DrawMethod.SAMPLED_WITHOUT_REPLACEMENT:
        return rng.choice(len(p), size=k, replace=False, p=p).tolist()
    return list(dict.fromkeys(rng.choice(len(p), size=k, replace=True, p=p).tolist()))  # merge repeats


def random_tree(rng: np.random.Generator, vocab_size: int, n: int | None = None, **kwargs) -> TokenTree:
    """A random `TokenTree` (all nodes of `random_proposal`)."""
    proposal = random_proposal(rng, vocab_size, n, **kwargs)
    return TokenTree.from_proposal(proposal, np.arange(len(proposal)))


@dataclass
class MarkovProblem:
    """A synthetic target whose next-token distribution depends on the last token and its depth only.

    `root_logits` follow the root; `logits[d][t]` follow token t at depth d. Trees drafted against it can
    be scored without a model, so a verifier can be run thousands of times in a second or two.
    """

    root_logits: torch.Tensor  # (V,)
    logits: torch.Tensor  # (D, V, V) by depth - 1, then last token
    draft: torch.Tensor  # (D + 1, V, V) q after (depth, last token); row [0, *] is q after the root

    @classmethod
    def random(cls, rng: np.random.Generator, vocab_size: int = 8, depth: int = 4) -> MarkovProblem:
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        root = torch.randn(vocab_size, generator=gen) * 1.5  # (V,)
        logits = torch.randn(depth, vocab_size, vocab_size, generator=gen) * 1.5  # (D, V, V)
        # A draft that resembles the target without equal to it, as a real draft model would.
        noisy = torch.cat([root[None, None].expand(1, vocab_size, vocab_size), logits])  # (D + 1, V, V)
        draft = (noisy + torch.randn(noisy.shape, generator=gen)).softmax(-1)  # (D + 1, V, V)
        return cls(root, logits, draft)

    @property
    def vocab_size(self) -> int:
        return self.root_logits.shape[0]

    def tree(self, rng: np.random.Generator, n: int, draw: DrawMethod, max_children: int = 3) -> TokenTree:
        """A random tree of up to `n` nodes drafted from `draft` (depth at most D), with its q attached."""
        def q_after(node: int, token: int, depth: int) -> torch.Tensor:
            return self.draft[0, 0] if node < 0 else self.draft[depth, token]  # (V,)

        tokens, parents, probs = grow(rng, n, q_after, draw, max_children, max_depth=self.logits.shape[0])
        return TokenTree(tokens, parents, probs if len(tokens) else None, draw)

    def scores(self, tree: TokenTree) -> TargetScores:
        """(N + 1, V) logits of the synthetic target at the root and at every node of `tree`."""
        rows = [self.root_logits] + [self.logits[d - 1, t] for d, t in zip(tree.depth.tolist(), tree.tokens)]
        return TargetScores(logits=torch.stack(rows), tree=tree)  # (N + 1, V)

    def next_logits(self, depth: int, token: int) -> torch.Tensor:
        """(V,) logits after `token` emitted at `depth` (1 = first token after the root)."""
        return self.logits[depth - 1, token]


class FirstNodesTreeBuilder(TreeBuilder):
    """`first-n` (testing only): the first `budget` nodes of the proposal, branches and all.

    Proposals are topologically ordered, so any prefix of the nodes is closed under parents; and it is a
    prefix in draw order that never looks at the tokens, so sampled drafts stay sampled (see `DrawMethod`).
    """

    name = "first-n"
    capabilities = TreeBuilderCapabilities(keeps_draft_probs=True, keeps_draw_order=True)

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        keep = np.arange(min(context.budget, len(proposal)))
        return TokenTree.from_proposal(proposal, keep, draw_order_prefix=True)


class NoisyTargetDrafter(Drafter):
    """`noisy-target` (testing only): a draft model made of the target itself with noisy logits.

    Proposes `width` distinct children of the root (top-k of q) and continues each with a greedy chain
    of `depth - 1` tokens; fills `draft_probs` with the real q. Costs `depth` batched forward passes of
    the target over the whole context, so use it with tiny targets only.
    """

    name = "noisy-target"
    capabilities = DrafterCapabilities(provides_draft_probs=True, proposes_trees=True,
                                       score_kind=ScoreKind.LOG_PROB)

    def __init__(self, target, *, width: int = 2, depth: int = 3, noise: float = 1.0, seed: int = 0):
        super().__init__(target)
        self.width, self.depth, self.noise, self.seed = width, depth, noise, seed
        self.generator = torch.Generator().manual_seed(seed)

    def reset(self) -> None:
        self.generator.manual_seed(self.seed)

    @torch.inference_mode()
    def _q(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) contexts -> (B, V) noisy next-token distributions."""
        logits = self.target.model(input_ids=ids.to(self.target.device)).logits[:, -1].float().cpu()  # (B, V)
        return (logits + self.noise * torch.randn(logits.shape, generator=self.generator)).softmax(-1)

    def propose(self, context: DraftContext) -> DraftProposal:
        if context.budget < 1:
            return DraftProposal.empty()
        base = torch.from_numpy(context.tokens)[None]  # (1, L)
        q_root = self._q(base)[0]  # (V,)
        firsts = q_root.topk(self.width).indices  # (W,)
        tokens, parents, probs, scores = [], [], [], []
        for tok in firsts.tolist():
            tokens.append(tok), parents.append(-1), probs.append(q_root)
            scores.append(float(q_root[tok].log()))
        chains = torch.cat([base.expand(self.width, -1), firsts[:, None]], dim=1)  # (W, L + 1)
        last = list(range(self.width))
        for _ in range(self.depth - 1):
            q = self._q(chains)  # (W, V)
            nxt = q.argmax(-1)  # (W,)
            for w in range(self.width):
                parents.append(last[w]), tokens.append(int(nxt[w])), probs.append(q[w])
                scores.append(scores[last[w]] + float(q[w, nxt[w]].log()))
                last[w] = len(tokens) - 1
            chains = torch.cat([chains, nxt[:, None]], dim=1)  # (W, L + d)
        return DraftProposal(np.array(tokens), np.array(parents), np.array(scores),
                             draft_probs=torch.stack(probs), draw=DrawMethod.TOPK,
                             score_kind=ScoreKind.LOG_PROB)
