"""Exact-law harness: check sampling verifiers, tree builders and whole decoders against the exactly
enumerated distribution of a tiny target.

A target whose next-token logits are tabulated for every context of fewer than `depth` generated tokens
(`LogitTable`: a fixed random table, or a tiny model evaluated once on every context) has a first-`depth`
-token law that is a finite product of `Sampler.probs` rows (`exact_law`). Many seeded runs of a
verifier (`simulate`, which calls the verifier directly) or of a `SpeculativeDecoder`
(`decoder_counts`) are then compared with that law by a chi-square test and the total variation
distance against its noise level (`law_test`). `docs/explanation/lossless-sampling.md` explains what the
tests must catch and shows the mutants they reject.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specframe.contract.interfaces import BackendCapabilities, StateBackend
from specframe.terms.proposal import DraftProposal
from specframe.terms.records import TargetScores
from specframe.terms.sampling import Sampler, SamplingParams
from specframe.terms.tree import TokenTree

P_PASS = 1e-4  # a lossless component passes when p >= P_PASS: one false alarm in 10,000 seeds per check
P_CATCH = 1e-6  # a deliberately wrong component must score below this


class LogitTable:
    """Next-token logits (and optionally last hidden states) after `prompt + ctx` for every generated
    context `ctx` shorter than `depth`; deeper contexts get zero logits (they never influence the first
    `depth` tokens)."""

    def __init__(self, rows: dict[tuple[int, ...], torch.Tensor], vocab: int, depth: int,
                 hidden: dict[tuple[int, ...], torch.Tensor] | None = None):
        self.rows, self.vocab, self.depth, self.hidden = rows, vocab, depth, hidden
        self.filler = torch.zeros(vocab)

    @classmethod
    def random(cls, vocab: int = 8, depth: int = 2, *, seed: int = 0, scale: float = 2.0) -> LogitTable:
        """A fixed random table: i.i.d. normal logits times `scale` (larger is sharper)."""
        gen = torch.Generator().manual_seed(seed)
        rows = {ctx: torch.randn(vocab, generator=gen) * scale for ctx in contexts(vocab, depth)}
        return cls(rows, vocab, depth)

    @classmethod
    @torch.inference_mode()
    def from_target(cls, target, prompt: Sequence[int], depth: int) -> LogitTable:
        """The table of a (tiny) model: one batched forward pass per context length."""
        rows, hidden = {}, {}
        for length in range(depth):
            ctxs = list(itertools.product(range(target.vocab_size), repeat=length))
            ids = torch.tensor([[*prompt, *c] for c in ctxs], device=target.device)  # (C, P + length)
            out = target.model(input_ids=ids, output_hidden_states=True)
            rows.update(zip(ctxs, out.logits[:, -1].float().cpu()))  # (C, V)
            hidden.update(zip(ctxs, out.hidden_states[-1][:, -1].cpu()))  # (C, H)
        return cls(rows, target.vocab_size, depth, hidden)

    def __call__(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return self.rows.get(ctx, self.filler)  # (V,)


def contexts(vocab: int, depth: int) -> list[tuple[int, ...]]:
    """Every token sequence shorter than `depth`."""
    return [c for n in range(depth) for c in itertools.product(range(vocab), repeat=n)]


def exact_law(table: LogitTable, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first `table.depth` generated tokens = seq) under the processed target distribution."""
    sampler = Sampler(params)
    probs = {ctx: sampler.probs(row).double().numpy() for ctx, row in table.rows.items()}
    law = {}
    for seq in itertools.product(range(table.vocab), repeat=table.depth):
        mass = 1.0
        for i in range(table.depth):
            mass *= probs[seq[:i]][seq[i]]
            if mass == 0:
                break
        if mass > 0:
            law[seq] = mass
    return law


@dataclass
class LawTest:
    """A goodness-of-fit test of observed sequences against an exact law."""

    runs: int
    cells: int  # chi-square cells after pooling the rare ones
    chi2: float
    pvalue: float
    tv: float  # total variation between the empirical and the exact law
    tv_noise: float  # mean total variation of `runs` exact draws: what a correct sampler scores

    def __str__(self) -> str:
        return (f"N={self.runs}, chi2={self.chi2:.1f} on {self.cells - 1} dof, p={self.pvalue:.3g}, "
                f"TV={self.tv:.4f} (noise {self.tv_noise:.4f})")


