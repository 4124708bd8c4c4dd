"""A REST datastore as a static source of the `suffix` drafter (SAM-Decoding's static + dynamic split).

The datastore is opened and checked against the target's tokenizer by the shared corpus package
(`specframe_corpus.stores`). It is then searched in one of two ways, by its size:

- A small corpus (at most `TREE_TOKENS` tokens, such as the target's own answers in `self-chat`) is loaded
  into one of the library's suffix trees, each document a sequence, and drafted from as the library drafts
  from earlier responses: its native matching takes a small fraction of the time of the suffix-array
  search and trie below, and replays give the same tau. The tree costs about 360 bytes per token (58 MiB
  for `self-chat`'s 162,000), which is why large corpora are not loaded.
- A large corpus is searched in its memory-mapped suffix array (`specframe_corpus.retrieval`): the longest
  suffix of the text found in the corpus, the continuations of up to `SAMPLES` of its occurrences, merged
  into a frequency trie. Each continuation weighs 1 / (continuations), so a node's score is the share of
  sampled occurrences that pass through it: an estimated probability of reaching it, as the suffix trees
  give. The library's rules then apply as for its own trees: at most `factor * match length + offset`
  nodes, none below `min_prob`.

The two differ in one count: an occurrence at a document's end is one of the occurrences a tree node's
probability is a share of (the text may end there), while the search skips it (it continues nowhere).
`tests/plugins/suffix/test_suffix.py` checks both paths on the same corpus.
"""

from __future__ import annotations

import numpy as np

from specframe_corpus.retrieval import build_trie, top_nodes
from specframe_corpus.stores import open_datastore, resolve_datastore
from specframe_suffix.drafts import CORPUS, SourceDraft

SAMPLES = 256  # occurrences whose continuations are merged (REST's default k)
TREE_TOKENS = 1 << 20  # corpora of at most this many tokens are loaded into a suffix tree (about 380 MiB)


class CorpusSource:
    """Drafts from the REST datastore `corpus` (a name in the datastore directory, or a path); a corpus of
    at most `TREE_TOKENS` tokens through the library's suffix tree (`tree_class`, of depth `max_depth`)."""

    def __init__(self, corpus: str, target, max_depth: int, tree_class):
        self.store, self.index = open_datastore(resolve_datastore(corpus, target), target)
        self.n_max = max_depth
        self.tree = (load_tree(self.store.tokens, self.store.separator, tree_class(max_depth))
                     if len(self.store.tokens) <= TREE_TOKENS else None)
        # the library's estimate walks every node; the corpus never changes, so it is taken once
        self.memory_bytes = 0 if self.tree is None else int(self.tree.estimate_memory())

    def draft(self, tokens: np.ndarray, budget: int, factor: float, offset: float, min_prob: float):
        """The corpus draft after `tokens` as a `SourceDraft`, or None when nothing matches."""
        if self.tree is not None:
            window = np.ascontiguousarray(tokens[-self.n_max:], dtype=np.int32)
            draft = self.tree.speculate_ndarray(window, budget, factor, offset, min_prob, True)
            token_ids = draft.token_ids  # each attribute read copies the native vector
            return (SourceDraft(CORPUS, token_ids, draft.parents, draft.probs, draft.match_len)
                    if token_ids else None)
        return self._search(tokens, budget, factor, offset, min_prob)

    def _search(self, tokens: np.ndarray, budget: int, factor: float, offset: float, min_prob: float):
        """The draft from the suffix array: longest match, sampled continuations, frequency trie."""
        match = self.index.longest_match(tokens[-self.n_max:], self.n_max, SAMPLES)
        cap = min(budget, int(match.length * factor + offset + 1e-6))  # the library's length rule
        if not len(match.starts) or cap < 1:
            return None
        rows = self.index.continuations(match.starts, cap)  # (S, cap)
        trie = build_trie(rows, np.full(len(rows), 1.0 / len(rows)))
        keep = np.flatnonzero(trie.scores >= min_prob)  # closed under parents: scores never increase
        if not len(keep):
            return None
        trie = top_nodes(trie.subtree(keep), cap)
        return SourceDraft(CORPUS, trie.tokens.tolist(), trie.parents.tolist(), trie.scores.tolist(),
                           match.length)


def load_tree(tokens: np.ndarray, separator: int, tree):
    """`tree` holding each document of the datastore's token array (SEP doc SEP doc ... SEP) as a sequence."""
    cuts = np.flatnonzero(np.asarray(tokens) == separator)  # (D + 1,) the separators framing D documents
    for seq, (start, end) in enumerate(zip(cuts[:-1] + 1, cuts[1:])):
        if end > start:
            tree.extend_ndarray(seq, np.ascontiguousarray(tokens[start:end], dtype=np.int32))
    return tree
