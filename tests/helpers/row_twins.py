"""Rows scored together against rows alone: what the tests of the batched state backends (`kv`'s
`KVRows`, `ssm-tree`'s `SSMRows`) drive, step by step."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specframe import TokenTree

Compare = Callable[[object, object], None]  # (together, alone): raises where they differ too much


def path_to(tree: TokenTree, node: int) -> list[int]:
    """The tree nodes from the root's child down to `node` (none for -1)."""
    return [] if node < 0 else [int(i) for i in np.flatnonzero(tree.ancestor_mask[node + 1][1:])]


class RowTwins:
    """A batch of `backend_cls` and, for each of its rows, a single-row backend fed the same prompts, trees
    and commits. Each step compares the rows' logits with `logits` and their hidden states with `hidden`
    (None: not compared; `worst` keeps the largest logit difference either way), and with `one_forward`
    checks that the batch scored every row in one forward of the model."""

    def __init__(self, target, backend_cls: type, *, logits: Compare | None = None,
                 hidden: Compare | None = None, one_forward: bool = False, **options):
        self.target, self.backend_cls, self.options = target, backend_cls, options
        self.logits, self.hidden, self.one_forward = logits, hidden, one_forward
        self.batch = backend_cls(target, **options).batch()
        self.alone: dict[int, object] = {}
        self.worst = 0.0  # the largest |logit difference| seen

    def add(self, ids: list[int]) -> int:
        row = self.batch.add(ids)
        self.alone[row] = self.backend_cls(self.target, **self.options)
        self.alone[row].prefill(ids)
        assert self.batch.committed_length(row) == len(ids) - 1
        return row

    def remove(self, row: int) -> None:
        self.batch.remove(row)
        del self.alone[row]

    def step(self, trees: dict[int, TokenTree], picks: dict[int, tuple[int, int]]) -> None:
        """Score `trees` together and alone, compare, commit the path to node `picks[row][0]` (-1: the
        root alone) with bonus `picks[row][1]` everywhere."""
        together, accepted = self._score_together(trees), {}
        for row, tree in trees.items():
            alone = self.alone[row].score(tree)
            assert together[row].logits.shape == alone.logits.shape == (len(tree) + 1, self.target.vocab_size)
            assert together[row].tree is tree
            self.worst = max(self.worst, float((together[row].logits - alone.logits).abs().max()))
            if self.logits is not None:
                self.logits(together[row].logits, alone.logits)
            if alone.hidden is not None and self.hidden is not None:
                self.hidden(together[row].hidden, alone.hidden)
            node, bonus = picks[row]
            accepted[row] = (together[row], path_to(tree, node), bonus)
            self.alone[row].commit(alone, path_to(tree, node), bonus)
        self.batch.commit(accepted)
        for row, backend in self.alone.items():
            assert self.batch.committed_length(row) == backend.committed_length

    def step_binary_trees(self, sizes, rng: np.random.Generator) -> None:
        """One step of binary trees of random tokens, of `sizes[i]` nodes for the i-th row (in row order),
        each row accepting the path to its last node and a random bonus."""
        vocab = self.target.vocab_size
        sizes = dict(zip(sorted(self.alone), sizes))
        trees = {row: TokenTree(rng.integers(0, vocab, n), np.arange(n) // 2 - 1) for row, n in sizes.items()}
        self.step(trees, {row: (int(n) - 1, int(rng.integers(0, vocab))) for row, n in sizes.items()})

    def _score_together(self, trees: dict[int, TokenTree]) -> dict:
        if not self.one_forward:
            return self.batch.score(trees)
        forwards = []
        hook = self.target.model.register_forward_hook(lambda *args: forwards.append(1))
        try:
            together = self.batch.score(trees)
        finally:
            hook.remove()
        assert len(forwards) == 1, f"{len(forwards)} forwards for one batch: every row belongs in one"
        return together
