"""End to end through `SpeculativeDecoder`: every registered drafter x tree builder x lossless sampling
verifier that assembles at temperature > 0 (enumerated from the registry, with each drafter's
`example_options`) emits its first two tokens with exactly the target's law.

The target is a tiny random Llama with a vocabulary of 8; its logits after the prompt and after every
one-token continuation are tabulated once (`LogitTable.from_target`), which gives the exact law of the
first two tokens. Runs score trees with the `TableBackend` (the same logits, looked up) so that many
thousands of requests fit in CI; two combinations run on the real `kv` backend as well.

Two kinds of combination:
- where the verifier uses the drafter's q (`rejection` with a drafter that samples its drafts), the
  first two tokens of 3,000 seeded requests (T = 1) and 2,000 (T = 0.7, top-p 0.9) are tested against the
  exact law (CI runs a pairwise sample of these, PAIRWISE; SPECFRAME_EXHAUSTIVE=1 runs them all);
- everywhere else each emitted token is one draw from the target with the request's generator, so every
  request must emit exactly the tokens plain sampling (drafter `none`) emits with the same seed: checked
  token for token on 300 seeds, a stronger check than any test of the law, whose own law is tested on
  10,000 seeds (CI runs one verifier and budget per drafter and tree, `replay_cases`).
A mutant tree builder run the same way shows that the end-to-end law test can fail. Every combination runs
twice: with a fixed budget, and with `budget="auto:3"` (adaptive speculation, under a cost model that makes
trees worth scoring), whose choices must not change the law either; a mutant planner that judges sampled
drafts by their scores is run where its choice matters, and must fail there. A decoder whose `sampling` is
set to T > 0 after a greedy first request must follow the law too, and refuse what T > 0 refuses.
"""

from __future__ import annotations

import itertools

import pytest
from lossless_mutants import ByScoreChain, ByScorePlanner

from specframe import Pipeline, PolynomialCost, SamplingParams, SpeculativeDecoder
from specframe.terms.errors import CapabilityError
from specframe.plugging.pipeline import check_compatible
from specframe.plugging.registry import get_registry
from specframe.testing.exact import (
    P_CATCH, P_PASS, LogitTable, TableBackend, decoder_counts, exact_law, law_test,
)
from specframe.testing.targets import tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # repeats, so copying drafters find matches
DEPTH, BUDGET, MAX_NEW = 2, 3, 4  # law of 2 tokens; the first step has room for a 3-node tree
HOT = SamplingParams(temperature=1.0)
FILTERED = SamplingParams(temperature=0.7, top_p=0.9)
RUNS_HOT, RUNS_FILTERED, RUNS_REPLAY, RUNS_PLAIN = 3000, 2000, 300, 10_000
BUDGETS = (BUDGET, f"auto:{BUDGET}")
CHEAP_NODES = PolynomialCost((0.01, 1.0))  # a node costs 1 % of a step: adaptive trees keep most drafts
# A node costs 30 % of a step: a planner that judged sampled drafts by their drawn tokens' scores would keep
# a one-node tree about as often as it cuts it, and whether it keeps it would depend on the token drawn
SELECTIVE = PolynomialCost((0.3, 1.0))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target = tiny_target(seed=0, vocab_size=8)
    return target, LogitTable.from_target(target, PROMPT, DEPTH), str(tmp_path_factory.mktemp("examples"))


def combinations():
    """(drafter, tree, verifier, uses_q) for every combination that assembles while sampling."""
    registry = get_registry()
    target = tiny_target(seed=0, vocab_size=8)
    out = []
    for d, t, v in itertools.product(*(registry.names(k) for k in ("drafter", "tree builder", "verifier"))):
        classes = [registry.get(kind, name) for kind, name in
                   (("drafter", d), ("tree builder", t), ("verifier", v))]
        caps = classes[2].capabilities
        if not (caps.lossless and caps.supports_sampling):
            continue
        try:
            check_compatible(target, *classes, TableBackend, HOT)
        except CapabilityError:
            continue
        out.append((d, t, v, caps.uses_draft_probs and classes[0].capabilities.samples_drafts))
    return out


COMBINATIONS = combinations()


