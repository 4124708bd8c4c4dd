"""Sampling under a constraint follows the constrained law exactly: the target's logits masked to what the
constraint allows, then temperature, top-k, top-p.

A tiny random Llama (vocabulary 8) is tabulated once (`LogitTable`), which gives the exact law of the first
two tokens under a constraint (`constrained_law`); seeded requests through `SpeculativeDecoder` with a
constraint, drafting from a repetitive prompt, must follow it: under a table automaton (`TokenAutomaton`)
and under llguidance's own masks (`byte_constraint`, a regular expression over 8 one-byte tokens). Three
mutants of constrained decoding (tests/helpers/constrained_mutants.py) run the same way and must fail by a
wide margin (p < 1e-6).
"""

from __future__ import annotations

import pytest
from constrained_mutants import FAULTS, MutantDecoder

from specframe import ComponentSpec, Pipeline, SamplingParams, SpeculativeDecoder
from specframe.plugging.registry import get_registry
from specframe.testing.constrained import TokenAutomaton, byte_constraint, constrained_law
from specframe.testing.exact import P_CATCH, P_PASS, LogitTable, TableBackend, decoder_counts, law_test
from specframe.testing.targets import tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # repeats, so copying drafters find matches
DEPTH, BUDGET, MAX_NEW, RUNS = 2, 3, 4, 2000
MUTANT_RUNS = 600  # each mutant emits forbidden tokens or a skewed law: p = 0 at 600 seeds already
HOT = SamplingParams(temperature=1.0)
FILTERED = SamplingParams(temperature=0.7, top_p=0.9)


@pytest.fixture(scope="module")
def setup():
    target = tiny_target(seed=0, vocab_size=8)
    return target, LogitTable.from_target(target, PROMPT, DEPTH)


def counts_of(setup, constraint, drafter="pld", tree="chain", verifier="sample-match", params=HOT,
              cls=SpeculativeDecoder, runs=RUNS, **kwargs):
    target, table = setup
    registry = get_registry()
    pipeline = Pipeline(registry.get("drafter", drafter)(target), registry.get("tree builder", tree)(),
                        registry.get("verifier", verifier)(), TableBackend(target, table=table))
    decoder = cls(target, pipeline, budget=BUDGET, **kwargs)
    generate = decoder.generate
    decoder.generate = lambda *args, **options: generate(*args, constraint=constraint, **options)
    return decoder_counts(decoder, PROMPT, DEPTH, runs, params, MAX_NEW)


AUTOMATON = TokenAutomaton.modular()


@pytest.mark.parametrize("drafter,tree,verifier,params", [
    ("pld", "chain", "sample-match", HOT),
    ("pld(matches=4)", "trie", "rejection", HOT),
    ("forced(then=pld)", "chain", "sample-match", FILTERED),
])
def test_constrained_sampling_follows_the_masked_law(setup, drafter, tree, verifier, params):
    spec = ComponentSpec.parse(drafter)
    target, table = setup
    registry = get_registry()
    pipeline = Pipeline(registry.get("drafter", spec.name)(target, **spec.options),
                        registry.get("tree builder", tree)(), registry.get("verifier", verifier)(),
                        TableBackend(target, table=table))
    decoder = SpeculativeDecoder(target, pipeline, budget=BUDGET)
    generate = decoder.generate
    decoder.generate = lambda *args, **options: generate(*args, constraint=AUTOMATON, **options)
    counts, accepted = decoder_counts(decoder, PROMPT, DEPTH, RUNS, params, MAX_NEW)
    result = law_test(counts, constrained_law(table, params, AUTOMATON))
    assert result.pvalue >= P_PASS, f"{drafter}+{tree}+{verifier}: {result}"
    assert accepted > RUNS / 10, f"drafts were hardly accepted ({accepted})"


def test_llguidance_masks_give_the_masked_law(setup):
    _, table = setup
    constraint = byte_constraint(regex="([ab][cd]|e[fg])+")  # what may follow depends on the first token
    counts, accepted = counts_of(setup, constraint)
    result = law_test(counts, constrained_law(table, HOT, constraint))
    assert result.pvalue >= P_PASS, str(result)
    assert accepted > 0


@pytest.mark.parametrize("fault", FAULTS)
def test_mutants_of_constrained_decoding_are_rejected(setup, fault):
    _, table = setup
    counts, _ = counts_of(setup, AUTOMATON, cls=MutantDecoder, fault=fault, runs=MUTANT_RUNS)
    result = law_test(counts, constrained_law(table, HOT, AUTOMATON))
    assert result.pvalue < P_CATCH, f"mutant {fault} passed: {result}"
