"""REST retrieval and trie selection against brute force, on random corpora (hypothesis)."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from specframe_corpus.build import build_datastore
from specframe_corpus.datastore import Datastore
from specframe_corpus.retrieval import PAD, SuffixIndex, build_trie, context_continuations, top_nodes
from specframe_corpus.sources import TokenDocuments
from specframe_trees.trie import TrieTreeBuilder

from specframe import BuildContext, DraftProposal


def ids_target(vocab: int):
    return SimpleNamespace(name=f"ids-{vocab}", tokenizer=None, vocab_size=vocab)


_TMP_DIR = tempfile.TemporaryDirectory(prefix="rest-test-")  # removed when the session ends


def open_store(docs: list[list[int]], vocab: int) -> Datastore:
    out = Path(tempfile.mkdtemp(dir=_TMP_DIR.name)) / "store"
    build_datastore(out, [TokenDocuments("test", "ids", documents=docs)], ids_target(vocab), progress=False)
    return Datastore.open(out)


@st.composite
def corpora(draw):
    """Documents over a tiny alphabet (many repeats), mapped to ids that may exceed 65,535."""
    big = draw(st.booleans())
    vocab = 70_000 if big else 50
    alphabet = draw(st.integers(2, 5))
    ids = [65_534, 65_535, 65_536, 69_999, 3][:alphabet] if big else list(range(alphabet))
    docs = draw(st.lists(st.lists(st.sampled_from(ids), min_size=0, max_size=30), min_size=1, max_size=6))
    if not any(docs):
        docs.append([ids[0]])
    query = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=20))
    return docs, query, vocab


def brute_force(docs: list[list[int]], query: list[int], n_max: int, m: int):
    """Longest suffix of `query` occurring in one document followed by a token of that document, and the
    continuations (at most m tokens, cut at the document's end) of all its occurrences."""
    for n in range(min(n_max, len(query)), 0, -1):
        pattern = query[-n:]
        found = [
            tuple(doc[s + n : s + n + m])
            for doc in docs
            for s in range(len(doc) - n)
            if doc[s : s + n] == pattern
        ]
        if found:
            return n, sorted(found)
    return 0, []


def as_tuples(rows: np.ndarray) -> list[tuple[int, ...]]:
    return sorted(tuple(int(t) for t in row if t != PAD) for row in rows)


@settings(max_examples=60, deadline=None)
@given(corpus=corpora(), n_max=st.integers(1, 16), m=st.integers(1, 6))
def test_longest_match_equals_brute_force(corpus, n_max, m):
    docs, query, vocab = corpus
    store = open_store(docs, vocab)
    assert store.tokens.dtype == (np.uint32 if vocab > 65_535 else np.uint16)
    index = SuffixIndex.of(store)
    match = index.longest_match(np.array(query), n_max, k=10_000)
    length, expected = brute_force(docs, query, n_max, m)
    assert match.length == length
    assert as_tuples(index.continuations(match.starts, m)) == expected


@settings(max_examples=30, deadline=None)
@given(corpus=corpora(), k=st.integers(1, 4))
def test_spread_sample_takes_distinct_real_matches(corpus, k):
    docs, query, vocab = corpus
    index = SuffixIndex.of(open_store(docs, vocab))
    match = index.longest_match(np.array(query), 16, k)
    length, expected = brute_force(docs, query, 16, 4)
    if match.count <= 4 * k:
        assert len(match.starts) == min(k, len(expected))
    else:
        assert 1 <= len(match.starts) <= k
    assert len(set(match.starts.tolist())) == len(match.starts)
    got = as_tuples(index.continuations(match.starts, 4))
    assert all(row in expected for row in got)


def test_spread_sample_covers_the_whole_range():
    """With many matches, the sample spans the interval instead of its lexicographic start."""
    docs = [[1, 2] + [i % 7 + 10] for i in range(700)]  # "1 2" followed by 7 different tokens
    index = SuffixIndex.of(open_store(docs, 50))
    match = index.longest_match(np.array([1, 2]), 16, k=7)
    assert match.count == 700
    assert sorted(index.continuations(match.starts, 1)[:, 0].tolist()) == list(range(10, 17))


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    n_max=st.integers(1, 16),
    m=st.integers(1, 5),
    k=st.integers(1, 50),
)
def test_live_context_matches_equal_brute_force(tokens, n_max, m, k):
    length, rows = context_continuations(np.array(tokens), n_max, m, k)
    n = len(tokens)
    expected_len, ends = 0, []
    for size in range(min(n_max, n - 1), 0, -1):
        ends = [j for j in range(size - 1, n - 1) if tokens[j - size + 1 : j + 1] == tokens[n - size :]]
        if ends:
            expected_len = size
            break
    assert length == expected_len
    expected = [tuple(tokens[j + 1 : j + 1 + m]) for j in sorted(ends, reverse=True)[:k]]
    assert [tuple(int(t) for t in row if t != PAD) for row in rows] == expected


