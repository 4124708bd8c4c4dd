"""Lossless sampling, checked exactly: the first generated tokens of many seeded runs through a verifier
follow the target's exact (processed) distribution, and the same check fails on broken verifiers.

The exact distribution of the first 2-3 tokens of a tiny random Llama (vocabulary 12) is computed by
enumerating sequences (`verifier_kit.exact_distribution`). Runs call the verifier directly on tabulated
target logits (`verifier_kit.simulate`), with drafters that draw their trees from a real q: a second tiny
random model, or an adversarial q that puts most mass on the tokens the target likes least.

False-alarm rate: a check passes when the chi-square p-value is >= P_MIN = 1e-4, so a correct verifier
fails one check with probability 1e-4 over seeds (below 1e-3 over the 8 checks of this file). Seeds are
fixed, so the outcome is deterministic; the broken verifiers below score p-values at least four orders of
magnitude below P_MIN.
"""

from __future__ import annotations

import pytest
from verifier_kit import (
    Drafters, LogitTable, adversarial_q, chi_square_pvalue, exact_distribution, keep_all, model_q, simulate,
    tiny_target,
)

from specframe import (
    DrawMethod, Sampler, SamplingParams, TargetScores, TokenTree, Verifier, VerifierCapabilities,
    VerifyResult,
)
from specframe.registry import get_registry

P_MIN = 1e-4
RUNS = 3000
PROMPT = [1, 2, 3, 4]
HOT = SamplingParams(temperature=1.0)
FILTERED = SamplingParams(temperature=0.7, top_k=6, top_p=0.9)
STATIC = ([3, 5, 7, 1, 5, 2], [-1, -1, 0, 2, 0, 1])  # a fixed retrieved tree: two branches, depth 3


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def tables():
    target, draft = tiny_target(0), tiny_target(1)
    return {depth: (LogitTable(target, PROMPT, depth), LogitTable(draft, PROMPT, depth)) for depth in (2, 3)}


def verifier(name: str) -> Verifier:
    return get_registry().get("verifier", name)()


def drafter(kind: str, target: LogitTable, draft: LogitTable):
    """The proposal function for one drafter kind of the parametrization below."""
    q = adversarial_q(target) if kind.endswith("adversarial") else model_q(draft)
    if kind.startswith("chain"):
        return Drafters.sampled_sequences(q, count=1, length=3)
    if kind.startswith("iid-trie"):
        return Drafters.sampled_sequences(q, count=4, length=2)
    if kind.startswith("without-replacement"):
        return Drafters.without_replacement(q, widths=(3, 2))
    if kind.startswith("top-k"):
        return Drafters.top_k(q, widths=(3, 2))
    if kind == "static":
        return Drafters.static_tree(*STATIC)
    raise ValueError(kind)


def check_lossless(v: Verifier, propose, table: LogitTable, params: SamplingParams, build=keep_all) -> float:
    """The distribution check itself; returns the p-value, raises AssertionError below P_MIN."""
    counts = simulate(v, propose, table, params, RUNS, seed=0, build=build)
    pvalue = chi_square_pvalue(counts, exact_distribution(table, params))
    assert pvalue >= P_MIN, f"{v.name}: the first tokens do not follow the target (p = {pvalue:.3g})"
    return pvalue


REJECTION_CASES = [
    ("chain", 3, HOT),  # one child per node: Leviathan et al.
    ("chain-adversarial", 3, FILTERED),
    ("iid-trie-adversarial", 2, HOT),  # i.i.d. sequences merged into a trie (duplicates merged)
    ("without-replacement", 2, FILTERED),
    ("top-k", 2, HOT),  # deterministic drafts carrying a soft q that must be ignored
]


@pytest.mark.parametrize("kind,depth,params", REJECTION_CASES,
                         ids=[f"{k}-T{p.temperature}" for k, _, p in REJECTION_CASES])
def test_rejection_is_lossless(tables, kind, depth, params):
    target, draft = tables[depth]
    check_lossless(verifier("rejection"), drafter(kind, target, draft), target, params)