def decoder(setup, drafter: str, tree, verifier: str, backend=None, budget=BUDGET, cost=CHEAP_NODES,
            **options) -> SpeculativeDecoder:
    target, table, workdir = setup
    registry = get_registry()
    d_cls = registry.get("drafter", drafter)
    tree = registry.get("tree builder", tree)() if isinstance(tree, str) else tree
    backend = backend or TableBackend(target, table=table, want_hidden=d_cls.capabilities.needs_hidden_states)
    pipeline = Pipeline(d_cls(target, **{**d_cls.example_options(target, workdir), **options}), tree,
                        registry.get("verifier", verifier)(), backend)
    return SpeculativeDecoder(target, pipeline, budget=budget, cost=cost)


# CI runs a sample of the drafter x tree x sampling x budget cross product, the rest when
# SPECFRAME_EXHAUSTIVE=1 (about 25 CPU minutes more). PAIRWISE: six (drafter, tree, sampling, budget) rows
# in which every pair of values of two factors occurs at least once (each drafter with each tree, each
# tree with each sampling and each budget, ...), so every code path of one factor runs next to every
# value of another. Rejection runs these six rows; block and traversal, whose laws the verifier tests
# check exactly (tests/plugins/verify/test_block_traversal.py), run the rows on the trees each is built
# for (SAMPLED).
PAIRWISE = {("draft-model", "chain", HOT, BUDGET), ("draft-model", "trie", FILTERED, f"auto:{BUDGET}"),
            ("draft-model", "static", HOT, f"auto:{BUDGET}"), ("s4c", "chain", FILTERED, f"auto:{BUDGET}"),
            ("s4c", "trie", HOT, BUDGET), ("s4c", "static", FILTERED, BUDGET)}
SAMPLED = {"block": {"chain"}, "traversal": {"static", "trie"}}


def _uses_q_case(d, t, v, params, runs, b):
    exhaustive = (d, t, params, b) not in PAIRWISE or v in SAMPLED and t not in SAMPLED[v]
    return pytest.param(d, t, v, params, runs, b, marks=[pytest.mark.exhaustive] if exhaustive else [],
                        id=f"{d}+{t}+{v}-T{params.temperature}-p{params.top_p}@{b}")


USES_Q = [_uses_q_case(d, t, v, params, runs, b) for d, t, v, uses_q in COMBINATIONS if uses_q
          for params, runs in ((HOT, RUNS_HOT), (FILTERED, RUNS_FILTERED)) for b in BUDGETS]
REPLAYS = [(d, t, v, b) for d, t, v, uses_q in COMBINATIONS if not uses_q for b in BUDGETS]


def replay_cases() -> list:
    """REPLAYS as parameters: CI runs one (verifier, budget) per drafter and tree, the rest are exhaustive.

    The k-th tree of the i-th drafter runs its (i + k)-th (verifier, budget) pair, round the ones it has:
    a drafter with four trees or more runs every pair, and every tree runs with each pair across the
    drafters."""
    drafters = list(dict.fromkeys(d for d, _, _, _ in REPLAYS))
    trees: dict = {}
    for d, t, v, b in REPLAYS:
        trees.setdefault(d, {}).setdefault(t, []).append((v, b))
    chosen = {(d, t, *pairs[(drafters.index(d) + k) % len(pairs)])
              for d in drafters for k, (t, pairs) in enumerate(trees[d].items())}
    return [pytest.param(d, t, v, b, id=f"{d}+{t}+{v}@{b}",
                         marks=[] if (d, t, v, b) in chosen else [pytest.mark.exhaustive])
            for d, t, v, b in REPLAYS]


@pytest.mark.parametrize("drafter,tree,verifier,params,runs,budget", USES_Q)
def test_combinations_that_use_q_follow_the_target_law(setup, drafter, tree, verifier, params, runs, budget):
    _, table, _ = setup
    run = decoder(setup, drafter, tree, verifier, budget=budget)
    counts, accepted = decoder_counts(run, PROMPT, DEPTH, runs, params, MAX_NEW)
    result = law_test(counts, exact_law(table, params))
    assert result.pvalue >= P_PASS, f"{drafter}+{tree}+{verifier} at {params}: {result}"
    assert accepted > runs / 10, f"{drafter}+{tree}+{verifier}: drafts were hardly accepted ({accepted})"


