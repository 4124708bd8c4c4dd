"""Retrieval (REST Algorithm 1) and the frequency trie (Algorithm 2), vectorized.

Longest suffix match. The datastore indexes the *reversed* corpus R, so the last n context tokens,
read backwards, are a prefix of the reversed suffixes that match them. All suffixes sharing that prefix
form one suffix-array interval, and matching one more context token narrows that interval with two
binary searches inside it. So the longest match for n = 1..16 costs one bucket lookup and at most 15
narrowings of a shrinking interval, instead of 15 independent searches of the whole array (published
REST). A suffix starting at reversed position r continues at forward position `len(corpus) - r`.

Continuations. Up to `k` matches are taken evenly spaced over the whole interval (the interval is
sorted by the text *before* the match, so this is a stratified sample of all occurrences, not the
lexicographically first `k`); each gives the next `m` tokens, cut at its document's end.

Trie. The continuations (corpus and live context, each source normalized and weighted) are merged
into one trie by sorting them; a node's score is the total weight of the continuations through it, so
scores never increase from parent to child, and the best `c` nodes by (score, trie order) are closed
under parents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specframe import DraftProposal, ScoreKind
from specframe_corpus.datastore import BUILD_HINT, SUFFIXES, DatastoreError

PAD = -1  # marks positions after a continuation's end in a (rows, m) array


@dataclass
class Match:
    """The longest suffix match: `length` context tokens, matched at `count` corpus positions, whose
    continuations start at the forward positions `starts` (a spread sample of at most k of them)."""

    length: int
    count: int
    starts: np.ndarray  # (<= k,) int64


NO_MATCH = Match(0, 0, np.zeros(0, np.int64))


class SuffixIndex:
    """Longest-suffix-match queries over a datastore's token array and reversed suffix array."""

    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray, buckets: np.ndarray, separator: int):
        self.tokens, self.suffixes, self.buckets, self.separator = tokens, suffixes, buckets, separator
        self.n = len(tokens)
        # memoryviews index several times faster than numpy scalars in the binary searches' Python loops
        self._tok = memoryview(np.asarray(tokens))
        self._sa = memoryview(np.asarray(suffixes))

    @classmethod
    def of(cls, store) -> SuffixIndex:
        return cls(store.tokens, store.suffixes, store.buckets, store.separator)

    def intervals(self, query: np.ndarray, n_max: int) -> list[tuple[int, int]]:
        """[lo, hi) suffix-array intervals of the last 1, 2, ... tokens of `query`, up to the first empty."""
        found: list[tuple[int, int]] = []
        if len(query) == 0 or not 0 <= query[-1] < self.separator:
            return found
        last = int(query[-1])
        lo, hi = int(self.buckets[last]), int(self.buckets[last + 1])
        depth = 1
        while lo < hi:
            found.append((lo, hi))
            if depth >= min(n_max, len(query), self.n - 2):  # no match is longer than the corpus
                break
            lo, hi = self._narrow(lo, hi, depth, int(query[-1 - depth]))
            depth += 1
        return found

    def _narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int]:
        """Sub-interval of [lo, hi) whose reversed suffixes have `token` at offset `depth`.

        All suffixes in [lo, hi) share their first `depth` tokens (none a separator), so the token at
        offset `depth` is inside the corpus (the reversed corpus ends with a separator) and sorted.
        """
        tok, sa, end = self._tok, self._sa, self.n - 1 - depth  # R[r + depth] == tokens[end - r]
        a, b = lo, hi
        while a < b:
            mid = (a + b) >> 1
            if tok[end - sa[mid]] < token:
                a = mid + 1
            else:
                b = mid
        first, b = a, hi
        while a < b:
            mid = (a + b) >> 1
            if tok[end - sa[mid]] <= token:
                a = mid + 1
            else:
                b = mid
        return first, a

    def longest_match(self, query: np.ndarray, n_max: int, k: int) -> Match:
        """The longest suffix of `query` (at most `n_max` tokens) that occurs followed by a token of the
        same document, with up to `k` continuation starts spread evenly over its occurrences.

        Occurrences at a document's end continue nowhere and are skipped: exactly when the interval holds
        at most `4 k` entries, and from the spread sample (so a few fewer than `k` may remain) above that.
        """
        for length, (lo, hi) in reversed(list(enumerate(self.intervals(query, n_max), 1))):
            exact = hi - lo <= 4 * k
            pick = np.arange(lo, hi) if exact else lo + (np.arange(k) * (hi - lo)) // k  # (<= 4k,)
            starts = self._starts(self.suffixes[pick])
            starts = starts[self.tokens[starts] != self.separator]
            if not len(starts) and not exact:
                starts = self._continuing(lo, hi)
            if len(starts):
                return Match(length, hi - lo, spread(starts, k))
        return NO_MATCH

    def _continuing(self, lo: int, hi: int) -> np.ndarray:
        """Starts of the occurrences in [lo, hi) that continue (rarely needed: only when a whole spread
        sample ended documents), scanned in blocks."""
        for s in range(lo, hi, 1 << 16):
            starts = self._starts(self.suffixes[s : min(hi, s + (1 << 16))])
            starts = starts[self.tokens[starts] != self.separator]
            if len(starts):
                return starts
        return starts

    def _starts(self, entries: np.ndarray) -> np.ndarray:
        """The forward positions where the suffixes `entries` (of one token's interval) continue. Opening
        a store checked that every entry is inside the corpus; an entry 0 (the corpus's final separator,
        which no token's interval holds) means a suffix array damaged past the sample that was checked."""
        starts = self.n - entries.astype(np.int64)
        if len(starts) and starts.max() >= self.n:
            raise DatastoreError(f"datastore: {SUFFIXES} puts the end of the corpus among the matches of a "
                                 f"token: the file is corrupt; {BUILD_HINT} (`specframe datastore info "
                                 "--verify` compares every file with its recorded digest)")
        return starts

    def continuations(self, starts: np.ndarray, m: int) -> np.ndarray:
        """(len(starts), m) int64: the m tokens from each start, PAD from the document's end on."""
        idx = np.minimum(starts[:, None] + np.arange(m), self.n - 1)  # (S, m); tokens[n - 1] is a separator
        rows = self.tokens[idx].astype(np.int64)  # (S, m)
        rows[np.logical_or.accumulate(rows == self.separator, axis=1)] = PAD
        return rows


