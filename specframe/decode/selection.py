"""Choosing, each step, the part of a draft tree that pays: the most expected tokens per second.

Let p_i be the probability that the target accepts node i given that it accepted i's parent (from the
`AcceptanceModel`). Node i is accepted with probability P_i = p_i P_parent(i) (P = 1 at the root), and
a step over a subtree S emits, in expectation, E(S) = 1 + sum_{i in S} P_i tokens (the bonus token
always comes). Its time is t(|S|, depth(S)) from the backend's cost model. The step is worth E(S) / t(S)
tokens per second, and we keep the S that maximises it, the empty tree (plain decoding) included.

Because P never increases from a parent to a child, the n nodes of largest P (ties broken by index, and
parents precede children) are closed under parents and maximise E among subtrees of n nodes. So the
search is a sort and a prefix sum over n = 0..N: microseconds for the trees we build.

`docs/explanation/adaptive-speculation.md` derives this and shows the measured cost curves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specframe.terms.cost import CostModel


@dataclass(frozen=True)
class Choice:
    """The kept nodes (sorted indices of the tree) and what the models predict for the step."""

    keep: np.ndarray  # (n,) int64, closed under parents
    expected_tokens: float  # E(S): emitted tokens, bonus included
    expected_seconds: float  # t(S) from the cost model


def path_probabilities(parents: np.ndarray, conditional: np.ndarray) -> np.ndarray:
    """P_i = p_i * P_parent(i) for nodes in topological order; (N,) -> (N,)."""
    path = np.empty(len(parents), np.float64)
    for i, p in enumerate(parents.tolist()):
        path[i] = conditional[i] * (path[p] if p >= 0 else 1.0)
    return path


def choose_subtree(parents: np.ndarray, depth: np.ndarray, conditional: np.ndarray, cost: CostModel,
                   prefix_only: bool = False, overhead_s: float = 0.0) -> Choice:
    """The subtree S (closed under parents) of largest E(S) / t(S), with its predicted tokens and time.

    `prefix_only` restricts S to the first n nodes in index order: what a sampled tree verified with its
    draft probabilities allows (the kept nodes must not depend on the drawn tokens; see
    `specframe.terms.tree.draw_order_prefix`), with `conditional` then taken from draw positions only.
    `overhead_s` is added to every step's predicted time (what a step costs besides the forward).
    """
    n = len(parents)
    path = path_probabilities(parents, conditional)
    order = np.arange(n) if prefix_only else np.lexsort((np.arange(n), -path))  # (N,) best first
    tokens = 1.0 + np.concatenate([[0.0], np.cumsum(path[order])])  # (N + 1,) E for n = 0..N
    depths = np.concatenate([[0], np.maximum.accumulate(depth[order])]) if n else np.zeros(1, np.int64)
    seconds = cost.many(np.arange(n + 1), depths) + overhead_s  # (N + 1,)
    rate = tokens / np.maximum(seconds, 1e-12)
    best = int(np.argmax(rate))
    return Choice(np.sort(order[:best]), float(tokens[best]), float(seconds[best]))
