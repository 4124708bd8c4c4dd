"""Exact-distribution harness for sampling verifiers: a tabulated tiny target, test drafters with a real
draft distribution q, a fake decode loop that calls a verifier directly, and a chi-square test.

The target is a tiny random Llama with a small vocabulary. Its logits after every context of up to
`depth - 1` generated tokens are computed once, so the exact distribution of the first `depth` generated
tokens is a product of `Sampler.probs` rows, and many seeded runs cost no model call. Rows deeper than
that never influence the first `depth` tokens, so they are filled with zeros (a uniform target).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import numpy as np
import torch

from specframe import (
    DraftContext, DraftProposal, Drafter, DrafterCapabilities, DrawMethod, Sampler, SamplingParams, Target,
    TargetScores, TokenTree, TreeBuilder,
)


def tiny_target(seed: int, vocab: int = 12, sharpen: float = 3.0) -> Target:
    """A random 2-layer Llama; `sharpen` scales the output layer so distributions are far from uniform."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return Target(model=model, tokenizer=None, name=f"tiny-llama-v{vocab}-{seed}")


class LogitTable:
    """Next-token logits of `target` after `prompt + ctx` for every ctx of length < `depth`."""

    def __init__(self, target: Target, prompt: list[int], depth: int):
        self.vocab, self.depth = target.vocab_size, depth
        self.rows: dict[tuple[int, ...], torch.Tensor] = {}
        with torch.inference_mode():
            for length in range(depth):
                contexts = list(itertools.product(range(self.vocab), repeat=length))
                ids = torch.tensor([prompt + list(c) for c in contexts])  # (C, P + length)
                logits = target.model(input_ids=ids).logits[:, -1].float()  # (C, V)
                self.rows.update(zip(contexts, logits))
        self.filler = torch.zeros(self.vocab)

    def __call__(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return self.rows.get(ctx, self.filler)  # (V,)


def exact_distribution(table: LogitTable, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first `table.depth` generated tokens) under the processed target distribution."""
    sampler = Sampler(params)
    probs = {ctx: sampler.probs(row).double().numpy() for ctx, row in table.rows.items()}
    result = {}
    for seq in itertools.product(range(table.vocab), repeat=table.depth):
        mass = 1.0
        for i in range(table.depth):
            mass *= probs[seq[:i]][seq[i]]
            if mass == 0:
                break
        if mass > 0:
            result[seq] = mass
    return result


# --- test drafters: ctx -> DraftProposal, drawing children from q exactly as the DrawMethod says ------

QFunction = Callable[[tuple[int, ...]], np.ndarray]  # ctx -> (V,) float64 draft distribution


def model_q(table: LogitTable, temperature: float = 1.0) -> QFunction:
    """q from another model's logit table (a tiny random draft model); uniform where it has no row."""
    return _memoized(lambda ctx: torch.softmax(table(ctx).double() / temperature, -1).numpy())


def adversarial_q(target_table: LogitTable, power: float = 2.0) -> QFunction:
    """q proportional to p^-power: most draft mass on the tokens the target likes least."""
    return _memoized(lambda ctx: torch.softmax(-power * torch.log_softmax(target_table(ctx).double(), -1),
                                               -1).numpy())


def _memoized(q: QFunction) -> QFunction:
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def cached(ctx):
        if ctx not in cache:
            cache[ctx] = q(ctx)
        return cache[ctx]

    return cached


class Drafters:
    """Factories of proposal functions `(ctx, rng) -> DraftProposal` for the fake loop."""

    @staticmethod
    def sampled_sequences(q: QFunction, count: int, length: int) -> Callable:
        """`count` sequences drawn i.i.d. from q, token by token, merged into a trie (SpecInfer-style).

        Siblings appear in order of first draw, duplicates merged: `DrawMethod.SAMPLED`."""

        def propose(ctx, rng):
            sequences = []
            for _ in range(count):
                seq: list[int] = []
                for _ in range(length):
                    dist = q(ctx + tuple(seq))
                    seq.append(int(rng.choice(len(dist), p=dist / dist.sum())))
                sequences.append(seq)
            proposal = DraftProposal.from_sequences(sequences)
            return with_q(proposal, ctx, q, DrawMethod.SAMPLED)

        return propose

    @staticmethod
    def without_replacement(q: QFunction, widths: tuple[int, ...]) -> Callable:
        """widths[d] children per node at depth d, drawn from q without replacement."""

        def propose(ctx, rng):
            tokens, parents = [], []
            frontier = [(-1, ())]
            for width in widths:
                nxt = []
                for parent, path in frontier:
                    dist = q(ctx + path)
                    k = min(width, int(np.count_nonzero(dist)))
                    for tok in rng.choice(len(dist), size=k, replace=False, p=dist / dist.sum()):
                        tokens.append(int(tok))
                        parents.append(parent)
                        nxt.append((len(tokens) - 1, path + (int(tok),)))
                frontier = nxt
            proposal = DraftProposal(np.array(tokens), np.array(parents), np.zeros(len(tokens)))
            return with_q(proposal, ctx, q, DrawMethod.SAMPLED_WITHOUT_REPLACEMENT)

        return propose

    @staticmethod
    def top_k(q: QFunction, widths: tuple[int, ...], draw: DrawMethod = DrawMethod.TOPK) -> Callable:
        """Deterministic: the widths[d] most likely draft tokens per node, with the soft q rows attached.

        `draw` lets a test lie about the draw method (the negative test)."""

        def propose(ctx, rng):
            tokens, parents = [], []
            frontier = [(-1, ())]
            for width in widths:
                nxt = []
                for parent, path in frontier:
                    for tok in np.argsort(-q(ctx + path), kind="stable")[:width]:
                        tokens.append(int(tok))
                        parents.append(parent)
                        nxt.append((len(tokens) - 1, path + (int(tok),)))
                frontier = nxt
            proposal = DraftProposal(np.array(tokens), np.array(parents), np.zeros(len(tokens)))
            return with_q(proposal, ctx, q, draw)

        return propose

    @staticmethod
    def static_tree(tokens: list[int], parents: list[int]) -> Callable:
        """The same retrieved tree every step, no q (a static tree or a stale retrieval)."""

        def propose(ctx, rng):
            return DraftProposal(np.array(tokens), np.array(parents), np.zeros(len(tokens)))

        return propose


def with_q(proposal: DraftProposal, ctx: tuple[int, ...], q: QFunction, draw: DrawMethod) -> DraftProposal:
    """Attach the (N, V) rows q(parent context) to a proposal: row i is what node i was drawn from."""
    rows = [q(ctx + path_tokens(proposal, int(p))) for p in proposal.parents]
    proposal.draft_probs = torch.tensor(np.array(rows), dtype=torch.float32).reshape(len(proposal), -1)
    proposal.draw = draw
    return proposal


def path_tokens(proposal, node: int) -> tuple[int, ...]:
    """Tokens from the root's child down to `node` (empty for the root, -1)."""
    out = []
    while node >= 0:
        out.append(int(proposal.tokens[node]))
        node = int(proposal.parents[node])
    return tuple(out[::-1])


def keep_all(proposal: DraftProposal) -> TokenTree:
    return TokenTree.from_proposal(proposal, np.arange(len(proposal)))


def simulate(verifier, propose: Callable, table: LogitTable, params: SamplingParams, runs: int,
             seed: int = 0, build: Callable[[DraftProposal], TokenTree] = keep_all) -> Counter:
    """Counts of the first `table.depth` tokens over `runs` fake decodes that call `verifier` directly
    on the trees `build` makes of the proposals."""
    sampler = Sampler(SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed))
    rng = np.random.default_rng(seed + 1)
    counts: Counter = Counter()
    for _ in range(runs):
        emitted: tuple[int, ...] = ()
        while len(emitted) < table.depth:
            proposal = propose(emitted, rng)
            tree = build(proposal)
            rows = [table(emitted)] + [table(emitted + path_tokens(tree, i)) for i in range(len(tree))]
            result = verifier.verify(tree, TargetScores(logits=torch.stack(rows)), sampler)  # (N + 1, V)
            emitted += tuple(int(t) for t in tree.tokens[result.path]) + (result.bonus,)
        counts[emitted[: table.depth]] += 1
    return counts


