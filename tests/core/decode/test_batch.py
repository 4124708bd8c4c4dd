"""`SpeculativeDecoder.generate_batch`: rows decoded together equal their requests decoded alone.

Greedy: every row's tokens equal plain greedy decoding of its prompt alone, with prompts of different
lengths, rows ending at their own limits, stop strings and EOS, and rows joining as others end
(continuous batching). Sampling: a row's tokens depend on its own seed only, and the rows' law is the
target's (the exact-law harness, per row), while a mutant builder run as rows is caught. Both for a
backend's own batch and for the row-by-row default.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lossless_mutants import ByScoreChain

from specframe import (
    BackendCapabilities, ConfigurationError, Pipeline, PolynomialCost, PromptError, SamplingParams,
    SpeculativeDecoder,
)
from specframe.contract.interfaces import Drafter
from specframe.decode.adaptive import AdaptivePlanner
from specframe.decode.learning import CutRecord
from specframe.plugging.registry import get_registry
from specframe.terms.proposal import DraftProposal
from specframe.terms.tree import TokenTree
from specframe.testing import checks
from specframe.testing.exact import (
    P_CATCH, P_PASS, LogitTable, TableBackend, decoder_counts, exact_law, law_test,
)
from specframe.testing.targets import reference_greedy, reference_logits, repetitive_prompt, tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

LENGTHS = (9, 20, 35, 48, 16)


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=0)


@pytest.fixture(scope="module")
def prompts(target):
    return [repetitive_prompt(target.vocab_size, n, seed=i) for i, n in enumerate(LENGTHS)]


# A backend's own rows (`kv`: one forward per step), and the default `RowByRow` of a one-sequence backend
# (the example plugin's `recompute`: one copy per row)
BATCHING = {"own": "kv", "row-by-row": "recompute"}


@pytest.mark.parametrize("batching", BATCHING)
@pytest.mark.parametrize("drafter,tree", [("pld", "chain"), ("pld", "trie"), ("suffix", "trie"),
                                          ("none", "chain")])
def test_every_row_equals_plain_greedy_decoding_of_its_prompt_alone(target, prompts, batching, drafter, tree):
    limits = [30, 12, 30, 1, 25]  # each row ends at its own length
    for size in (None, 2):  # all at once, and two at a time with rows joining as others end
        decoder = checks.make_decoder(target, drafter, tree, "greedy", BATCHING[batching], budget=6)
        rows = decoder.generate_batch(prompts, limits, batch_size=size)
        for prompt, limit, row in zip(prompts, limits, rows):
            assert row.tokens == reference_greedy(target, prompt, limit), (drafter, tree, size)
            assert row.finish_reason == "length" and row.metrics.new_tokens == limit


def test_rows_end_at_their_own_stop_strings_and_eos(target, prompts):
    alone = checks.make_decoder(target, "pld", "chain", "greedy", "kv", budget=6)
    texts = [alone.generate(p, max_new_tokens=20).text for p in prompts]
    stop = texts[1][3:6]  # a piece of the second row's answer: it ends there, the others run on
    eos = reference_greedy(target, prompts[2], 20)[7]  # the third row meets it at its 8th token
    config = target.model.generation_config
    config.eos_token_id = eos
    try:
        rows = checks.make_decoder(target, "pld", "chain", "greedy", "kv", budget=6).generate_batch(
            prompts, 20, stop=[stop])
        expected = [checks.make_decoder(target, "pld", "chain", "greedy", "kv", budget=6).generate(
            p, max_new_tokens=20, stop=[stop]) for p in prompts]
    finally:
        config.eos_token_id = None
    assert [r.tokens for r in rows] == [e.tokens for e in expected]
    assert [r.finish_reason for r in rows] == [e.finish_reason for e in expected]
    assert {"stop", "eos"} <= {r.finish_reason for r in rows}


def test_generate_given_a_list_of_prompts_decodes_them_as_a_batch(target, prompts):
    decoder = checks.make_decoder(target, "pld", "chain", "greedy", "kv", budget=6)
    rows = decoder.generate(prompts[:3], max_new_tokens=10)
    assert [r.tokens for r in rows] == [reference_greedy(target, p, 10) for p in prompts[:3]]
    assert decoder.generate(prompts[0], max_new_tokens=10).tokens == rows[0].tokens  # one flat list: one


@pytest.mark.parametrize("batching", BATCHING)
def test_a_rows_sampled_tokens_depend_on_its_own_seed_only(target, prompts, batching):
    hot = SamplingParams(temperature=1.0)
    decoder = checks.make_decoder(target, "pld", "chain", "sample-match", BATCHING[batching], budget=4,
                                  sampling=hot)
    seeds = [11, 12, 13, 14, 15]
    rows = decoder.generate_batch(prompts, 24, seeds=seeds, batch_size=3)
    shuffled = decoder.generate_batch(prompts[::-1], 24, seeds=seeds[::-1])
    for prompt, seed, row, other in zip(prompts, seeds, rows, shuffled[::-1]):
        alone = checks.make_decoder(target, "pld", "chain", "sample-match", "kv", budget=4, sampling=hot)
        assert row.tokens == alone.generate(prompt, max_new_tokens=24, seed=seed).tokens
        assert other.tokens == row.tokens


# --- the law of sampled rows (the exact-law harness of tests/core/decode/test_lossless_e2e.py, run as rows) -

LAW_PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
DEPTH, MAX_NEW, RUNS, ROWS = 2, 4, 2000, 8
HOT = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def law_setup(tmp_path_factory):
    target = tiny_target(seed=0, vocab_size=8)
    return target, LogitTable.from_target(target, LAW_PROMPT, DEPTH), str(tmp_path_factory.mktemp("examples"))


def law_decoder(law_setup, tree, backend: str = "table") -> SpeculativeDecoder:
    target, table, workdir = law_setup
    registry = get_registry()
    d_cls = registry.get("drafter", "draft-model")
    tree = registry.get("tree builder", tree)() if isinstance(tree, str) else tree
    state = (TableBackend(target, table=table) if backend == "table"
             else registry.get("backend", backend)(target))
    pipeline = Pipeline(d_cls(target, **d_cls.example_options(target, workdir)), tree,
                        registry.get("verifier", "rejection")(), state)
    return SpeculativeDecoder(target, pipeline, budget=3)


@pytest.mark.parametrize("backend,tree", [("table", "chain"), ("table", "trie"), ("kv", "chain")])
def test_sampled_rows_follow_the_target_law(law_setup, backend, tree):
    _, table, _ = law_setup
    runs = RUNS if backend == "table" else RUNS // 2
    counts, accepted = decoder_counts(law_decoder(law_setup, tree, backend), LAW_PROMPT, DEPTH, runs, HOT,
                                      MAX_NEW, batch=ROWS)
    result = law_test(counts, exact_law(table, HOT))
    assert result.pvalue >= P_PASS, f"draft-model+{tree}+rejection as rows of {ROWS} on {backend}: {result}"
    assert accepted > runs / 10, f"drafts were hardly accepted ({accepted})"


def test_a_mutant_builder_run_as_rows_is_caught(law_setup):
    _, table, _ = law_setup
    counts, _ = decoder_counts(law_decoder(law_setup, ByScoreChain()), LAW_PROMPT, DEPTH, RUNS, HOT, MAX_NEW,
                               batch=ROWS)
    result = law_test(counts, exact_law(table, HOT))
    assert result.pvalue < P_CATCH, f"the mutant builder passed as rows of a batch: {result}"


# --- drafters' per-request state, and refusals -------------------------------------------------------------


class SharedHistory(Drafter):
    """A mutant: proposes the token its request saw most recently before the last one, from a list it
    changes in place, so copies made by the default `spawn` share one history across rows."""

    name = "shared-history"

    def __init__(self, target, **options):
        super().__init__(target, **options)
        self.seen: list[int] = []

    def reset(self) -> None:
        self.seen.clear()  # in place: every spawned copy's list is this one

    def propose(self, context):
        self.seen.append(int(context.tokens[-1]))
        if len(self.seen) < 2:
            return DraftProposal.empty()
        return DraftProposal.from_sequences([[self.seen[-2]]])


def test_a_drafter_whose_rows_share_per_request_state_is_caught(target, prompts):
    make = lambda: checks.make_decoder(target, SharedHistory, "chain", "greedy", "kv", budget=2)  # noqa: E731
    with pytest.raises(AssertionError, match="share per-request drafter state"):
        checks.check_batch_rows(make, prompts[:3], 16, "shared-history")


@pytest.mark.parametrize("call,match", [
    (lambda d, p: d.generate_batch([], 8), "non-empty list"),
    (lambda d, p: d.generate_batch(p, 8, seeds=[1]), "seeds for"),
    (lambda d, p: d.generate_batch(p, [8, 8], batch_size=2), "max_new_tokens for"),
    (lambda d, p: d.generate_batch(p, 8, batch_size=0), "batch_size"),
    (lambda d, p: d.generate_batch([p[0], []], 8), "empty"),
])
def test_bad_batches_are_refused_before_any_work(target, prompts, call, match):
    decoder = checks.make_decoder(target, "pld", "chain", "greedy", "kv", budget=4)
    with pytest.raises((ConfigurationError, PromptError), match=match):
        call(decoder, prompts[:3])


def test_the_row_by_row_default_refuses_a_backend_without_fresh_state_per_copy(target, prompts):
    """Copies of a backend that does not declare that prefill starts all state afresh could share one
    sequence's state: the default batch refuses it before any work, naming it and what to do."""
    recompute = get_registry().get("backend", "recompute")  # a one-sequence backend: `RowByRow` batches it

    class Undeclared(recompute):
        name = "undeclared"
        capabilities = BackendCapabilities(supports_trees=True, provides_hidden_states=True)

    decoder = checks.make_decoder(target, "pld", "chain", "greedy", Undeclared, budget=4)
    with pytest.raises(ConfigurationError, match=r"backend 'undeclared' cannot decode a batch.*"
                       r"fresh_state_per_copy.*generate for each prompt.*--backend kv"):
        decoder.generate_batch(prompts[:2], 8)
    assert decoder.pipeline.backend.pending is None  # nothing was prefilled


