"""The `suffix` drafter (arctic-inference's SuffixDecoding): lossless greedy and sampled decoding, memory
across requests, the persisted cache and its refusals, merging of the sources, and `specframe cache`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding")

from conftest import tiny_llama
from specframe_suffix.drafter import SuffixDrafter, check_internals
from specframe_suffix.drafts import CORPUS, HEADS, REQUEST, RESPONSES, SourceDraft, group_of, merge
from specframe_suffix.heads import SuffixEagleDrafter, SuffixHeadsDrafter
from specframe_suffix.store import SuffixCacheError
from typer.testing import CliRunner

from specframe import ConfigurationError, DraftContext, Pipeline, SamplingParams, SpeculativeDecoder
from specframe.plugging.registry import get_registry
from specframe.testing import DrafterConformance, reference_greedy, repetitive_prompt
from specframe.testing.exact import P_PASS, LogitTable, TableBackend, decoder_counts, exact_law, law_test
from specframe.testing.targets import tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py
NEW = 40


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(seed=1)


@pytest.fixture(scope="module")
def prompts(tiny):
    """Two prompts with their plain greedy continuations (by full recomputation)."""
    out = [repetitive_prompt(tiny.vocab_size, 40, seed=s) for s in (0, 1)]
    return [(p, reference_greedy(tiny, p, NEW)) for p in out]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "suffix-caches"


def decoder(target, drafter="suffix", tree="trie", budget=8, **kwargs) -> SpeculativeDecoder:
    return SpeculativeDecoder.from_names(target, drafter, tree, "greedy", budget=budget, **kwargs)


# --- greedy decoding and memory ------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["chain", "trie"])
@pytest.mark.parametrize("budget", [8, "auto:8"])
def test_greedy_output_equals_plain_greedy(tiny, prompts, tree, budget):
    run = decoder(tiny, "suffix", tree, budget)
    for prompt, expected in prompts * 2:  # the second round drafts from the first round's responses
        assert run.generate(prompt, max_new_tokens=NEW).tokens == expected


@pytest.mark.parametrize("spec", ["suffix(tree=False)", "suffix(factor=2.0, offset=1, min_prob=0.0)",
                                  "suffix(max_depth=4, max_cached=1)"])
def test_greedy_output_with_other_options(tiny, prompts, spec):
    run = decoder(tiny, spec, "trie", 6)
    for prompt, expected in prompts * 2:
        assert run.generate(prompt, max_new_tokens=NEW).tokens == expected


def test_a_second_request_drafts_from_the_first_response(tiny, prompts):
    prompt, expected = prompts[0]
    run = decoder(tiny)
    first, second = (run.generate(prompt, max_new_tokens=NEW) for _ in range(2))
    assert first.tokens == second.tokens == expected
    assert second.metrics.steps < first.metrics.steps
    assert second.metrics.accepted_draft_tokens > first.metrics.accepted_draft_tokens
    forgetful = decoder(tiny, "suffix(max_cached=0)")  # no earlier responses: each request starts afresh
    a, b = (forgetful.generate(prompt, max_new_tokens=NEW) for _ in range(2))
    assert a.tokens == b.tokens == expected
    assert a.metrics.steps == b.metrics.steps > second.metrics.steps


def test_finish_ends_each_request_with_its_exact_tokens(tiny, prompts):
    run = decoder(tiny, "suffix(max_cached=2)")
    drafter = run.pipeline.drafter
    results = [run.generate(p, max_new_tokens=n).tokens for n in (NEW, 7, 13) for p, _ in prompts[:1]]
    assert drafter._request is None and not drafter.library.active_requests
    assert list(drafter.finished) == results[-2:]  # the oldest response was evicted
    stats = drafter.stats()
    assert stats["responses"] == 2 and stats["tokens"] == 20 and stats["memory_bytes"] > 0


def test_sources_are_labelled_in_the_proposal(tiny, prompts):
    prompt, expected = prompts[0]
    drafter = SuffixDrafter(tiny)
    drafter.finish(prompt, expected)  # as if an earlier request had answered
    tokens = np.array(prompt + expected[:10])
    proposal = drafter.propose(DraftContext(tokens, len(prompt), budget=8))
    assert len(proposal) and set(proposal.group.tolist()) & {3, 4, 5}  # from the earlier response
    assert proposal.tokens[proposal.parents == -1].tolist().count(expected[10]) == 1


@pytest.mark.parametrize("family", ["mamba2", "bamba"])
def test_greedy_on_ssm_and_hybrid_targets(family):
    from ssm_models import make_repetitive, tiny_ssm_target
    from ssm_models import reference_greedy as ssm_reference

    target = make_repetitive(tiny_ssm_target(family, seed=1))
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5, 9, 10, 11, 3, 4, 5, 6]
    expected = ssm_reference(target, prompt, 32)
    run = SpeculativeDecoder.from_names(target, "suffix", "trie", "greedy", "ssm-tree", budget=8)
    results = [run.generate(prompt, max_new_tokens=32) for _ in range(2)]
    assert all(r.tokens == expected for r in results)
    assert results[1].metrics.accepted_draft_tokens > results[0].metrics.accepted_draft_tokens


# --- merging -------------------------------------------------------------------------------------------


def test_merge_is_a_union_scored_by_the_best_source():
    request = SourceDraft(REQUEST, [5, 6, 7], [-1, 0, 0], [0.9, 0.5, 0.3], match_len=2)
    responses = SourceDraft(RESPONSES, [5, 7, 8], [-1, 0, 1], [0.6, 0.6, 0.6], match_len=12)
    proposal = merge([request, responses])
    assert proposal.tokens.tolist() == [5, 6, 7, 8]
    assert proposal.parents.tolist() == [-1, 0, 0, 2]
    assert proposal.scores.tolist() == pytest.approx([0.9, 0.5, 0.6, 0.6])
    assert proposal.group.tolist() == [group_of(REQUEST, 2)] * 2 + [group_of(RESPONSES, 12)] * 2
    assert merge([]).tokens.size == 0


def test_groups_fit_the_labels_adaptive_speculation_learns():
    from specframe.decode.acceptance import GROUPS

    labels = {group_of(s, n) for s in (REQUEST, RESPONSES, CORPUS, HEADS) for n in range(0, 100)}
    assert labels == set(range(9)) and max(labels) < GROUPS


# --- suffix-heads ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def heads_file(tiny, tmp_path_factory):
    return SuffixHeadsDrafter.example_options(tiny, str(tmp_path_factory.mktemp("heads")))["heads"]


def test_heads_draft_where_nothing_was_written_before(tiny, prompts, heads_file):
    import torch

    from specframe_s4c.drafter import S4CDrafter

    prompt, expected = prompts[0]
    drafter = SuffixHeadsDrafter(tiny, heads=heads_file, topk=2)
    fresh = np.array([prompt[0], *range(60, 70)])  # no repeats: no suffix source matches
    hidden = torch.randn(tiny.model.config.hidden_size)
    context = DraftContext(fresh, len(fresh) - 1, budget=8, hidden=hidden)
    proposal = drafter.propose(context)
    alone = S4CDrafter(tiny, heads=heads_file, topk=2, widths=1, draw="top-k", depth=1).propose(context)
    assert len(proposal) == len(alone) > 0 and set(proposal.group.tolist()) == {group_of(HEADS, 0)}
    assert proposal.tokens.tolist() == alone.tokens.tolist()
    np.testing.assert_allclose(proposal.scores, np.exp(alone.scores), rtol=1e-6)  # P(reached) under q
    parents = proposal.parents
    assert np.all(proposal.scores[parents >= 0] <= proposal.scores[parents[parents >= 0]])
    assert not len(drafter.propose(DraftContext(fresh, len(fresh) - 1, budget=8)))  # no feature yet

    drafter.reset()
    drafter.finish(prompt, expected)  # an earlier response: now the suffix sources draft as well
    context = DraftContext(np.array(prompt + expected[:10]), len(prompt), budget=8, hidden=hidden)
    labels = set(drafter.propose(context).group.tolist())
    assert group_of(HEADS, 0) in labels and labels & {3, 4, 5}
    assert drafter.head_steps == 2


def test_heads_skip_steps_a_likely_copy_covers(tiny, prompts, heads_file):
    import torch

    prompt, expected = prompts[0]
    drafter = SuffixHeadsDrafter(tiny, heads=heads_file, heads_below=0.4, depth=2)
    drafter.finish(prompt, expected)
    hidden = torch.randn(tiny.model.config.hidden_size)
    proposal = drafter.propose(DraftContext(np.array(prompt + expected[:10]), len(prompt), 8, hidden))
    assert proposal.scores[proposal.parents == -1].max() > 0.4  # the earlier response is copied...
    assert group_of(HEADS, 0) not in set(proposal.group.tolist()) and drafter.head_steps == 0  # ...alone
    with pytest.raises(ConfigurationError, match="heads_below must be a number in"):
        SuffixHeadsDrafter(tiny, heads=heads_file, heads_below=2)
    with pytest.raises(ConfigurationError, match="depth"):
        SuffixHeadsDrafter(tiny, heads=heads_file, depth=9)


@pytest.mark.parametrize("budget", [8, "auto:8"])
def test_suffix_heads_output_equals_plain_greedy(tiny, prompts, heads_file, budget):
    run = decoder(tiny, f"suffix-heads(heads={heads_file!r})", "trie", budget)
    assert run.pipeline.backend.want_hidden
    for prompt, expected in prompts * 2:
        assert run.generate(prompt, max_new_tokens=NEW).tokens == expected
    assert run.pipeline.drafter._request is None  # `finish` ended each request, as for `suffix`
    assert len(run.pipeline.drafter.finished) == 4


# --- suffix-eagle ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eagle_head(tiny, tmp_path_factory):
    return SuffixEagleDrafter.example_options(tiny, str(tmp_path_factory.mktemp("eagle")))["heads"]


@pytest.mark.parametrize("budget", [8, "auto:8"])
def test_suffix_eagle_output_equals_plain_greedy_alone_and_in_a_batch(tiny, prompts, eagle_head, budget):
    """The EAGLE head joins the copied sources on every step it drafts (heads_below=1: all), hears every
    step's features, and each row of a batch keeps a head cache of its own."""
    run = decoder(tiny, f"suffix-eagle(heads={eagle_head!r})", "trie", budget)
    assert run.pipeline.backend.want_hidden
    for prompt, expected in prompts:
        assert run.generate(prompt, max_new_tokens=NEW).tokens == expected
    assert run.pipeline.drafter.head_steps > 0
    batch = decoder(tiny, f"suffix-eagle(heads={eagle_head!r})", "trie", budget)
    results = batch.generate_batch([p for p, _ in prompts], max_new_tokens=NEW)
    assert [r.tokens for r in results] == [e for _, e in prompts]


