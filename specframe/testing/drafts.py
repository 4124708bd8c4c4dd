"""Draft sources with an exactly known q, for the exact-law harness (`specframe.testing.exact`).

`Drafts` builds proposal functions `(ctx, rng) -> DraftProposal` that draw their tokens from a q function
`ctx -> (V,)` exactly as their `DrawMethod` says (and, for the negative tests, some that lie about it).
`TinyModelDrafter` is a real `Drafter` with a tiny draft model for end-to-end runs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np
import torch

from specframe.contract.interfaces import Drafter, DrafterCapabilities
from specframe.terms.proposal import DraftContext, DraftProposal, DrawMethod, ScoreKind
from specframe.testing.exact import LogitTable, Propose, spelled

QFunction = Callable[[tuple[int, ...]], np.ndarray]  # generated context -> (V,) float64 draft distribution


def memoized(q: QFunction) -> QFunction:
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def cached(ctx):
        if ctx not in cache:
            row = np.asarray(q(ctx), np.float64)
            cache[ctx] = row / row.sum()
        return cache[ctx]

    return cached


def model_q(table: LogitTable, temperature: float = 1.0) -> QFunction:
    """q from another table's logits (a second tiny model, or the target itself at another temperature)."""
    return memoized(lambda ctx: torch.softmax(table(ctx).double() / temperature, -1).numpy())


def adversarial_q(target: LogitTable, power: float = 2.0) -> QFunction:
    """q proportional to p^-power: most draft mass on the tokens the target likes least."""
    return memoized(lambda ctx: torch.softmax(-power * torch.log_softmax(target(ctx).double(), -1), -1)
                    .numpy())


def fixed_q(row: list[float]) -> QFunction:
    """The same q after every context."""
    return memoized(lambda ctx: np.array(row, np.float64))


class Drafts:
    """Factories of proposal functions. Sampling uses the `rng` the harness passes in."""

    @staticmethod
    def sampled_sequences(q: QFunction, count: int, length: int) -> Propose:
        """`count` sequences of `length` tokens drawn i.i.d. from q token by token, merged into a trie
        (SpecInfer-style): siblings in order of first draw, repeats merged, `DrawMethod.SAMPLED`."""

        def propose(ctx, rng):
            sequences = []
            for _ in range(count):
                seq: list[int] = []
                for _ in range(length):
                    seq.append(draw(q(ctx + tuple(seq)), rng))
                sequences.append(seq)
            return with_q(DraftProposal.from_sequences(sequences), ctx, q, DrawMethod.SAMPLED)

        return propose

    @staticmethod
    def raw_stream(q: QFunction, count: int) -> Propose:
        """`count` i.i.d. draws from q as children of the root, repeats kept as separate siblings (the raw
        stream `DrawMethod.SAMPLED` allows); each child followed by one token drawn from q after it."""

        def propose(ctx, rng):
            firsts = [draw(q(ctx), rng) for _ in range(count)]
            tokens = firsts + [draw(q(ctx + (t,)), rng) for t in firsts]
            parents = [-1] * count + list(range(count))
            proposal = DraftProposal(np.array(tokens), np.array(parents), np.zeros(2 * count))
            return with_q(proposal, ctx, q, DrawMethod.SAMPLED)

        return propose

    @staticmethod
    def without_replacement(q: QFunction, widths: tuple[int, ...]) -> Propose:
        """widths[d] children per node at depth d, drawn from q without replacement, in draw order (the
        Gumbel-top-k trick: sorting log q + Gumbel noise orders tokens as successive draws would)."""

        def propose(ctx, rng):
            tokens, parents, frontier = [], [], [(-1, ())]
            for width in widths:
                nxt = []
                for parent, path in frontier:
                    dist = q(ctx + path)
                    k = min(width, int(np.count_nonzero(dist)))
                    with np.errstate(divide="ignore"):
                        keys = np.log(dist) + rng.gumbel(size=len(dist))  # (V,)
                    for tok in np.argsort(-keys)[:k].tolist():
                        tokens.append(tok), parents.append(parent)
                        nxt.append((len(tokens) - 1, path + (tok,)))
                frontier = nxt
            proposal = DraftProposal(np.array(tokens), np.array(parents), np.zeros(len(tokens)))
            return with_q(proposal, ctx, q, DrawMethod.SAMPLED_WITHOUT_REPLACEMENT)

        return propose

    @staticmethod
    def top_k(q: QFunction, widths: tuple[int, ...], label: DrawMethod = DrawMethod.TOPK) -> Propose:
        """Deterministic: the widths[d] most likely draft tokens per node, with their soft q rows attached.
        `label` lets a negative test claim they were sampled."""

        def propose(ctx, rng):
            tokens, parents, frontier = [], [], [(-1, ())]
            for width in widths:
                nxt = []
                for parent, path in frontier:
                    for tok in np.argsort(-q(ctx + path), kind="stable")[:width]:
                        tokens.append(int(tok)), parents.append(parent)
                        nxt.append((len(tokens) - 1, path + (int(tok),)))
                frontier = nxt
            proposal = DraftProposal(np.array(tokens), np.array(parents), np.zeros(len(tokens)))
            return with_q(proposal, ctx, q, label)

        return propose

    @staticmethod
    def retrieved(tokens: list[int], parents: list[int]) -> Propose:
        """The same tree every step and no q: a static tree or a stale retrieval."""

        def propose(ctx, rng):
            return DraftProposal(np.array(tokens), np.array(parents), np.zeros(len(tokens)))

        return propose