def chi_square_pvalue(counts: Counter, expected: dict, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells expected below `min_expected` are pooled into one.

    Observations outside the support of `expected` make the p-value 0 (an impossible sequence)."""
    if any(seq not in expected for seq in counts):
        return 0.0
    total = sum(counts.values())
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0.0, 0.0
    for seq, prob in expected.items():
        e, o = total * prob, counts.get(seq, 0)
        if e >= min_expected:
            stat += (o - e) ** 2 / e
            cells += 1
        else:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    dof = max(cells - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# --- a real drafter for end-to-end runs through SpeculativeDecoder ------------------------------------

class TinyModelDrafter(Drafter):
    """A drafter with a real draft distribution: a tiny random draft model, q = softmax(logits / T).

    `draw="sampled"`: `count` sequences of `length` tokens drawn i.i.d. from q and merged into a trie;
    `draw="top-k"`: the `count` most likely tokens at the root, each followed by its argmax chain.
    Draws use the drafter's own generator, seeded once at construction and never reset: every request
    gets fresh draws (a drafter replaying the same draws each request would not be sampling from q), and
    a test that builds the drafter with a fixed `seed` is reproducible.
    """

    name = "test-tiny-model"
    capabilities = DrafterCapabilities(provides_draft_probs=True, proposes_trees=True)

    def __init__(self, target: Target, *, draft: Target, count: int = 3, length: int = 3,
                 temperature: float = 1.0, draw: str = "sampled", seed: int = 0):
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
        rows = [seen[path_tokens(proposal, int(p))] for p in proposal.parents]
        proposal.draft_probs = torch.stack(rows)  # (N, V) row i: the q node i was drawn from
        proposal.draw = self.method
        return proposal


class KeepAllTreeBuilder(TreeBuilder):
    """Keeps the first `budget` proposal nodes (a prefix of the draw order, so rejection stays lossless)."""

    name = "test-keep-all"

    def build(self, proposal: DraftProposal, budget: int) -> TokenTree:
        keep = np.arange(min(budget, len(proposal)))
        return TokenTree.from_proposal(proposal, keep, draw_order_prefix=True)