def test_suffix_eagle_drafts_the_heads_forest_where_nothing_was_copied(tiny, prompts, eagle_head):
    import torch

    from specframe_eagle.drafter import EagleDrafter

    fresh = np.array([prompts[0][0][0], *range(60, 70)])  # no repeats: no suffix source matches
    hidden = torch.randn(tiny.model.config.hidden_size)  # a feature exists: the head computes the context's
    context = DraftContext(fresh, len(fresh) - 1, budget=8, hidden=hidden)
    drafter = SuffixEagleDrafter(tiny, heads=eagle_head, depth=2, width=1, topk=2)
    proposal = drafter.propose(context)
    alone = EagleDrafter(tiny, heads=eagle_head, depth=2, width=1, topk=2, draw="top-k").propose(context)
    assert len(proposal) == len(alone) > 0 and set(proposal.group.tolist()) == {group_of(HEADS, 0)}
    assert proposal.tokens.tolist() == alone.tokens.tolist()
    np.testing.assert_allclose(proposal.scores, np.exp(alone.scores), rtol=1e-5)  # P(reached) under q
    assert not len(drafter.propose(DraftContext(fresh, len(fresh) - 1, budget=8)))  # no feature yet

    prompt, expected = prompts[0]
    skip = SuffixEagleDrafter(tiny, heads=eagle_head, heads_below=0.4)
    skip.finish(prompt, expected)  # an earlier response, copied with confidence: the head stays idle
    proposal = skip.propose(DraftContext(np.array(prompt + expected[:10]), len(prompt), 8, hidden))
    assert proposal.scores[proposal.parents == -1].max() > 0.4
    assert group_of(HEADS, 0) not in set(proposal.group.tolist()) and skip.head_steps == 0
    with pytest.raises(ConfigurationError, match="heads_below must be a number in"):
        SuffixEagleDrafter(tiny, heads=eagle_head, heads_below=-1)