SAMPLE_MATCH_CASES = [("static", 3, HOT), ("iid-trie-adversarial", 2, FILTERED)]


@pytest.mark.parametrize("kind,depth,params", SAMPLE_MATCH_CASES,
                         ids=[f"{k}-T{p.temperature}" for k, _, p in SAMPLE_MATCH_CASES])
def test_sample_match_is_lossless(tables, kind, depth, params):
    target, draft = tables[depth]
    check_lossless(verifier("sample-match"), drafter(kind, target, draft), target, params)


def score_picked_trees(lie: bool):
    """Trees from the first-party `chain` builder, which follows the most frequent child: the kept
    children are no longer draws from q, so `TokenTree.from_proposal` marks the tree retrieved. With
    `lie`, the tree claims its draws anyway (a builder breaking the `DrawMethod` contract)."""
    chain = get_registry().get("tree builder", "chain")()

    def build(proposal):
        tree = chain.build(proposal, 8)
        if lie:
            tree.draw = proposal.draw
        return tree

    return build


def test_rejection_stays_lossless_when_a_builder_picks_siblings_by_score(tables):
    target, _ = tables[2]
    propose = Drafters.sampled_sequences(adversarial_q(target, power=1.0), count=6, length=2)
    check_lossless(verifier("rejection"), propose, target, HOT, build=score_picked_trees(lie=False))
    with pytest.raises(AssertionError, match="do not follow"):
        check_lossless(verifier("rejection"), propose, target, HOT, build=score_picked_trees(lie=True))


# --- the same check on deliberately broken verifiers ------------------------------------------------

class ResidualIgnoresQ(Verifier):
    """BROKEN on purpose: accepts with min(1, p/q) like rejection sampling, but after a rejection keeps
    drawing from p instead of the residual norm(max(0, p - q)), which double-counts the draft's mass."""

    name = "broken-residual"
    capabilities = VerifierCapabilities(lossless=True, needs_draft_probs=True, supports_sampling=True)

    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        path, node = [], -1
        while True:
            p = sampling.probs(scores.logits[node + 1]).double()  # (V,)
            child = None
            for c in tree.children[node + 1]:
                q = tree.draft_probs[c].double()  # (V,)
                token = int(tree.tokens[c])
                if sampling.uniform() * q[token] < p[token]:
                    child = c
                    break
            if child is None:
                return VerifyResult(path, sampling.draw(p))
            path.append(child)
            node = child


def test_check_fails_when_the_residual_ignores_q(tables):
    target, draft = tables[3]
    with pytest.raises(AssertionError, match="do not follow"):
        check_lossless(ResidualIgnoresQ(), drafter("chain", target, draft), target, HOT)


def test_check_fails_when_deterministic_drafts_are_verified_with_their_soft_q(tables):
    """Top-k drafts labelled as sampled: rejection then trusts a q the tokens were not drawn from (the
    lossless bug peers shipped). The same drafts labelled top-k pass (`test_rejection_is_lossless`)."""
    target, draft = tables[2]
    mislabeled = Drafters.top_k(model_q(draft), widths=(3, 2), draw=DrawMethod.SAMPLED)
    with pytest.raises(AssertionError, match="do not follow"):
        check_lossless(verifier("rejection"), mislabeled, target, HOT)


def test_check_fails_on_typical_acceptance_which_is_lossy(tables):
    target, draft = tables[3]
    with pytest.raises(AssertionError, match="do not follow"):
        check_lossless(verifier("typical"), drafter("static", target, draft), target, HOT)


def test_exact_distribution_sums_to_one(tables):
    target, _ = tables[3]
    for params in (HOT, FILTERED):
        assert sum(exact_distribution(target, params).values()) == pytest.approx(1.0, abs=1e-5)  # float32
    assert len(exact_distribution(target, HOT)) == target.vocab ** 3
    assert len(exact_distribution(target, FILTERED)) < target.vocab ** 3  # the filters remove sequences
