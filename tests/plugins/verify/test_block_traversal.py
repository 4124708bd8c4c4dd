"""`block` and `traversal`: lossless, shown two ways, with mutants that must fail; the same steps on a
chain; at least `rejection`'s acceptance; capabilities that refuse what they cannot verify.

1. Exact enumeration: on a target with 4 tokens, every random choice of one step (each draft draw and
   each acceptance coin and bonus draw of the verifier) is enumerated, which gives the exact law of what
   the verifier's code emits. Lossless means: for every k, given the first k - 1 emitted tokens and that
   a k-th is emitted, the k-th is distributed as the target's row there. Checked to 1e-6 (float32
   rounding) for chains, i.i.d. tries, raw streams with repeats and drafts without replacement; each
   mutant breaks it by far.
2. The exact-law harness (`specframe.testing.law`): 20,000 seeded decodes per scenario against the exact
   law at p >= 1e-4, and each mutant rejected at p < 1e-6 in the scenario aimed at it (with fewer
   decodes where it is caught by far).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lossless_mutants import MutantTraversal

from specframe import (
    CapabilityError, DraftProposal, DrawMethod, Sampler, SamplingParams, SpecframeError, SpeculativeDecoder,
    TargetScores, TokenTree,
)
from specframe.plugging.registry import get_registry
from specframe.testing.drafts import adversarial_q, fixed_q, model_q
from specframe.testing.exact import P_CATCH, P_PASS, LogitTable
from specframe.testing.law import FILTERED, HOT, RUNS, verifier_scenarios

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

NAMES = ("block", "traversal")


def verifier(name: str):
    return get_registry().get("verifier", name)()


# --- 1. exact enumeration of the code's own law ------------------------------------------------------------

class Unscripted(Exception):
    """The run reached a choice its script does not fix; `options` is how many it has."""

    def __init__(self, options: int):
        self.options = options


class Script:
    """Random choices read from a script of option indices; `mass` is the probability of the script."""

    def __init__(self, picks: tuple[int, ...]):
        self.picks, self.at, self.mass = picks, 0, 1.0

    def choose(self, options: list[tuple[object, float]]):
        if self.at == len(self.picks):
            raise Unscripted(len(options))
        value, chance = options[self.picks[self.at]]
        self.at += 1
        self.mass *= chance
        return value

    def token(self, row) -> int:
        row = np.asarray(row, np.float64)
        return self.choose([(t, float(row[t] / row.sum())) for t in np.flatnonzero(row > 0).tolist()])


class Coin:
    """What `ScriptedSampler.uniform` returns: `coin < x` (or `coin * scale < x`, as `rejection` writes
    it) is a scripted choice, true with probability min(1, x / scale)."""

    def __init__(self, script: Script, scale: float = 1.0):
        self.script, self.scale = script, scale

    def __mul__(self, scale):
        return Coin(self.script, self.scale * float(scale))

    def __lt__(self, x):
        chance = min(1.0, max(0.0, float(x) / self.scale))
        if chance in (0.0, 1.0):
            return chance == 1.0
        return self.script.choose([(True, chance), (False, 1 - chance)])


class ScriptedSampler(Sampler):
    """A `Sampler` whose uniforms and draws are scripted choices: running a verifier under every script
    enumerates its outcomes with their exact probabilities."""

    def __init__(self, params: SamplingParams, script: Script):
        super().__init__(params)
        self.script = script

    def uniform(self):
        return Coin(self.script)

    def draw(self, probs: torch.Tensor) -> int:
        return self.script.token(probs.double().numpy())


def enumerate_runs(run) -> dict:
    """{outcome: probability} of `run(script)` over every script (depth first)."""
    law: dict = defaultdict(float)
    pending = [()]
    while pending:
        picks = pending.pop()
        script = Script(picks)
        try:
            outcome = run(script)
        except Unscripted as more:
            pending.extend(picks + (i,) for i in range(more.options))
            continue
        law[outcome] += script.mass
    return law


# Draft shapes as scripted programs: (q function, context, script) -> DraftProposal with its q rows.
def chain(length):
    def propose(q, ctx, script):
        seq: list[int] = []
        for _ in range(length):
            seq.append(script.token(q(ctx + tuple(seq))))
        return labelled(DraftProposal.from_sequences([seq]), q, ctx, DrawMethod.SAMPLED)
    return propose


def iid_trie(count, length):
    def propose(q, ctx, script):
        seqs = []
        for _ in range(count):
            seq: list[int] = []
            for _ in range(length):
                seq.append(script.token(q(ctx + tuple(seq))))
            seqs.append(seq)
        return labelled(DraftProposal.from_sequences(seqs), q, ctx, DrawMethod.SAMPLED)
    return propose


def raw_stream(count):
    def propose(q, ctx, script):
        firsts = [script.token(q(ctx)) for _ in range(count)]
        tokens = firsts + [script.token(q(ctx + (t,))) for t in firsts]
        proposal = DraftProposal(np.array(tokens), np.array([-1] * count + list(range(count))),
                                 np.zeros(2 * count))
        return labelled(proposal, q, ctx, DrawMethod.SAMPLED)
    return propose


def without_replacement(widths):
    def propose(q, ctx, script):
        tokens, parents, frontier = [], [], [(-1, ())]
        for width in widths:
            nxt = []
            for parent, path in frontier:
                row = np.array(q(ctx + path), np.float64)
                for _ in range(min(width, int(np.count_nonzero(row)))):
                    token = script.token(row)
                    row[token] = 0
                    tokens.append(token), parents.append(parent)
                    nxt.append((len(tokens) - 1, path + (token,)))
            frontier = nxt
        proposal = DraftProposal(np.array(tokens), np.array(parents), np.zeros(len(tokens)))
        return labelled(proposal, q, ctx, DrawMethod.SAMPLED_WITHOUT_REPLACEMENT)
    return propose


def labelled(proposal: DraftProposal, q, ctx, draw: DrawMethod) -> TokenTree:
    rows = [q(ctx + spelled(proposal, int(p))) for p in proposal.parents]
    proposal.draft_probs = torch.tensor(np.array(rows)).float()  # (N, V) as drafters report it
    proposal.draw = draw
    return TokenTree.from_proposal(proposal, np.arange(len(proposal)), draw_order_prefix=True)


def spelled(forest, node: int) -> tuple[int, ...]:
    return tuple(int(forest.tokens[i]) for i in forest.path_to(node)) if node >= 0 else ()


SMALL = LogitTable.random(4, 3, seed=3, scale=1.5)  # 4 tokens, every context of up to 2 tokens
SMALL_DRAFT = LogitTable.random(4, 3, seed=4, scale=1.5)
SHAPES = {
    "chain of 3": chain(3),
    "2 i.i.d. sequences of 2 merged into a trie": iid_trie(2, 2),
    "raw i.i.d. stream of 2 with repeats": raw_stream(2),
    "without replacement 2x2": without_replacement((2, 2)),
}
QS = {"draft model": model_q(SMALL_DRAFT), "adversarial": adversarial_q(SMALL),
      "skewed": fixed_q([0.7, 0.2, 0.1, 0.0])}


LAWS: dict = {}  # (verifier name, shape, q name, params) -> step_law, shared by the tests below


def named_law(name: str, shape: str, q: str, params: SamplingParams) -> dict:
    key = (name, shape, q, params)
    if key not in LAWS:
        LAWS[key] = step_law(verifier(name).verify, SHAPES[shape], QS[q], params)
    return LAWS[key]


def step_law(verify, shape, q, params: SamplingParams, ctx=()) -> dict:
    """{emitted tokens: probability} of one step at `ctx`: draft with `shape`, verify with `verify`."""
    def run(script):
        tree = shape(q, ctx, script)
        rows = [SMALL(ctx)] + [SMALL(ctx + spelled(tree, i)) for i in range(len(tree))]
        result = verify(tree, TargetScores(logits=torch.stack(rows)), ScriptedSampler(params, script))
        return tuple(int(t) for t in tree.tokens[result.path]) + (int(result.bonus),)
    return enumerate_runs(run)


def law_error(law: dict, params: SamplingParams, ctx=()) -> float:
    """The largest violation of: P(emits >= k tokens, first k = z) = P(emits >= k, first k-1 = z[:-1]) *
    p(z[-1] | ctx + z[:-1]), over every k and z (lossless, token by token)."""
    sampler = Sampler(params)
    reach: dict = defaultdict(float)  # (z1 .. zk) -> P(emits >= k tokens and they start with z)
    for emitted, mass in law.items():
        for k in range(1, len(emitted) + 1):
            reach[emitted[:k]] += mass
    before: dict = defaultdict(float)  # (z1 .. z_{k-1}) -> P(emits >= k tokens and they start with it)
    for z, mass in reach.items():
        before[z[:-1]] += mass
    worst = abs(sum(law.values()) - 1)
    for z in set(reach) | {prefix + (t,) for prefix in before for t in range(SMALL.vocab)}:
        p = sampler.probs(SMALL(ctx + z[:-1])).double()[z[-1]].item()
        worst = max(worst, abs(reach.get(z, 0.0) - before[z[:-1]] * p))
    return worst


EXACT = 1e-6  # float32 rows (as drafters and `Sampler.probs` give them) round at ~1e-8


# `block` hands branching trees to `traversal`: it is enumerated on chains
LAW_CASES = ([("traversal", shape, q) for shape in SHAPES for q in QS]
             + [("block", "chain of 3", q) for q in QS])


@pytest.mark.parametrize("name,shape,q", LAW_CASES, ids=str)
def test_the_exact_law_of_the_code_is_the_target_law(name, shape, q):
    for params in (HOT, FILTERED):
        error = law_error(named_law(name, shape, q, params), params)
        assert error < EXACT, f"{name}, {shape}, q {q}, {params}: off by {error:.3g}"


MUTANT_SHAPES = {  # each fault with a draft shape where it matters
    "residual-from-child-row": "chain of 3",
    "weight-not-joint": "chain of 3",
    "kept-with-old-weight": "chain of 3",
    "bonus-from-p": "chain of 3",
    "q-not-renormalised": "without replacement 2x2",
}


@pytest.mark.parametrize("fault", MUTANT_SHAPES)
def test_each_mutant_breaks_the_exact_law(fault):
    error = law_error(step_law(MutantTraversal(fault).verify, SHAPES[MUTANT_SHAPES[fault]], QS["draft model"],
                               HOT), HOT)
    assert error > 1e-3, f"mutant {fault} is off by only {error:.3g}"


def test_the_enumeration_passes_rejection_and_fails_a_mutant_on_one_draft():
    """The check of this file is neither too strict nor blind: `rejection` passes it, and a bonus drawn
    from the target row instead of the residual fails it on the simplest tree (one draft)."""
    shape = chain(1)
    for name in ("rejection", "traversal"):
        assert law_error(step_law(verifier(name).verify, shape, QS["adversarial"], HOT), HOT) < EXACT
    mutant = MutantTraversal("bonus-from-p").verify
    assert law_error(step_law(mutant, shape, QS["adversarial"], HOT), HOT) > 1e-3


# --- 2. the exact-law harness: 20,000 seeded decodes per scenario ------------------------------------------

SCENARIOS = {s.name: s for s in verifier_scenarios(sampled=True)}
CHAIN = "chain of 2 sampled drafts (Leviathan)"


# `block` on a chain makes traversal's decisions from the same uniforms (the hypothesis test below), and
# on a tree without usable q it is `sample-match` with the same uniforms
# (test_trees_without_usable_q_are_sampled_and_matched_and_say_so): traversal's runs of these scenarios
# check its law too, so CI runs block's own only with SPECFRAME_EXHAUSTIVE=1.
IMPLIED = pytest.mark.exhaustive


@pytest.mark.parametrize("name,case", [pytest.param("block", CHAIN, marks=IMPLIED),
                                       pytest.param("block", "retrieved tree, no q", marks=IMPLIED)]
                         + [("traversal", case) for case in SCENARIOS], ids=str)
def test_follows_the_target_law(name, case):
    result = SCENARIOS[case].run(verifier(name), RUNS)
    assert result.pvalue >= P_PASS, f"{name}, {case}: {result}"


# (fault, scenario, decodes): a mutant caught by far runs fewer decodes than RUNS, as many as keep its
# chi-square at least five times the one that gives p = P_CATCH on its degrees of freedom.
STATISTICAL_MUTANTS = [
    ("residual-from-child-row", CHAIN, 2000), ("weight-not-joint", CHAIN, 2000),
    ("kept-with-old-weight", CHAIN, RUNS), ("bonus-from-p", CHAIN, 5000),
    ("q-not-renormalised", "4 i.i.d. sequences merged into a trie", 5000),
]


@pytest.mark.parametrize("fault,case,runs", STATISTICAL_MUTANTS, ids=str)
def test_mutant_is_caught_by_the_harness(fault, case, runs):
    result = SCENARIOS[case].run(MutantTraversal(fault), runs)
    assert result.pvalue < P_CATCH, f"mutant traversal '{fault}' was not caught in '{case}': {result}"


# --- the same steps on a chain; acceptance against rejection --------------------------------------------

@st.composite
def sampled_chains(draw, vocab=6):
    length = draw(st.integers(0, 5))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    q = torch.softmax(2 * torch.randn(length, vocab, generator=gen), -1)  # (N, V)
    tokens = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(length)]
    proposal = DraftProposal(np.array(tokens, np.int64), np.arange(length) - 1, np.zeros(length),
                             draft_probs=q, draw=DrawMethod.SAMPLED)
    tree = TokenTree.from_proposal(proposal, np.arange(length), draw_order_prefix=True)
    logits = 2 * torch.randn(length + 1, vocab, generator=gen)  # (N + 1, V)
    return tree, TargetScores(logits=logits)


@settings(max_examples=60, deadline=None)
@given(case=sampled_chains(), seed=st.integers(0, 1000))
def test_traversal_on_a_chain_is_block_verification_uniform_for_uniform(case, seed):
    """Two implementations (block's forward weights then longest prefix first; traversal's depth-first
    walk) make the same decisions from the same uniforms on every chain."""
    tree, scores = case
    params = SamplingParams(temperature=1.0, seed=seed)
    block, traversal = (verifier(name).verify(tree, scores, Sampler(params)) for name in NAMES)
    assert (block.path, block.bonus) == (traversal.path, traversal.bonus)


def expected_accepted(name: str, shape: str, q: str) -> float:
    return sum(mass * (len(emitted) - 1) for emitted, mass in named_law(name, shape, q, HOT).items())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_accepts_at_least_as_many_drafts_as_rejection_and_more_with_a_good_draft(shape):
    """Exact expected accepted drafts per step: `traversal` never below `rejection` on these drafts, and
    above it with the draft model's q (every shape here is at least two drafts deep)."""
    for q in QS:
        ours, theirs = expected_accepted("traversal", shape, q), expected_accepted("rejection", shape, q)
        assert ours >= theirs - 1e-9, f"{shape}, q {q}: traversal {ours:.4f} < rejection {theirs:.4f}"
        if q == "draft model":
            assert ours > theirs + 1e-4, (
                f"{shape}: traversal {ours:.4f} is no better than rejection {theirs:.4f}")