# --- sampling ------------------------------------------------------------------------------------------

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # repeats, so the suffix trees find matches
HOT = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def table_setup():
    target = tiny_target(seed=0, vocab_size=8)
    return target, LogitTable.from_target(target, PROMPT, 2)


def table_decoder(table_setup, verifier: str, drafter: str = "suffix") -> SpeculativeDecoder:
    target, table = table_setup
    registry = get_registry()
    d_cls = registry.get("drafter", drafter)
    pipeline = Pipeline(d_cls(target), registry.get("tree builder", "trie")(),
                        registry.get("verifier", verifier)(), TableBackend(target, table=table))
    return SpeculativeDecoder(target, pipeline, budget=3)


def test_sample_and_match_follows_the_target_law(table_setup):
    _, table = table_setup
    run = table_decoder(table_setup, "sample-match")
    counts, accepted = decoder_counts(run, PROMPT, 2, 2000, HOT, max_new_tokens=4)
    result = law_test(counts, exact_law(table, HOT))
    assert result.pvalue >= P_PASS, f"suffix + trie + sample-match: {result}"
    assert accepted > 100, f"the drafts were hardly accepted ({accepted})"


@pytest.mark.parametrize("verifier", ["sample-match", "rejection"])
def test_sampling_replays_plain_sampling_token_for_token(table_setup, verifier):
    """Retrieved drafts carry no q: `rejection` falls back to sample-and-match, step by step, so every
    request emits exactly the tokens plain sampling draws with the same seed."""
    plain, run = table_decoder(table_setup, "sample-match", "none"), table_decoder(table_setup, verifier)
    accepted = fallbacks = 0
    for seed in range(200):
        for d in (plain, run):
            d.sampling = SamplingParams(1.0, seed=seed)
        expected = plain.generate(PROMPT, max_new_tokens=4).tokens
        result = run.generate(PROMPT, max_new_tokens=4)
        assert result.tokens == expected, f"seed {seed}"
        accepted += result.metrics.accepted_draft_tokens
        fallbacks += result.metrics.fallback_steps
    assert accepted > 0
    assert (fallbacks > 0) == (verifier == "rejection")