@pytest.mark.parametrize("batching", BATCHING)
def test_auto_budget_rows_equal_plain_greedy_decoding(target, prompts, batching):
    decoder = SpeculativeDecoder.from_names(target, "pld", "trie", "greedy", BATCHING[batching],
                                            budget="auto:6")
    decoder.cost = PolynomialCost((0.05, 1.0))  # a node costs 5 % of a step: trees pay
    rows = decoder.generate_batch(prompts, 24, batch_size=3)
    assert [r.tokens for r in rows] == [reference_greedy(target, p, 24) for p in prompts]
    assert sum(r.metrics.accepted_draft_tokens for r in rows) > 0


# With five rows, t = (rows + nodes)^2 + 1 gives 5 tokens in 26 s plainly and at most 5 + k in
# (5 + k)^2 + 1 with k nodes: never more per second. t = 0.001 (rows + nodes) + 1: nodes nearly free.
@pytest.mark.parametrize("coefficients,kept", [((1.0, 0.0, 1.0), False), ((0.001, 1.0), True)])
def test_the_batch_planner_keeps_nodes_only_where_they_pay(target, prompts, coefficients, kept):
    """Where the forward's time grows with the square of its rows, no node pays in a batch of five rows
    (each row decodes plainly); where a row costs a thousandth of a step, the drafts are kept."""
    decoder = SpeculativeDecoder.from_names(target, "pld", "trie", "greedy", "kv", budget="auto:6")
    decoder.cost = PolynomialCost(coefficients)
    rows = decoder.generate_batch(prompts, 24)
    nodes = sum(sum(r.metrics.tree_sizes) for r in rows)
    assert (nodes > 0) is kept
    assert [r.tokens for r in rows] == [reference_greedy(target, p, 24) for p in prompts]


