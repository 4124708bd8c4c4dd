"""Ready-made law checks for plugin authors: a sampling verifier, a tree builder or a whole decoder
against the exactly enumerated law of a tiny target (see `specframe.testing.exact`).

    from specframe.testing.law import check_verifier_law
    check_verifier_law(MyVerifier())          # raises AssertionError naming the scenario that fails

Each scenario runs 20,000 seeded decodes of two tokens by default; a lossless component passes every
scenario at p >= `P_PASS` (1e-4), and the mutants in the project's own tests score below `P_CATCH` (1e-6)
in the scenario aimed at them. Seeds are fixed, so a check is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specframe.contract.interfaces import BuildContext
from specframe.terms.kinds import ComponentKind
from specframe.terms.proposal import DraftProposal
from specframe.plugging.registry import get_registry
from specframe.terms.sampling import SamplingParams
from specframe.testing.drafts import Drafts, adversarial_q, fixed_q, model_q
from specframe.testing.exact import (
    P_PASS, LawTest, LogitTable, Propose, decoder_counts, exact_law, keep_all, law_test, simulate,
)
from specframe.terms.tree import TokenTree

RUNS = 20_000
HOT = SamplingParams(temperature=1.0)
FILTERED = SamplingParams(temperature=0.7, top_k=6, top_p=0.9)


@dataclass
class Scenario:
    """One way of drafting against one tabulated target."""

    name: str
    propose: Propose
    table: LogitTable
    params: SamplingParams = HOT
    build: Callable[[DraftProposal], TokenTree] = field(default=keep_all)

    def run(self, verifier, runs: int = RUNS, seed: int = 0) -> LawTest:
        counts = simulate(verifier, self.propose, self.table, self.params, runs, seed, self.build)
        return law_test(counts, exact_law(self.table, self.params))


def standard_tables() -> tuple[LogitTable, LogitTable]:
    """The target (vocabulary 8, two tokens) and a second table used as a draft model."""
    return LogitTable.random(8, 2, seed=0, scale=2.0), LogitTable.random(8, 2, seed=1, scale=2.0)


def verifier_scenarios(sampled: bool = True) -> list[Scenario]:
    """Draft shapes a lossless sampling verifier must handle; `sampled=False` keeps only the drafts
    without a usable q (for verifiers that never read q, such as sample-and-match)."""
    target, draft = standard_tables()
    static = Drafts.retrieved([3, 5, 7, 1, 5, 2], [-1, -1, 0, 2, 0, 1])
    scenarios = [
        Scenario("retrieved tree, no q", static, target),
        Scenario("top-k drafts with their soft q", Drafts.top_k(model_q(draft), (3, 2)), target),
    ]
    if not sampled:
        return scenarios + [Scenario("i.i.d. trie, filtered sampling",
                                     Drafts.sampled_sequences(adversarial_q(target), 4, 2), target, FILTERED)]
    sequences = Drafts.sampled_sequences
    adversarial = adversarial_q(target)
    return scenarios + [
        Scenario("chain of 2 sampled drafts (Leviathan)", sequences(adversarial, 1, 2), target),
        Scenario("4 i.i.d. sequences merged into a trie", sequences(adversarial, 4, 2), target),
        Scenario("raw i.i.d. stream with repeats", Drafts.raw_stream(fixed_q(SKEWED), 4), target),
        Scenario("without replacement 3x2, filtered sampling",
                 Drafts.without_replacement(adversarial_q(target), (3, 2)), target, FILTERED),
    ]


SKEWED = [0.45, 0.3, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01]  # a q that repeats its first tokens often
TWO_TOKENS = [0.9, 0.1, 0, 0, 0, 0, 0, 0]  # the smallest case where "every draw was kept" is biased


def check_verifier_law(verifier, runs: int = RUNS, scenarios: list[Scenario] | None = None
                       ) -> dict[str, LawTest]:
    """Raise `AssertionError` if `verifier` fails the law test of any scenario; return every result."""
    if scenarios is None:
        caps = type(verifier).capabilities
        scenarios = verifier_scenarios(sampled=caps.uses_draft_probs or caps.needs_draft_probs)
    results = {s.name: s.run(verifier, runs) for s in scenarios}
    return _assert_all_pass(f"verifier '{type(verifier).name}'", results)


def builder_scenarios(builder, budgets: tuple[int, ...] = (1, 3)) -> list[Scenario]:
    """Sampled proposals shaped by `builder`: two i.i.d. draws from a two-token q cut to budget 1 (where
    keeping "everything that fits" or the likeliest child is biased), and wide i.i.d. tries cut to each
    of `budgets`."""
    target, _ = standard_tables()
    even = LogitTable({**target.rows, (): torch.tensor([0.0, 0.0] + [-30.0] * 6)}, target.vocab, target.depth)
    out = [Scenario("p = (0.5, 0.5), 2 i.i.d. draws from q = (0.9, 0.1), budget 1",
                    Drafts.sampled_sequences(fixed_q(TWO_TOKENS), 2, 1), even, build=_builder_at(builder, 1))]
    for budget in budgets:
        wide = Drafts.sampled_sequences(fixed_q(SKEWED), 6, 2)
        build = _builder_at(builder, budget)
        out.append(Scenario(f"6 i.i.d. sequences, budget {budget}", wide, target, build=build))
    return out


def _builder_at(builder, budget: int) -> Callable[[DraftProposal], TokenTree]:
    return lambda proposal: builder.build(proposal, BuildContext(budget))


def check_tree_builder_law(builder, runs: int = RUNS, verifier=None, budgets: tuple[int, ...] = (3,)
                           ) -> dict[str, LawTest]:
    """Trees from `builder` over sampled drafts, verified by `verifier` (default: the registered
    `rejection`), must keep the target's law. A builder that keeps `SAMPLED` trees it should not (by
    choosing sampled siblings by score, or deciding by what happened to be drawn) fails."""
    verifier = verifier or get_registry().get(ComponentKind.VERIFIER, "rejection")()
    results = {s.name: s.run(verifier, runs) for s in builder_scenarios(builder, budgets)}
    return _assert_all_pass(f"tree builder '{type(builder).name}'", results)


def check_decoder_law(decoder, table: LogitTable, prompt: list[int], params: SamplingParams, runs: int,
                      max_new_tokens: int | None = None, label: str = "decoder") -> LawTest:
    """The first `table.depth` tokens of `runs` seeded requests through `decoder` follow the target's law
    (`table` must be the table of `decoder.target` after `prompt`)."""
    counts, _ = decoder_counts(decoder, prompt, table.depth, runs, params, max_new_tokens)
    result = law_test(counts, exact_law(table, params))
    _assert_all_pass(label, {"end to end": result})
    return result


def _assert_all_pass(label: str, results: dict[str, LawTest]) -> dict[str, LawTest]:
    failed = {name: r for name, r in results.items() if r.pvalue < P_PASS}
    if failed:
        lines = "; ".join(f"{name}: {r}" for name, r in failed.items())
        raise AssertionError(f"{label} does not follow the target's distribution: {lines}")
    return results