@pytest.fixture(scope="module")
def plain_tokens(setup):
    """Seed -> the tokens plain sampling (drafter `none`) emits, at T = 1."""
    run = decoder(setup, "none", "chain", "sample-match")
    out = {}
    for seed in range(RUNS_REPLAY):
        run.sampling = SamplingParams(HOT.temperature, seed=seed)
        out[seed] = run.generate(PROMPT, max_new_tokens=MAX_NEW).tokens
    return out


def test_plain_sampling_follows_the_target_law(setup):
    _, table, _ = setup
    plain = decoder(setup, "none", "chain", "sample-match")
    counts, _ = decoder_counts(plain, PROMPT, DEPTH, RUNS_PLAIN, HOT)
    result = law_test(counts, exact_law(table, HOT))
    assert result.pvalue >= P_PASS, f"plain sampling: {result}"


@pytest.mark.parametrize("drafter,tree,verifier,budget", replay_cases())
def test_other_combinations_replay_plain_sampling_token_for_token(setup, plain_tokens, drafter, tree,
                                                                  verifier, budget):
    run = decoder(setup, drafter, tree, verifier, budget=budget)
    accepted = scored = 0
    for seed, expected in plain_tokens.items():
        run.sampling = SamplingParams(HOT.temperature, seed=seed)
        result = run.generate(PROMPT, max_new_tokens=MAX_NEW)
        assert result.tokens == expected, f"{drafter}+{tree}+{verifier}, seed {seed}"
        accepted += result.metrics.accepted_draft_tokens
        scored += result.metrics.draft_tokens
    if drafter != "none":  # adaptive trees may rightly drop drafts that are hardly ever accepted
        tested = scored > 0 if run.adaptive else accepted > 0
        assert tested, f"{drafter}+{tree}+{verifier}@{budget}: no draft was ever accepted or scored"


def test_every_drafter_tree_and_sampling_verifier_is_covered():
    registry = get_registry()
    covered = {(d, t, v) for d, t, v, _ in COMBINATIONS}
    assert {d for d, _, _ in covered} == set(registry.names("drafter"))
    assert {v for _, _, v in covered} >= {"sample-match", "rejection"}
    assert {("draft-model", t, "rejection") for t in ("chain", "trie", "static")} <= covered
    assert ("draft-model", "beam", "rejection") not in covered  # refused: beam picks sampled drafts by score


# s4c drafts in bfloat16 by default where the CPU has it, else in float32: both run here on any CPU.
@pytest.mark.parametrize("drafter,tree,options", [("draft-model", "chain", {}), ("s4c", "static", {}),
                                                  ("s4c", "static", {"dtype": "bfloat16"}),
                                                  ("s4c", "static", {"dtype": "target"})])
def test_real_kv_backend_follows_the_target_law(setup, drafter, tree, options):
    target, table, _ = setup
    kv = get_registry().get("backend", "kv")
    needs_hidden = get_registry().get("drafter", drafter).capabilities.needs_hidden_states
    run = decoder(setup, drafter, tree, "rejection", kv(target, want_hidden=needs_hidden), **options)
    counts, accepted = decoder_counts(run, PROMPT, DEPTH, 1000, FILTERED, MAX_NEW)
    result = law_test(counts, exact_law(table, FILTERED))
    assert result.pvalue >= P_PASS and accepted > 0, f"{drafter}{options}+{tree}+rejection on kv: {result}"


# A planner that keeps or cuts sampled drafts by their drawn tokens' scores keeps nearly every node at
# CHEAP_NODES, and at auto:3 at SELECTIVE costs it always cuts (a cut tree is verified by sample-and-match,
# which is lossless), so it passes there: every drafter and sampling that uses q is run again where that
# choice is made at every step, a one-node cap at SELECTIVE costs, and there the mutant must fail by far
# while the real planner passes. With one node every draw-order builder keeps the first-drawn child, so
# `chain` stands for `trie` and `static` (their runs are the same, seed for seed).
CAUGHT_BY_FAR, RUNS_SELECTIVE = 1e-12, 1000
SELECTIVE_CASES = [pytest.param(d, v, params, id=f"{d}+{v}-T{params.temperature}-p{params.top_p}",
                                marks=[pytest.mark.exhaustive] if v in SAMPLED and params is FILTERED else [])
                   for d, v, params in dict.fromkeys((d, v, params) for d, _, v, params, _, b in
                                                     (case.values for case in USES_Q) if b != BUDGET)]


