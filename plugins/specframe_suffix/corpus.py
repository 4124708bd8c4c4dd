"""A REST datastore as a static source of the `suffix` drafter (SAM-Decoding's static + dynamic split).

The datastore is opened, checked against the target's tokenizer and searched by the `rest` plugin's own
code (`specframe_rest`): the longest suffix of the text found in the corpus, the continuations of up to
`SAMPLES` of its occurrences, merged into a frequency trie. Each continuation weighs 1 / (continuations),
so a node's score is the share of sampled occurrences that pass through it: an estimated probability of
reaching it, as the suffix trees give. The library's rules then apply as for its own trees: at most
`factor * match length + offset` nodes, none below `min_prob`.
"""

from __future__ import annotations

import numpy as np

from specframe import ConfigurationError, DraftProposal

SAMPLES = 256  # occurrences whose continuations are merged (REST's default k)


class CorpusSource:
    """Drafts from the REST datastore `corpus` (a name in the datastore directory, or a path)."""

    def __init__(self, corpus: str, target, max_depth: int):
        try:
            from specframe_rest.drafter import open_datastore, resolve_datastore
        except ImportError as err:
            raise ConfigurationError(
                f"suffix(corpus=...) drafts from a REST datastore and needs the rest plugin ({err}); "
                "install specframe with its plugins, or leave corpus unset") from None
        self.store, self.index = open_datastore(resolve_datastore(corpus, target), target)
        self.n_max = max_depth

    def draft(self, tokens: np.ndarray, budget: int, factor: float, offset: float, min_prob: float):
        """The corpus draft after `tokens` as a `SourceDraft`, or None when nothing matches."""
        from specframe_rest.retrieval import build_trie, top_nodes

        from specframe_suffix.drafter import CORPUS, SourceDraft

        match = self.index.longest_match(tokens[-self.n_max:], self.n_max, SAMPLES)
        cap = min(budget, int(match.length * factor + offset + 1e-6))  # the library's length rule
        if not len(match.starts) or cap < 1:
            return None
        rows = self.index.continuations(match.starts, cap)  # (S, cap)
        trie = build_trie(rows, np.full(len(rows), 1.0 / len(rows)))
        keep = np.flatnonzero(trie.scores >= min_prob)  # closed under parents: scores never increase
        if not len(keep):
            return None
        trie = top_nodes(DraftProposal(trie.tokens[keep], trie.kept_parents(keep), trie.scores[keep],
                                       score_kind=trie.score_kind), cap)
        return SourceDraft(CORPUS, trie.tokens.tolist(), trie.parents.tolist(), trie.scores.tolist(),
                           match.length)
