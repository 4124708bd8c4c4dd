"""End to end on tiny random targets of every family ssm-tree serves (tests/helpers/ssm_models.py):
speculative greedy decoding through the SSM backends emits exactly the tokens of plain greedy decoding (the
`none` drafter, and a plain loop of the unmodified model), with prompt lookup and REST drafts, chains, tries
and static trees."""

from __future__ import annotations

import pytest
from ssm_models import make_repetitive, reference_greedy, tiny_ssm_target

from specframe import SpeculativeDecoder

PROMPT = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5, 9, 10, 11, 3, 4, 5, 6]
NEW_TOKENS = 32


# family -> (seed, embedding boost) under which greedy text both follows and breaks prompt-lookup drafts
TARGETS = {"mamba2": (1, 4.0), "bamba": (1, 4.0), "nemotronh": (1, 4.0), "qwen3_next": (4, 8.0),
           "olmo_hybrid": (1, 4.0), "mamba": (1, 4.0), "falcon_mamba": (1, 4.0), "jamba": (1, 4.0),
           "lfm2": (5, 8.0), "kimi_linear": (1, 4.0), "falcon_h1": (1, 4.0),
           "zamba2": (3, 8.0), "granite_hybrid": (1, 4.0)}


@pytest.fixture(scope="module", params=list(TARGETS))
def target(request):
    seed, boost = TARGETS[request.param]
    return make_repetitive(tiny_ssm_target(request.param, seed=seed), boost=boost)


@pytest.fixture(scope="module")
def plain(target) -> list[int]:
    decoder = SpeculativeDecoder.from_names(target, "none", "chain", "greedy", "ssm-tree")
    tokens = decoder.generate(PROMPT, max_new_tokens=NEW_TOKENS).tokens
    assert tokens == reference_greedy(target, PROMPT, NEW_TOKENS)
    return tokens


@pytest.fixture(scope="module")
def datastore(target, tmp_path_factory):
    """A REST datastore of the target's own greedy continuations of a few prompts, this one included."""
    from specframe_corpus.build import build_datastore
    from specframe_corpus.sources import TokenDocuments

    starts = [PROMPT[:8], [1, 2, 3], [20, 30, 40, 50]]
    documents = [s + reference_greedy(target, s, 48) for s in starts]
    out = tmp_path_factory.mktemp("rest") / target.name
    build_datastore(out, [TokenDocuments("own", "ids", documents=documents)], target, progress=False)
    return str(out)


@pytest.mark.parametrize(("drafter", "tree", "backend"), [
    ("pld", "chain", "ssm-tree"),
    ("pld(matches=3)", "chain", "ssm-tree"),
    ("pld(matches=3, num_tokens=4)", "trie", "ssm-tree"),
    ("pld(matches=3, num_tokens=4)", "trie", "ssm-tree(commit=closed)"),
    ("pld(matches=3, num_tokens=4)", "trie", "ssm-unrolled"),
    ("rest(datastore=DS, k=8, m=4)", "trie", "ssm-tree"),
    ("rest(datastore=DS, k=8, m=4)", "static(preset=continuous, depth=4, width=2)", "ssm-tree"),
    ("rest(datastore=DS, live=1, k=4, m=4)", "static(preset=cartesian, widths=(2, 2, 1))", "ssm-tree"),
])
def test_speculative_greedy_equals_plain_greedy(target, plain, datastore, drafter, tree, backend):
    if backend == "ssm-unrolled" and target.name.removeprefix("tiny-") in ("mamba", "falcon_mamba", "jamba"):
        pytest.skip("ssm-unrolled refuses Mamba-1 models (tests/plugins/ssm/test_ssm_backends.py)")
    decoder = SpeculativeDecoder.from_names(target, drafter.replace("DS", repr(datastore)), tree, "greedy",
                                            backend, budget=8)
    result = decoder.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert result.tokens == plain
    assert result.metrics.accepted_draft_tokens > 0  # drafts were accepted: the check is not vacuous