def law_test(counts: Counter, law: dict, min_expected: float = 5.0, noise_draws: int = 200) -> LawTest:
    """Pearson chi-square (cells expected below `min_expected` pooled into one) and total variation.

    A sequence outside the law's support makes the p-value 0. The noise level is estimated from
    `noise_draws` multinomial samples of the exact law, with a fixed seed.
    """
    total = sum(counts.values())
    probs = np.array(list(law.values()))
    observed = np.array([counts.get(seq, 0) for seq in law], np.float64)
    outside = total - observed.sum()
    tv = 0.5 * (np.abs(observed / total - probs).sum() + outside / total)
    noise = np.random.default_rng(0).multinomial(total, probs / probs.sum(), size=noise_draws) / total
    tv_noise = float(0.5 * np.abs(noise - probs).sum(-1).mean())
    expected = probs * total
    big = expected >= min_expected
    stat = float(((observed[big] - expected[big]) ** 2 / expected[big]).sum())
    cells = int(big.sum())
    pooled_exp, pooled_obs = float(expected[~big].sum()), float(observed[~big].sum())
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    dof = max(cells - 1, 1)
    pvalue = 0.0 if outside else float(torch.special.gammaincc(
        torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return LawTest(total, cells, stat, pvalue, float(tv), tv_noise)


def keep_all(proposal: DraftProposal) -> TokenTree:
    """The whole proposal as the tree: a rule that never looks at the drawn tokens."""
    return TokenTree.from_proposal(proposal, np.arange(len(proposal)), draw_order_prefix=True)


Propose = Callable[[tuple[int, ...], np.random.Generator], DraftProposal]


def simulate(verifier, propose: Propose, table: LogitTable, params: SamplingParams, runs: int, seed: int = 0,
             build: Callable[[DraftProposal], TokenTree] = keep_all) -> Counter:
    """Counts of the first `table.depth` tokens over `runs` fake decodes that draft with `propose(ctx, rng)`,
    cut with `build` and call `verifier.verify` directly on the tabulated target logits."""
    sampler = Sampler(SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed))
    rng = np.random.default_rng(seed + 1)
    counts: Counter = Counter()
    for _ in range(runs):
        emitted: tuple[int, ...] = ()
        while len(emitted) < table.depth:
            tree = build(propose(emitted, rng))
            rows = [table(emitted)] + [table(emitted + spelled(tree, i)) for i in range(len(tree))]
            result = verifier.verify(tree, TargetScores(logits=torch.stack(rows)), sampler)  # (N + 1, V)
            emitted += tuple(int(t) for t in tree.tokens[result.path]) + (int(result.bonus),)
        counts[emitted[: table.depth]] += 1
    return counts


def spelled(tree, node: int) -> tuple[int, ...]:
    """Tokens from the root's child down to `node` (empty for the root, -1) of a tree or proposal."""
    out = []
    while node >= 0:
        out.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return tuple(out[::-1])


def decoder_counts(decoder, prompt: Sequence[int], depth: int, runs: int, params: SamplingParams,
                   max_new_tokens: int | None = None, batch: int | None = None) -> tuple[Counter, int]:
    """Counts of the first `depth` tokens over `runs` requests with seeds 0..runs-1, and the number of
    draft tokens accepted in all of them (to show the trees were exercised). With `batch`, the requests
    are decoded `batch` at a time as rows of one `generate_batch`, each row with its own seed: each row's
    law is then tested."""
    counts: Counter = Counter()
    accepted = 0
    limit = max_new_tokens or depth
    for first in range(0, runs, batch or 1):
        seeds = list(range(first, min(first + (batch or 1), runs)))
        if batch is None:
            decoder.sampling = SamplingParams(params.temperature, params.top_p, params.top_k, seed=first)
            results = [decoder.generate(list(prompt), max_new_tokens=limit)]
        else:
            decoder.sampling = SamplingParams(params.temperature, params.top_p, params.top_k)
            results = decoder.generate_batch([list(prompt)] * len(seeds), limit, seeds=seeds)
        for result in results:
            counts[tuple(result.tokens[:depth])] += 1
            accepted += result.metrics.accepted_draft_tokens
    return counts, accepted


class TableBackend(StateBackend):
    """`table` (testing only): scores trees by looking up a `LogitTable` instead of running the model.

    Exact for the first `table.depth` generated tokens of requests whose prompt is the table's prompt,
    and free, so end-to-end law checks of drafter x tree x verifier combinations can afford tens of
    thousands of requests. Hidden states come from the table too (zeros where it has none).
    """

    name = "table"
    capabilities = BackendCapabilities(supports_trees=True, provides_hidden_states=True,
                                       fresh_state_per_copy=True)  # prefill assigns a new context

    def __init__(self, target, *, table: LogitTable, want_hidden: bool = False):
        super().__init__(target, want_hidden=want_hidden)
        self.table = table
        size = next(iter(table.hidden.values())).shape[-1] if table.hidden else 1
        self.no_hidden = torch.zeros(size)
        self.ctx: tuple[int, ...] = ()
        self._length = 0

    @property
    def committed_length(self) -> int:
        return self._length

    def prefill(self, ids: list[int]) -> None:
        self.ctx, self._length = (), len(ids) - 1

    def score(self, tree: TokenTree) -> TargetScores:
        ctxs = [self.ctx] + [self.ctx + spelled(tree, i) for i in range(len(tree))]
        hidden = None
        if self.want_hidden:
            found = self.table.hidden or {}
            hidden = torch.stack([found.get(c, self.no_hidden) for c in ctxs])  # (N + 1, H)
        logits = torch.stack([self.table(c) for c in ctxs])  # (N + 1, V)
        return self.issue(TargetScores(logits=logits, hidden=hidden, tree=tree))

    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        self.redeem(scored)
        self.ctx += spelled(scored.tree, path[-1]) if path else ()
        self.ctx += (int(bonus),)
        self._length += 1 + len(path)