_CDF: dict[int, tuple[np.ndarray, list[float]]] = {}  # id(row) -> (row, its CDF): rows are memoized


def draw(dist: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a normalized (V,) distribution by inverse CDF (faster than `rng.choice`)."""
    entry = _CDF.get(id(dist))
    if entry is None or entry[0] is not dist:
        entry = _CDF[id(dist)] = (dist, np.cumsum(dist).tolist())
    cdf = entry[1]
    return min(bisect.bisect_right(cdf, rng.random()), len(cdf) - 1)


def with_q(proposal: DraftProposal, ctx: tuple[int, ...], q: QFunction, label: DrawMethod) -> DraftProposal:
    """Attach the (N, V) rows q(parent context) (row i is what node i was drawn from) and scores
    log q(path) (cumulative, as the `beam` and `dynamic` builders expect)."""
    rows = np.array([q(ctx + spelled(proposal, int(p))) for p in proposal.parents]).reshape(len(proposal), -1)
    logq = np.log(rows[np.arange(len(proposal)), proposal.tokens] + 1e-300) if len(proposal) else np.zeros(0)
    scores = logq.copy()
    for i, parent in enumerate(proposal.parents.tolist()):
        if parent >= 0:
            scores[i] += scores[parent]
    proposal.scores, proposal.score_kind = scores, ScoreKind.LOG_PROB
    proposal.draft_probs = torch.from_numpy(rows).float()
    proposal.draw = label
    return proposal


class TinyModelDrafter(Drafter):
    """`test-tiny-model` (testing only): a drafter with a real draft distribution, q = softmax(logits / T)
    of a tiny draft model.

    `draw="sampled"`: `count` sequences of `length` tokens drawn i.i.d. from q and merged into a trie;
    `draw="top-k"`: the `count` most likely tokens at the root, each followed by its argmax chain.
    Draws use the drafter's own generator, seeded once at construction and never reset: every request
    gets fresh draws (a drafter replaying the same draws each request would not be sampling from q).
    """

    name = "test-tiny-model"
    capabilities = DrafterCapabilities(provides_draft_probs=True, proposes_trees=True, samples_drafts=True,
                                       score_kind=ScoreKind.FREQUENCY)

    def __init__(self, target, *, draft, count: int = 3, length: int = 3, temperature: float = 1.0,
                 draw: str = "sampled", seed: int = 0):
        super().__init__(target)
        self.draft, self.count, self.length, self.temperature = draft, count, length, temperature
        self.method = DrawMethod(draw)
        self.generator = torch.Generator().manual_seed(seed)

    @torch.inference_mode()
    def q(self, contexts: list[list[int]]) -> torch.Tensor:
        """(B, V) draft distributions after each context (all of one length)."""
        logits = self.draft.model(input_ids=torch.tensor(contexts)).logits[:, -1].float()  # (B, V)
        return torch.softmax(logits / self.temperature, -1)

    def propose(self, context: DraftContext) -> DraftProposal:
        length = min(self.length, context.budget)
        if length < 1:
            return DraftProposal.empty()
        prefix = [int(t) for t in context.tokens]
        seen: dict[tuple[int, ...], torch.Tensor] = {}  # drafted path -> (V,) q after it

        def q_after(sequences: list[list[int]]) -> torch.Tensor:
            q = self.q([prefix + s for s in sequences])  # (B, V)
            seen.update((tuple(s), row) for s, row in zip(sequences, q))
            return q

        if self.method is DrawMethod.SAMPLED:
            sequences = [[] for _ in range(self.count)]
            for _ in range(length):
                picks = torch.multinomial(q_after(sequences), 1, generator=self.generator)[:, 0].tolist()
                for seq, tok in zip(sequences, picks):
                    seq.append(int(tok))
        else:
            sequences = [[int(r)] for r in torch.topk(q_after([[]])[0], self.count).indices.tolist()]
            for _ in range(length - 1):
                for seq, tok in zip(sequences, q_after(sequences).argmax(-1).tolist()):
                    seq.append(int(tok))
        proposal = DraftProposal.from_sequences(sequences)
        rows = [seen[spelled(proposal, int(p))] for p in proposal.parents]
        proposal.draft_probs = torch.stack(rows)  # (N, V) row i: the q node i was drawn from
        proposal.draw = self.method
        return proposal