def test_best_of_n_samples_are_the_requests_alone_ranked_by_mean_log_probability(target, prompts):
    hot = SamplingParams(temperature=1.0, seed=5)
    decoder = checks.make_decoder(target, "pld", "chain", "sample-match", "kv", budget=4, sampling=hot)
    samples = decoder.best_of(prompts[1], 6, max_new_tokens=16)
    means = [s.logprob / len(s.tokens) for s in samples]
    assert means == sorted(means, reverse=True)
    alone = [decoder.generate(prompts[1], max_new_tokens=16, seed=5 + i) for i in range(6)]
    assert sorted(map(tuple, (s.tokens for s in samples))) == sorted(map(tuple, (a.tokens for a in alone)))
    # the log-probability is the target's, token by token, under its raw logits
    best = samples[0]
    ids = list(prompts[1]) + best.tokens
    logits = reference_logits(target, ids)  # (len(ids), V): row i predicts token i + 1
    expected = sum(torch.log_softmax(logits[len(prompts[1]) - 1 + i].double(), -1)[tok].item()
                   for i, tok in enumerate(best.tokens))
    assert best.logprob == pytest.approx(expected, abs=1e-3)


def test_best_of_refuses_greedy_decoding_with_what_to_do(target, prompts):
    decoder = checks.make_decoder(target, "pld", "chain", "greedy", "kv", budget=4)
    with pytest.raises(ConfigurationError, match="temperature"):
        decoder.best_of(prompts[0], 3)


class PaddedForward:
    """Prices a step as `kv`'s batch runs it: one forward, every row padded to the widest tree."""

    def forward_rows(self, sizes):
        return [len(sizes) * (max(sizes.values()) + 1)]


class ForwardPerRow:
    """Prices a step as `RowByRow` runs it: one forward per row."""

    def forward_rows(self, sizes):
        return [n + 1 for n in sizes.values()]