# --- fallbacks, capabilities, bad input (temperature 0: test_verifiers.py) ------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_trees_without_usable_q_are_sampled_and_matched_and_say_so(name):
    """A tree whose drafts are no draws from q is verified as `sample-match` verifies it, with the same
    uniforms, and the result names why."""
    proposal = DraftProposal.from_sequences([[1, 2], [3], [1, 4]])
    proposal.draft_probs = torch.full((4, 8), 1 / 8)
    proposal.draw = DrawMethod.SAMPLED
    tree = TokenTree.from_proposal(proposal, [0, 1, 2, 3])  # no draw-order prefix: RETRIEVED
    scores = TargetScores(logits=torch.randn(5, 8, generator=torch.Generator().manual_seed(0)))
    for seed in range(20):
        ours = verifier(name).verify(tree, scores, Sampler(SamplingParams(temperature=1.0, seed=seed)))
        theirs = verifier("sample-match").verify(tree, scores,
                                                 Sampler(SamplingParams(temperature=1.0, seed=seed)))
        assert (ours.path, ours.bonus, ours.fallback) == (theirs.path, theirs.bonus,
                                                          "not sampled in draw order")


@pytest.mark.parametrize("name", NAMES)
def test_refuses_a_draft_token_its_q_could_not_have_drawn(name):
    proposal = DraftProposal(np.array([2]), np.array([-1]), np.zeros(1),
                             draft_probs=torch.tensor([[0.5, 0.5, 0.0, 0.0]]), draw=DrawMethod.SAMPLED)
    tree = TokenTree.from_proposal(proposal, [0], draw_order_prefix=True)
    with pytest.raises(SpecframeError, match=f"'{name}'.*draft probability 0"):
        verifier(name).verify(tree, TargetScores(torch.zeros(2, 4)), Sampler(HOT))