@pytest.mark.parametrize("drafter,verifier,params", SELECTIVE_CASES)
def test_a_planner_that_cuts_sampled_drafts_by_score_is_caught_where_the_real_one_passes(
        setup, drafter, verifier, params):
    _, table, _ = setup
    law = exact_law(table, params)
    results = {}
    for name in ("real", "by score"):
        run = decoder(setup, drafter, "chain", verifier, budget="auto:1", cost=SELECTIVE)
        if name == "by score":
            run.planner = ByScorePlanner.for_decoder(run)
        counts, _ = decoder_counts(run, PROMPT, DEPTH, RUNS_SELECTIVE, params, MAX_NEW)
        results[name] = law_test(counts, law)
    label = f"{drafter}+chain+{verifier} at {params}"
    assert results["real"].pvalue >= P_PASS, f"{label}, real planner: {results['real']}"
    assert results["by score"].pvalue < CAUGHT_BY_FAR, f"{label}, mutant planner: {results['by score']}"


# --- sampling set after the decoder's first request ------------------------------------------------------

SWITCHES = [("draft-model", "chain", {"num_tokens": 1}, "auto:1"),
            ("s4c", "static", {"draw": "sample"}, "auto:1")]


@pytest.mark.parametrize("drafter,tree,options,budget", SWITCHES,
                         ids=[f"{d}+{t}@{b}" for d, t, _, b in SWITCHES])
def test_sampling_set_after_a_greedy_first_request_follows_the_target_law(setup, drafter, tree, options,
                                                                          budget):
    """The decoder serves a greedy request first (which makes its planner), then its `sampling` is set to
    T = 1: every request is planned by its own sampling, so the sampled trees are not pruned by score."""
    _, table, _ = setup
    run = decoder(setup, drafter, tree, "rejection", budget=budget, cost=SELECTIVE, **options)
    run.generate(PROMPT, max_new_tokens=MAX_NEW)  # greedy
    counts, accepted = decoder_counts(run, PROMPT, DEPTH, RUNS_HOT, HOT, MAX_NEW)
    result = law_test(counts, exact_law(table, HOT))
    assert result.pvalue >= P_PASS, f"{drafter}{options}+{tree}@{budget} after a greedy request: {result}"
    assert accepted > RUNS_HOT / 10, f"{drafter}+{tree}: drafts were hardly accepted ({accepted})"


@pytest.mark.parametrize("drafter,tree,verifier,match", [
    ("draft-model(layers=1)", "beam", "rejection", "chooses among"),
    ("pld", "chain", "greedy", "greedy only")])
def test_a_pairing_refused_while_sampling_is_refused_after_sampling_is_switched_on(setup, drafter, tree,
                                                                                  verifier, match):
    run = SpeculativeDecoder.from_names(setup[0], drafter, tree, verifier, budget=BUDGET)  # greedy: fits
    run.generate(PROMPT, max_new_tokens=MAX_NEW)
    run.sampling = HOT
    with pytest.raises(CapabilityError, match=match):
        run.generate(PROMPT, max_new_tokens=MAX_NEW)
    run.sampling = SamplingParams()
    run.generate(PROMPT, max_new_tokens=MAX_NEW)  # greedy again: fits again


def test_a_builder_that_picks_sampled_drafts_by_score_is_caught_end_to_end(setup):
    _, table, _ = setup
    run = decoder(setup, "draft-model", ByScoreChain(), "rejection")
    counts, _ = decoder_counts(run, PROMPT, DEPTH, RUNS_HOT, HOT, MAX_NEW)
    result = law_test(counts, exact_law(table, HOT))
    assert result.pvalue < P_CATCH, f"the mutant builder passed end to end: {result}"