def spread(values: np.ndarray, k: int) -> np.ndarray:
    """At most `k` of `values`, evenly spaced over the whole array."""
    return values if len(values) <= k else values[(np.arange(k) * len(values)) // k]


def context_continuations(tokens: np.ndarray, n_max: int, m: int, k: int) -> tuple[int, np.ndarray]:
    """The live store: longest suffix of `tokens` that occurs earlier in `tokens`, and the (<= k, m)
    continuations of its most recent occurrences (PAD-filled where the text ends)."""
    n = len(tokens)
    ends = np.flatnonzero(tokens[: n - 1] == tokens[-1])  # candidate match ends, each followed by a token
    length = 1 if len(ends) else 0
    while len(ends) and length < min(n_max, n - 1):
        room = ends[ends >= length]  # matches that can extend one token to the left
        longer = room[tokens[room - length] == tokens[n - 1 - length]]
        if not len(longer):
            break
        ends, length = longer, length + 1
    if not length:
        return 0, np.zeros((0, m), np.int64)
    starts = ends[::-1][:k] + 1  # most recent first
    idx = starts[:, None] + np.arange(m)  # (S, m)
    rows = np.where(idx < n, tokens[np.minimum(idx, n - 1)], PAD).astype(np.int64)
    return length, rows


def build_trie(rows: np.ndarray, weights: np.ndarray) -> DraftProposal:
    """Merge PAD-terminated token rows into a trie; a node's score is the weight of the rows through it.

    Nodes are numbered by depth, then by token path in sorted order (parents before children). This is
    `DraftProposal.from_sequences` computed with a sort instead of a Python loop over every token.
    """
    if rows.size == 0:
        return DraftProposal.empty()
    k, m = rows.shape
    order = np.lexsort(rows.T[::-1])  # rows sorted lexicographically, first column first
    rows, weights = rows[order], weights[order]  # (k, m), (k,)
    new = np.ones((k, m), bool)  # new[i, d]: row i starts a new prefix of length d + 1
    new[1:] = np.logical_or.accumulate(rows[1:] != rows[:-1], axis=1)
    node_mask = (new & (rows != PAD)).T  # (m, k) depth-major
    ids = np.full((m, k), -1, np.int64)
    ids[node_mask] = np.arange(int(node_mask.sum()))
    group = np.maximum.accumulate(ids, axis=1)  # (m, k) node holding row i at depth d
    depth, row = np.nonzero(node_mask)  # both (N,), already in node order
    parents = np.where(depth > 0, group[np.maximum(depth - 1, 0), row], -1)
    flat_new = np.flatnonzero(new.T.reshape(-1))  # group starts, depth-major
    nxt = np.append(flat_new[1:], m * k)
    pos = np.searchsorted(flat_new, depth * k + row)  # (N,) index of each node's own group start
    ends = np.minimum(nxt[pos] - depth * k, k)  # (N,) first row after the node's group
    cum = np.concatenate([[0.0], np.cumsum(weights)])
    return DraftProposal(rows[row, depth], parents, cum[ends] - cum[row], score_kind=ScoreKind.FREQUENCY)


def top_nodes(proposal: DraftProposal, c: int) -> DraftProposal:
    """The `c` best nodes by (score desc, index asc), renumbered. For scores that never increase from
    parent to child (frequency tries) the result is closed under parents and is the exact top-c."""
    if len(proposal) <= c:
        return proposal
    keep = np.sort(np.lexsort((np.arange(len(proposal)), -proposal.scores))[:c])  # (c,)
    return proposal.subtree(keep)