def test_capabilities_are_declared():
    for name in NAMES:
        caps = get_registry().get("verifier", name).capabilities
        assert caps.lossless and caps.supports_sampling and caps.needs_draft_probs and caps.uses_draft_probs
        assert not caps.matches_draws


@pytest.fixture(scope="module")
def target():
    from specframe.testing.targets import tiny_target

    return tiny_target(seed=0, vocab_size=32)


HOT_SEEDED = SamplingParams(temperature=0.7, seed=0)


@pytest.mark.parametrize("name", NAMES)
def test_the_registry_refuses_what_they_cannot_verify_losslessly(target, name):
    with pytest.raises(CapabilityError, match=f"verifier '{name}' needs draft probabilities.*'pld'"):
        SpeculativeDecoder.from_names(target, "pld", "chain", name, sampling=HOT_SEEDED)
    with pytest.raises(CapabilityError, match="tree builder 'beam' chooses among the drafts"):
        SpeculativeDecoder.from_names(target, "draft-model(layers=1, topk=2)", "beam", name,
                                      sampling=HOT_SEEDED)
    SpeculativeDecoder.from_names(target, "draft-model(layers=1, topk=2)", "trie", name, sampling=HOT_SEEDED)


@pytest.mark.parametrize("name,tree", [("block", "chain"), ("traversal", "trie")])
def test_decodes_with_q_without_fallback(target, name, tree):
    decoder = SpeculativeDecoder.from_names(target, "draft-model(layers=1, topk=2)", tree, name,
                                            sampling=HOT_SEEDED, budget=4)
    metrics = decoder.generate([5, 6, 7, 8, 9, 5, 6, 7], max_new_tokens=24).metrics
    assert metrics.fallback_steps == 0 and metrics.draft_tokens > 0