class TestSuffixConformance(DrafterConformance):
    component = "suffix"


# --- persistence ---------------------------------------------------------------------------------------


def test_the_cache_persists_across_decoders(tiny, prompts, home):
    prompt, expected = prompts[0]
    first = decoder(tiny, "suffix(cache='chat')").generate(prompt, max_new_tokens=NEW)
    path = home / "chat.json"
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["responses"] == [expected]
    assert data["tokenizer"]["vocab_size"] == tiny.vocab_size
    assert not list(home.glob("*.tmp"))  # written through a temporary file, then renamed
    again = decoder(tiny, f"suffix(cache={str(path)!r})")  # the same file by its path
    assert again.pipeline.drafter.stats()["responses"] == 1
    warm = again.generate(prompt, max_new_tokens=NEW)
    assert warm.tokens == expected and warm.metrics.steps < first.metrics.steps
    assert len(json.loads(path.read_text())["responses"]) == 2


def test_a_cache_for_another_tokenizer_is_refused_and_kept(tiny, prompts, home):
    decoder(tiny, "suffix(cache='chat')").generate(prompts[0][0], max_new_tokens=8)
    path = home / "chat.json"
    before = path.read_bytes()
    other = tiny_llama(seed=2, vocab=64)
    with pytest.raises(SuffixCacheError, match=r"vocab 96.*vocab 64.*specframe cache clear chat"):
        SuffixDrafter(other, cache="chat")
    assert path.read_bytes() == before


CACHE_HEADER = '"tokenizer":{"name":"x","fingerprint":"raw-ids","vocab_size":96},"responses":['


@pytest.mark.parametrize("content,message,offered", [
    ('{"format":1,' + CACHE_HEADER + '[1, 2', "not valid JSON", True),
    ('{"format": 1, "tokenizer": {"name": "x", "fingerp', "not valid JSON", False),
    ('{"format": 1, "responses": [[1, 2', "not valid JSON", False),
    ('[1, 2, 3]', "not a specframe suffix cache", False),
    ('{"format": 1, "tokenizer": {"name": "x"}, "responses": []}', "tokenizer", False),
    ('{"format":1,' + CACHE_HEADER + '[1,96]]}', "token ids in", True),
    ('{"format": 1, "tokenizer": {"name": "x", "fingerprint": "raw-ids", "vocab_size": 96}, '
     '"responses": [[1, 96]]}', "token ids in", False),
    ('{"format":2,' + CACHE_HEADER + ']}', "newer than the format 1", True),
    ('{"format": 2, "tokenizer": {}, "responses": []}', "newer than the format 1", False),
])
def test_damaged_or_newer_caches_are_refused_and_kept(tiny, tmp_path, content, message, offered):
    """A file that starts with the exact header specframe writes is a cache: the error offers `cache
    clear`. Any other (even one starting with the same keys) is not offered for deletion, since `cache
    clear` would refuse it."""
    path = tmp_path / "mine.json"
    path.write_text(content)
    with pytest.raises(SuffixCacheError, match=message) as err:
        SuffixDrafter(tiny, cache=str(path))
    if offered:
        assert f"specframe cache clear {path}" in str(err.value)
    else:
        assert "`specframe cache clear` will not delete it" in str(err.value)
    assert path.read_text() == content


