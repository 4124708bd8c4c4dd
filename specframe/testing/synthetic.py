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

from specframe.interfaces import Drafter, DrafterCapabilities, TreeBuilder, TreeBuilderCapabilities
from specframe.records import DraftContext, DraftProposal, DrawMethod, TargetScores
from specframe.tree import TokenTree


def random_parents(rng: np.random.Generator, n: int, max_children: int = 3,
                   max_depth: int | None = None) -> np.ndarray:
    """(n,) parents of a random forest in topological order: at most `max_children` per node (the root
    included, so n is capped at what fits) and at most `max_depth` levels."""
    parents: list[int] = []
    depth: list[int] = []
    kids: dict[int, int] = {}
    for i in range(n):
        open_ = [p for p in range(-1, i) if kids.get(p, 0) < max_children
                 and (max_depth is None or p < 0 or depth[p] < max_depth)]
        if not open_:
            break
        p = int(open_[int(rng.integers(len(open_)))])
        kids[p] = kids.get(p, 0) + 1
        parents.append(p)
        depth.append(1 if p < 0 else depth[p] + 1)
    return np.array(parents, np.int64)


def random_proposal(rng: np.random.Generator, vocab_size: int, n: int | None = None, *,
                    with_probs: bool = False, draw: DrawMethod = DrawMethod.RETRIEVED) -> DraftProposal:
    """A random proposal of `n` nodes (random size up to 24 when None), optionally with draft probabilities.

    With probabilities, siblings share one q (as `DraftProposal` documents) and each node's token is
    drawn from its q, so the proposal is what a sampling drafter could really have produced.
    """
    n = int(rng.integers(0, 25)) if n is None else n
    parents = random_parents(rng, n)
    n = len(parents)
    if not with_probs:
        return DraftProposal(rng.integers(0, vocab_size, n), parents, rng.random(n), draw=draw)
    q_of_parent = {p: _random_dist(rng, vocab_size) for p in set(parents.tolist())}
    probs = torch.stack([q_of_parent[p] for p in parents.tolist()]) if n else torch.zeros(0, vocab_size)
    tokens = _draw_children(rng, parents, q_of_parent, draw)
    scores = np.log(probs[torch.arange(n), torch.from_numpy(tokens)].double().numpy() + 1e-12)
    return DraftProposal(tokens, parents, scores, draft_probs=probs, draw=draw)


def _random_dist(rng: np.random.Generator, vocab_size: int) -> torch.Tensor:
    logits = rng.normal(size=vocab_size) * 1.5
    return torch.from_numpy(np.exp(logits) / np.exp(logits).sum()).float()  # (V,)


def _draw_children(rng, parents: np.ndarray, q_of_parent: dict[int, torch.Tensor], draw: DrawMethod):
    """Tokens for every node, drawn from the shared q of its siblings the way `draw` says."""
    tokens = np.empty(len(parents), np.int64)
    by_parent: dict[int, list[int]] = {}
    for i, p in enumerate(parents.tolist()):
        by_parent.setdefault(p, []).append(i)
    for p, kids in by_parent.items():
        q = q_of_parent[p].double().numpy()
        q = q / q.sum()
        if draw in (DrawMethod.ARGMAX, DrawMethod.TOPK):
            picks = np.argsort(-q, kind="stable")[: len(kids)]
        elif draw is DrawMethod.SAMPLED_WITHOUT_REPLACEMENT:
            picks = rng.choice(len(q), size=len(kids), replace=False, p=q)
        else:
            picks = rng.choice(len(q), size=len(kids), replace=True, p=q)
        tokens[kids] = picks
    return tokens


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
        parents = random_parents(rng, n, max_children, max_depth=self.logits.shape[0])
        shell = TokenTree(np.zeros(len(parents), np.int64), parents)  # for depths and children
        tokens = np.zeros(len(parents), np.int64)
        q_rows: list[torch.Tensor] = [self.draft[0, 0]] * len(parents)
        for p in range(-1, len(parents)):  # parents before children: their tokens are known
            kids = shell.children[p + 1]
            if not kids:
                continue
            q = self.draft[0, 0] if p < 0 else self.draft[shell.depth[p], tokens[p]]  # (V,)
            for i in kids:
                q_rows[i] = q
            tokens[kids] = _draw_children(rng, np.zeros(len(kids), np.int64), {0: q}, draw)
        probs = torch.stack(q_rows) if q_rows else torch.zeros(0, self.vocab_size)  # (N, V)
        return TokenTree(tokens, parents, probs)

    def scores(self, tree: TokenTree) -> TargetScores:
        """(N + 1, V) logits of the synthetic target at the root and at every node of `tree`."""
        rows = [self.root_logits] + [self.logits[d - 1, t] for d, t in zip(tree.depth.tolist(), tree.tokens)]
        return TargetScores(logits=torch.stack(rows))

    def next_logits(self, depth: int, token: int) -> torch.Tensor:
        """(V,) logits after `token` emitted at `depth` (1 = first token after the root)."""
        return self.logits[depth - 1, token]


class FirstNodesTreeBuilder(TreeBuilder):
    """`first-n` (testing only): the first `budget` nodes of the proposal, branches and all.

    Proposals are topologically ordered, so any prefix of the nodes is closed under parents.
    """

    name = "first-n"
    capabilities = TreeBuilderCapabilities(keeps_draft_probs=True)

    def build(self, proposal: DraftProposal, budget: int) -> TokenTree:
        return TokenTree.from_proposal(proposal, np.arange(min(budget, len(proposal))))


class NoisyTargetDrafter(Drafter):
    """`noisy-target` (testing only): a draft model made of the target itself with noisy logits.

    Proposes `width` distinct children of the root (top-k of q) and continues each with a greedy chain
    of `depth - 1` tokens; fills `draft_probs` with the real q. Costs `depth` batched forward passes of
    the target over the whole context, so use it with tiny targets only.
    """

    name = "noisy-target"
    capabilities = DrafterCapabilities(provides_draft_probs=True, proposes_trees=True)

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
            tokens.append(tok), parents.append(-1), probs.append(q_root), scores.append(float(q_root[tok].log()))
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
                             draft_probs=torch.stack(probs), draw=DrawMethod.TOPK)