@pytest.mark.parametrize("batch,kept", [(PaddedForward(), {0: 3, 1: 3}), (ForwardPerRow(), {0: 3, 1: 0})])
def test_the_batch_planner_prices_the_forwards_the_batch_runs(batch, kept):
    """Row 0 holds a likely chain, row 1 an unlikely one. Where every row is padded to the widest tree,
    row 1's nodes fill its padding and cost nothing, so they are kept; scored row by row they cost."""
    planner = AdaptivePlanner(PolynomialCost((0.1, 1.0)), cap=3)  # a forward of n rows: 1 + 0.1 n
    planner.acceptance.predict = lambda conditional: conditional  # features stand for their p here
    trees, plans = {}, {}
    for key, p in ((0, 0.95), (1, 0.1)):
        trees[key] = TokenTree(np.arange(3, dtype=np.int64), np.arange(3, dtype=np.int64) - 1)
        plans[key] = planner.row()
        plans[key].record = CutRecord(np.full(3, p))  # features stand for their p here
    cut = planner.cut(trees, plans, batch)
    assert {key: len(tree) for key, (tree, _) in cut.items()} == kept


def _padded_kept(planner: AdaptivePlanner, rows: int = 4, nodes: int = 4, p: float = 0.6) -> int:
    """Nodes `planner` keeps of `rows` chains of `nodes` nodes, each predicted `p` given its parent,
    scored padded to the widest."""
    trees = {key: TokenTree(np.arange(nodes, dtype=np.int64), np.arange(nodes, dtype=np.int64) - 1)
             for key in range(rows)}
    plans = {key: planner.row() for key in trees}
    for plan in plans.values():
        plan.record = CutRecord(np.full(nodes, p))
    return sum(len(tree) for tree, _ in planner.cut(trees, plans, PaddedForward()).values())


def _planner_with_slopes(row_cost: float) -> AdaptivePlanner:
    """Calibrated on one sequence, where a row costs 1 % of a step; realised forwards of 4 to 20 rows
    then cost `row_cost` of a step per row."""
    planner = AdaptivePlanner(PolynomialCost((0.01, 1.0)), cap=4)
    planner.acceptance.predict = lambda conditional: conditional
    for rows in (4, 8, 12, 16, 20) * 4:
        planner.speed.add(rows, (1 + row_cost * rows) / (1 + 0.01 * rows))
    return planner


def test_the_batch_planner_learns_that_large_forwards_cost_more_than_calibrated():
    """Calibrated on one sequence, a forward's cost grows slowly with its rows; a batch's forwards of
    many rows may grow much faster. Learned from realised forwards of several sizes, the steeper line
    makes the planner keep fewer nodes."""
    assert _padded_kept(_planner_with_slopes(0.01)) == 16
    assert _padded_kept(_planner_with_slopes(0.5)) < 16


def test_the_planner_prices_no_forward_far_larger_than_any_timed():
    """Calibrated up to a tree of the cap (5 query rows) and nothing larger timed yet, the planner keeps
    no forward of over twice that, however cheap its line says it is; once forwards of 20 rows ran as
    calibrated, it keeps every node."""
    planner = AdaptivePlanner(PolynomialCost((0.01, 1.0)), cap=4)
    planner.acceptance.predict = lambda conditional: conditional
    assert _padded_kept(planner) == 4  # a node on each row: 8 query rows; a second on any: 12 > 10
    assert _padded_kept(_planner_with_slopes(0.01)) == 16


def test_padded_rows_keep_even_shallow_trees_where_one_row_s_deep_chain_would_widen_every_row():
    """Eight rows padded to the widest tree, a forward of n query rows taking 1 + 0.1 n: row 0 holds a
    confident chain of six nodes, the others two nodes each at 0.8 given the parent. Every prefix of the
    likeliest nodes that holds the other rows' nodes holds row 0's deep chain too, and costs more than
    it gains (a plain step does best among them); two nodes on every row (24 query rows) beats them all."""
    planner = AdaptivePlanner(PolynomialCost((0.1, 1.0)), cap=6, learn_speed=False)
    planner.acceptance.predict = lambda conditional: conditional  # features stand for their p here
    trees, plans = {}, {}
    for key in range(8):
        n, p = (6, 0.97) if key == 0 else (2, 0.8)
        trees[key] = TokenTree(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64) - 1)
        plans[key] = planner.row()
        plans[key].record = CutRecord(np.full(n, p))
    cut = planner.cut(trees, plans, PaddedForward())
    assert {key: len(tree) for key, (tree, _) in cut.items()} == dict.fromkeys(range(8), 2)
