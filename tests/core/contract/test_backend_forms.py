"""The two forms of `StateBackend`: a backend written as rows (`batch()` alone) decodes one sequence as a
batch of one row; a backend written as one sequence is batched by `RowByRow`, and decodes requests one
at a time as its own row (`OneRow`); a backend that writes neither is refused when its class is made,
before anything registers it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specframe import BackendCapabilities, BatchBackend, RowByRow, StateBackend, TargetScores, TokenTree
from specframe.contract.batch import OneRow
from specframe.testing.targets import tiny_target


class CountingRows(BatchBackend):
    """Rows whose logits say how many tokens a row holds, so a test can tell rows apart."""

    def __init__(self, backend):
        super().__init__(backend)
        self.tokens: dict[int, list[int]] = {}
        self.issued: dict[int, TargetScores] = {}

    def add(self, ids):
        row = len(self.tokens)
        self.tokens[row] = list(ids)
        return row

    def remove(self, row):
        del self.tokens[row]

    def committed_length(self, row):
        return len(self.tokens[row]) - 1

    def score(self, trees):
        self.issued = {row: TargetScores(logits=torch.full((len(tree) + 1, 4), float(len(self.tokens[row]))),
                                         tree=tree) for row, tree in trees.items()}
        return dict(self.issued)

    def commit(self, accepted):
        for row, (scored, path, bonus) in accepted.items():
            if self.issued.get(row) is not scored:
                raise ValueError("stale scores")
            self.tokens[row] += [int(scored.tree.tokens[i]) for i in path] + [bonus]
        self.issued = {}


class RowsOnly(StateBackend):
    name = "rows-only"
    capabilities = BackendCapabilities(supports_trees=True)

    def batch(self):
        return CountingRows(self)


def test_a_backend_written_as_rows_decodes_one_sequence_as_one_row():
    backend = RowsOnly(tiny_target(seed=0, vocab_size=8))
    backend.prefill([1, 2, 3])
    assert backend.committed_length == 2
    tree = TokenTree(np.array([5, 6]), np.array([-1, 0]))
    scored = backend.score(tree)
    assert scored.logits.shape == (3, 4) and float(scored.logits[0, 0]) == 3.0
    backend.commit(scored, [0, 1], 7)
    assert backend.committed_length == 5  # the root and two nodes; 7 is pending
    with pytest.raises(ValueError, match="stale"):
        backend.commit(scored, [0], 7)
    backend.prefill([4])  # a new sequence: a new batch of one row
    assert backend.committed_length == 0


def test_scoring_before_a_sequence_starts_says_to_prefill_first():
    with pytest.raises(RuntimeError, match=r"prefill\(prompt_ids\) first"):
        RowsOnly(tiny_target(seed=0, vocab_size=8)).score(TokenTree.empty())


def test_a_backend_written_as_one_sequence_is_batched_row_by_row():
    class OneSequence(StateBackend):
        name = "one-sequence"
        capabilities = BackendCapabilities(fresh_state_per_copy=True)
        committed_length = 0

        def prefill(self, ids):
            pass

        def score(self, tree):
            pass

        def commit(self, scored, path, bonus):
            pass

    backend = OneSequence(tiny_target(seed=0, vocab_size=8))
    assert isinstance(backend.batch(), RowByRow) and isinstance(backend.rows(4), RowByRow)
    one = backend.rows(1)  # requests one at a time: the backend itself is the row, nothing copied
    assert isinstance(one, OneRow) and one.backend is backend


def test_requests_one_at_a_time_on_a_backend_written_as_rows_are_a_batch_of_one_row():
    backend = RowsOnly(tiny_target(seed=0, vocab_size=8))
    assert isinstance(backend.rows(1), CountingRows) and isinstance(backend.rows(3), CountingRows)


@pytest.mark.parametrize("written", [(), ("prefill", "score", "commit")])
def test_a_backend_that_writes_neither_form_is_refused_when_its_class_is_made(written):
    methods = {name: lambda self, *args: None for name in written}
    with pytest.raises(TypeError, match=r"backend 'half' implements neither form.*override batch\(\)"):
        type("Half", (StateBackend,), {"name": "half", **methods})