def canonical(proposal: DraftProposal) -> dict[tuple[int, ...], float]:
    """path of tokens -> score, independent of node numbering."""
    paths: dict[int, tuple[int, ...]] = {}
    for i, (tok, parent) in enumerate(zip(proposal.tokens.tolist(), proposal.parents.tolist())):
        paths[i] = (paths[parent] if parent >= 0 else ()) + (tok,)
    return {paths[i]: round(float(s), 9) for i, s in enumerate(proposal.scores)}


rows_strategy = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(rows=rows_strategy, weights=st.lists(st.integers(1, 4), min_size=8, max_size=8))
def test_vectorized_trie_equals_from_sequences(rows, weights):
    weights = weights[: len(rows)]
    width = max(len(r) for r in rows)
    padded = np.array([r + [PAD] * (width - len(r)) for r in rows])
    got = build_trie(padded, np.array(weights, float))
    assert np.all(got.parents < np.arange(len(got)))
    assert canonical(got) == canonical(DraftProposal.from_sequences(rows, weights))


def closed_subsets(proposal: DraftProposal, size: int):
    for subset in itertools.combinations(range(len(proposal)), size):
        chosen = set(subset)
        if all(proposal.parents[i] < 0 or proposal.parents[i] in chosen for i in subset):
            yield subset


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, weights=st.lists(st.integers(1, 4), min_size=8, max_size=8), c=st.integers(1, 8))
def test_top_c_equals_brute_force(rows, weights, c):
    weights = weights[: len(rows)]
    width = max(len(r) for r in rows)
    trie = build_trie(np.array([r + [PAD] * (width - len(r)) for r in rows]), np.array(weights, float))
    if len(trie) > 11:
        trie = top_nodes(trie, 11)  # keep the exhaustive search small
    size = min(c, len(trie))
    best = max(sum(trie.scores[list(s)]) for s in closed_subsets(trie, size))
    chosen = top_nodes(trie, c)
    assert len(chosen) == size and np.all(chosen.parents < np.arange(size))
    assert np.isclose(chosen.scores.sum(), best)
    # the `trie` tree builder selects the very same nodes (same tie-breaking)
    tree = TrieTreeBuilder().build(trie, BuildContext(c))
    assert (
        canonical(DraftProposal(tree.tokens, tree.parents, np.zeros(len(tree)))).keys()
        == canonical(chosen).keys()
    )


def test_trie_builder_is_deterministic_on_ties_and_respects_parents():
    # non-monotone scores: a low parent with a high child; the child only comes after its parent
    proposal = DraftProposal(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 1]), np.array([1.0, 1.0, 9.0, 1.0]))
    tree = TrieTreeBuilder().build(proposal, BuildContext(2))
    assert tree.tokens.tolist() == [5, 7] and tree.parents.tolist() == [-1, 0]
    tree = TrieTreeBuilder().build(proposal, BuildContext(3))
    assert tree.tokens.tolist() == [5, 6, 7]
