"""A sampled row's text is a function of its prompt, its seed and the method alone, with `sample-match`.

`sample-match` draws exactly one uniform per emitted token from the request's generator
(`plugins/specframe_verify/sample_match.py`, `specframe/terms/sampling.py`), and drafters that sample their
drafts draw from a second generator. So the tree decides only how many tokens a step emits, never which:
a row's text must be plain sampling's (drafter `none`) with the same seed, alone on a fresh decoder, at any
position of a batch of any size, with continuous batching, on a warm decoder after other requests, at
every budget (`"auto"` included, whose trees depend on measured step times and learned acceptance), and
`best_of(prompt, n, seed=s)` must give the texts of `generate(prompt, seed=s + i)`.

`rejection` is not such a method: its acceptance coins are drawn per node it visits, so its text depends
on the tree. At a fixed budget the tree is a function of the prompt and the seed, and its rows are
reproducible alone, in a batch and on a warm decoder; another budget gives another text for the same
seed. At `budget="auto"` its trees follow measured times, so its text is not tested there: a test of
what is not deterministic could pass or fail by chance ("Seeds and reproducibility" in
docs/explanation/lossless-sampling.md).
"""

from __future__ import annotations

import pytest
from conftest import tiny_llama

from specframe import SamplingParams, SpeculativeDecoder
from specframe.testing import checks
from specframe.testing.targets import reference_greedy, repetitive_prompt

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

# A sharpened tiny target sampled at a low temperature, after prompts that end with its own greedy
# continuation: its samples still differ from seed to seed, and the drafts are accepted often enough that
# the trees decide how many tokens a step emits (at temperature 1 a random target's drafts are hardly ever
# accepted, and every method would pass by decoding plainly)
SAMPLING = SamplingParams(temperature=0.2)
SEEDS = tuple(range(10))
MAX_NEW = 12
LENGTHS = (9, 20, 35, 16)  # prompt i % 4 goes with seed i
BUDGETS = ("auto", 1, 4, 16)
SAMPLED = {"layers": 1, "num_tokens": 3, "topk": 2, "draw": "sample"}  # one-layer self-drafting, sampled
METHODS = {  # drafter, tree builder, drafter options
    "pld+trie": ("pld", "trie", {}),
    "draft-model+chain": ("draft-model", "chain", SAMPLED),
    "draft-model+static": ("draft-model", "static", SAMPLED),
}
# Seeds in an order that puts each at another position of its batch than its own index, and puts two seeds
# of one prompt in one batch (as best_of does)
SHUFFLED = (3, 7, 1, 9, 0, 4, 8, 2, 6, 5)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def prompts(target):
    """Prompts with recurring phrases, each followed by the target's greedy continuation, which the
    copying drafters (`pld`) find again in what is sampled."""
    phrases = [repetitive_prompt(target.vocab_size, n, seed=i) for i, n in enumerate(LENGTHS)]
    return [p + reference_greedy(target, p, 24) for p in phrases]


@pytest.fixture(scope="module")
def plain(target, prompts):
    """Plain sampling's tokens for each seed (of its prompt): one draw from the target per token."""
    decoder = checks.make_decoder(target, "none", "chain", "sample-match", "kv", budget=1, sampling=SAMPLING)
    return {seed: decoder.generate(prompt_of(prompts, seed), MAX_NEW, seed=seed).tokens for seed in SEEDS}


def prompt_of(prompts, seed: int) -> list[int]:
    return prompts[seed % len(prompts)]


def decoder_for(target, method: str, verifier: str, budget) -> SpeculativeDecoder:
    """A fresh decoder: nothing planned, learned or calibrated yet but the backend's cached cost."""
    drafter, tree, options = METHODS[method]
    made = checks.make_decoder(target, drafter, tree, verifier, "kv", budget=1, sampling=SAMPLING,
                               options={"drafter": options})
    return SpeculativeDecoder(target, made.pipeline, budget=budget, sampling=SAMPLING, progress=False)


def batched(decoder: SpeculativeDecoder, prompts, seeds, **options) -> dict[int, list[int]]:
    """Each seed's tokens, its prompt decoded in one `generate_batch` call with the other seeds'."""
    rows = decoder.generate_batch([prompt_of(prompts, s) for s in seeds], MAX_NEW, seeds=list(seeds),
                                  **options)
    return {seed: row.tokens for seed, row in zip(seeds, rows)}


def in_batches(decoder: SpeculativeDecoder, prompts, seeds, size: int) -> dict[int, list[int]]:
    """Each seed's tokens, decoded in batches of `size` rows (the last one may be smaller)."""
    tokens: dict[int, list[int]] = {}
    for start in range(0, len(seeds), size):
        tokens.update(batched(decoder, prompts, seeds[start:start + size]))
    return tokens