def test_options_are_checked(tiny, tmp_path):
    bad = [{"max_depth": 0}, {"max_cached": -1}, {"factor": -1.0}, {"min_prob": 1.5}, {"tree": "yes"},
           {"offset": float("nan")}, {"cache": "chat", "max_cached": 0}, {"cache": str(tmp_path / "x.txt")},
           {"cache": "bad name"}]
    for options in bad:
        with pytest.raises(ConfigurationError, match="suffix"):
            SuffixDrafter(tiny, **options)


def test_a_missing_or_changed_library_is_explained(tiny, monkeypatch):
    class Bare:
        pass

    with pytest.raises(ConfigurationError, match="arctic-inference 0.3.0"):
        check_internals(Bare(), type(None))
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    with pytest.raises(ConfigurationError, match="no-build-isolation arctic-inference==0.3.0"):
        SuffixDrafter(tiny)


# --- a REST datastore as a third source ----------------------------------------------------------------


@pytest.fixture(params=["tree", "search"])
def corpus_path(request, monkeypatch):
    """Both ways a corpus is drafted from: loaded into a suffix tree (small corpora) or searched in its
    suffix array (large ones; forced here by a size limit of 0)."""
    if request.param == "search":
        monkeypatch.setattr("specframe_suffix.corpus.TREE_TOKENS", 0)
    return request.param


def test_a_rest_corpus_is_a_third_labelled_source(tiny, prompts, tmp_path, corpus_path):
    from specframe_corpus.build import build_datastore
    from specframe_corpus.sources import TokenDocuments

    prompt, expected = prompts[1]
    store = tmp_path / "corpus"
    build_datastore(store, [TokenDocuments("answers", "ids", documents=[prompt + expected])], tiny,
                    progress=False)
    drafter = SuffixDrafter(tiny, corpus=str(store), max_cached=0)
    assert (drafter.corpora[0].tree is not None) == (corpus_path == "tree")
    assert (drafter.stats()["corpus_memory_bytes"] > 0) == (corpus_path == "tree")
    tokens = np.array(prompt + expected[:12])
    found = drafter.corpora[0].draft(tokens, 8, 1.0, 0.0, 0.1)  # the whole text matches: 8 tokens, p = 1
    assert list(found.tokens) == expected[12:20] and found.probs == [1.0] * 8 and found.group == 7
    proposal = drafter.propose(DraftContext(tokens, len(prompt), budget=8))
    node = -1
    for token in expected[12:20]:  # the corpus path is in the merged forest
        node = proposal.child(node, token)
        assert node is not None
    run = decoder(tiny, f"suffix(corpus={str(store)!r})")
    result = run.generate(prompt, max_new_tokens=NEW)
    assert result.tokens == expected and result.metrics.accepted_draft_tokens > 20


def test_both_corpus_paths_give_the_frequency_probabilities(tiny, tmp_path, corpus_path):
    """After "5 6", documents continue 7 8, 7 9 and 4, and one ends: each node is scored by the share of
    occurrences through it. The library's tree counts the occurrence at a document's end among them (the
    text may end there); the search skips it (it continues nowhere)."""
    from specframe_corpus.build import build_datastore
    from specframe_corpus.sources import TokenDocuments

    documents = [[3, 5, 6, 7, 8], [1, 5, 6, 7, 9], [2, 5, 6, 4], [5, 6]]
    build_datastore(tmp_path / "c", [TokenDocuments("c", "ids", documents=documents)], tiny, progress=False)
    drafter = SuffixDrafter(tiny, corpus=str(tmp_path / "c"), max_cached=0)
    found = drafter.corpora[0].draft(np.array([9, 9, 5, 6]), 8, 2.0, 0.0, 0.1)
    nodes = {(found.parents[i], t): p for i, (t, p) in enumerate(zip(found.tokens, found.probs))}
    first = {t: i for i, (t, parent) in enumerate(zip(found.tokens, found.parents)) if parent == -1}
    share = 1 / (4 if corpus_path == "tree" else 3)  # of the occurrences of "5 6"
    assert found.match_len == 2 and set(first) == {7, 4}
    assert nodes == pytest.approx({(-1, 7): 2 * share, (-1, 4): share, (first[7], 8): share,
                                   (first[7], 9): share})
    assert drafter.corpora[0].draft(np.array([7, 8]), 8, 2.0, 0.0, 0.1) is None  # nothing crosses a document