def differing(got: dict[int, list[int]], expected: dict[int, list[int]]) -> list[int]:
    return [seed for seed in expected if got[seed] != expected[seed]]


# --- sample-match: a row is plain sampling with its seed, whatever the trees -------------------------------


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("method", METHODS)
def test_a_sample_match_row_is_plain_sampling_with_its_seed_alone_in_any_batch_and_when_warm(
        target, prompts, plain, method, budget):
    results = {s: decoder_for(target, method, "sample-match", budget).generate(prompt_of(prompts, s), MAX_NEW,
                                                                              seed=s) for s in SEEDS}
    alone = {s: result.tokens for s, result in results.items()}
    assert differing(alone, plain) == [], f"{method}@{budget} alone on a fresh decoder"
    if budget != "auto":  # the trees decided something: drafts were accepted (at "auto", by measured times)
        assert sum(r.metrics.accepted_draft_tokens for r in results.values()) > 0, f"{method}@{budget}"
    decoder = decoder_for(target, method, "sample-match", budget)  # warms up over the calls below
    assert differing(in_batches(decoder, prompts, SHUFFLED, 4), plain) == [], f"{method}@{budget}, B = 4"
    assert differing(in_batches(decoder, prompts, SEEDS[::-1], 2), plain) == [], f"{method}@{budget}, B = 2"
    continuous = batched(decoder, prompts, SHUFFLED, batch_size=3)  # rows join as others end
    assert differing(continuous, plain) == [], f"{method}@{budget}, 10 prompts 3 at a time"
    warm = {s: decoder.generate(prompt_of(prompts, s), MAX_NEW, seed=s).tokens for s in SEEDS}
    assert differing(warm, plain) == [], f"{method}@{budget} alone on a warm decoder"


@pytest.mark.parametrize("budget", ("auto", 4))
@pytest.mark.parametrize("method", METHODS)
def test_best_of_gives_the_seeded_single_requests_with_sample_match(target, prompts, method, budget):
    prompt = prompts[1]
    best = decoder_for(target, method, "sample-match", budget).best_of(prompt, 4, MAX_NEW, seed=100)
    singles = [decoder_for(target, method, "sample-match", budget).generate(prompt, MAX_NEW,
                                                                            seed=100 + i).tokens
               for i in range(4)]
    assert sorted(r.tokens for r in best) == sorted(singles)
    assert len({tuple(tokens) for tokens in singles}) > 1  # four seeds, not one sample four times


def test_the_seeded_rows_test_catches_a_verifier_whose_draws_depend_on_the_tree(target, prompts, plain):
    """The checks above can fail: `rejection` over sampled drafts, run as they run `sample-match`, gives
    another text than plain sampling for most seeds."""
    decoder = decoder_for(target, "draft-model+chain", "rejection", 4)
    assert len(differing(in_batches(decoder, prompts, SEEDS, 4), plain)) > len(SEEDS) // 2


# --- rejection: reproducible at a fixed budget only, and its text depends on the tree ----------------------


@pytest.mark.parametrize("method", ["draft-model+chain", "draft-model+static"])
def test_a_rejection_row_at_a_fixed_budget_is_the_same_alone_in_a_batch_and_when_warm(target, prompts,
                                                                                     method):
    alone = {s: decoder_for(target, method, "rejection", 4).generate(prompt_of(prompts, s), MAX_NEW,
                                                                     seed=s).tokens for s in SEEDS}
    decoder = decoder_for(target, method, "rejection", 4)
    assert differing(in_batches(decoder, prompts, SHUFFLED, 4), alone) == []
    assert differing(batched(decoder, prompts, SEEDS[::-1], batch_size=3), alone) == []
    warm = {s: decoder.generate(prompt_of(prompts, s), MAX_NEW, seed=s).tokens for s in SEEDS}
    assert differing(warm, alone) == []
    best = decoder_for(target, method, "rejection", 4).best_of(prompts[1], 4, MAX_NEW, seed=100)
    singles = [decoder.generate(prompts[1], MAX_NEW, seed=100 + i).tokens for i in range(4)]
    assert sorted(r.tokens for r in best) == sorted(singles)


def test_a_rejection_rows_text_depends_on_the_budget(target, prompts):
    """Why `rejection` cannot promise a text per seed at `budget="auto"`: the same seed gives another text
    under another tree, and "auto" sizes trees by measured step times and learned acceptance."""
    by_budget = {budget: {s: decoder_for(target, "draft-model+chain", "rejection", budget).generate(
        prompt_of(prompts, s), MAX_NEW, seed=s).tokens for s in SEEDS} for budget in (1, 4)}
    assert len(differing(by_budget[1], by_budget[4])) > len(SEEDS) // 2