def test_several_corpora_are_each_drafted_from(tiny, prompts, tmp_path):
    from specframe_corpus.build import build_datastore
    from specframe_corpus.sources import TokenDocuments

    (first, first_out), (second, second_out) = prompts[0], prompts[1]
    for name, ids in (("a", first + first_out), ("b", second + second_out)):
        build_datastore(tmp_path / name, [TokenDocuments(name, "ids", documents=[ids])], tiny, progress=False)
    drafter = SuffixDrafter(tiny, corpus=(str(tmp_path / "a"), str(tmp_path / "b")), max_cached=0)
    assert len(drafter.corpora) == 2
    for prompt, expected in ((first, first_out), (second, second_out)):  # each store drafts its own text
        tokens = np.array(prompt + expected[:12])
        proposal = drafter.propose(DraftContext(tokens, len(prompt), budget=8))
        node = -1
        for token in expected[12:20]:
            node = proposal.child(node, token)
            assert node is not None
        drafter.reset()


def test_the_suffix_self_preset_says_which_datastore_is_missing_and_how_to_build_it(tiny, prompts, home):
    from specframe_corpus.build import build_datastore
    from specframe_corpus.sources import TokenDocuments
    from specframe_corpus.stores import datastore_home

    preset = get_registry().presets.get("suffix-self")
    assert "no datastore 'python-site'" in preset.unusable(tiny)
    prompt, expected = prompts[0]
    build_datastore(datastore_home() / "python-site", [TokenDocuments("a", "ids", documents=[prompt])], tiny,
                    progress=False)
    reason = preset.unusable(tiny)
    assert "no datastore 'self-chat'" in reason and "--source model:self" in reason
    build_datastore(datastore_home() / "self-chat", [TokenDocuments("b", "ids", documents=[expected])], tiny,
                    progress=False)
    assert preset.unusable(tiny) is None


@pytest.mark.parametrize("corpus", [(), 3, ("a", 3)])
def test_a_bad_corpus_option_is_refused(tiny, corpus):
    with pytest.raises(ConfigurationError, match="corpus must be a datastore name or path"):
        SuffixDrafter(tiny, corpus=corpus)


# --- the command line ----------------------------------------------------------------------------------


def test_cache_info_and_clear(tiny, prompts, home):
    from specframe.cli import build_app

    for name in ("chat", "code"):
        decoder(tiny, f"suffix(cache={name!r})").generate(prompts[0][0], max_new_tokens=8)
    cut = (home / "chat.json").read_text().index('"responses":[') + len('"responses":[[')
    (home / "broken.json").write_text((home / "chat.json").read_text()[:cut])  # a cache cut short
    runner, app = CliRunner(), build_app()
    listing = runner.invoke(app, ["cache", "info"])
    assert listing.exit_code == 0, listing.output
    assert "chat: 1 responses, 8 tokens" in listing.output and "broken: unreadable" in listing.output
    one = runner.invoke(app, ["cache", "info", "chat", "--json", "--memory"])
    report = json.loads(one.output)
    assert report["responses"] == 1 and report["tree_memory_bytes"] > 0
    assert report["tokenizer"]["name"].startswith(tiny.name)
    missing = runner.invoke(app, ["cache", "clear", "nope"])
    assert isinstance(missing.exception, SuffixCacheError) and "broken, chat, code" in str(missing.exception)
    assert runner.invoke(app, ["cache", "clear", "broken"]).exit_code == 0
    assert sorted(p.name for p in home.iterdir()) == ["chat.json", "code.json"]
    assert runner.invoke(app, ["cache", "clear"]).exit_code == 2  # neither a name nor --all
    cleared = runner.invoke(app, ["cache", "clear", "--all"])
    assert cleared.exit_code == 0 and "deleted 2 cache files" in cleared.output
    assert not list(home.iterdir())


def test_cache_errors_exit_2_with_a_message(home):
    env = {**os.environ, "SPECFRAME_HOME": str(home.parent), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "specframe.cli", "cache", "info", "nope"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "error: no suffix cache 'nope'" in out.stderr
    assert "Traceback" not in out.stderr
    assert Path(home).exists() is False  # reading never creates the directory
