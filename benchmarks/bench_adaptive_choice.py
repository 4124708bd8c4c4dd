"""Time of the adaptive planner's per-step choice (`budget="auto"`) for a request alone: node features,
acceptance estimates, the search over kept sizes and cutting the tree, on frequency tries of 4-32
nodes. Its budget is well under 0.5 ms per step, a few percent of a small model's step on the CPU, so the
choice never eats what it saves; `docs/explanation/adaptive-speculation.md` quotes the result.

    python benchmarks/bench_adaptive_choice.py               # median and p99 over 2,000 calls per size
    pytest benchmarks/bench_adaptive_choice.py --benchmark-only
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from specframe.decode.adaptive import AdaptivePlanner
from specframe.terms.cost import MeasuredCost
from specframe.terms.proposal import DraftProposal
from specframe.terms.tree import TokenTree

SIZES = (4, 16, 32)
# A CPU-like cost curve: about 65 ms for the root alone, 200 ms at 32 nodes.
COST = MeasuredCost((0, 1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32), tuple(np.linspace(0.065, 0.2, 13)),
                    tuple(np.linspace(0.063, 0.2, 13)))


class OneSequence:
    """Prices a step as a backend of one sequence runs it: one forward of the root and the tree."""

    def forward_rows(self, sizes):
        return [n + 1 for n in sizes.values()]


def case(nodes: int, seed: int = 0):
    """One step's choice for a trie of 4 retrieved 12-token sequences cut to its first `nodes` nodes:
    a function that chooses, as the decode loop asks a row's plan and then the planner."""
    rng = np.random.default_rng(seed)
    proposal = DraftProposal.from_sequences([rng.integers(0, 50, 12) for _ in range(4)])
    tree = TokenTree.from_proposal(proposal, np.arange(nodes))
    planner = AdaptivePlanner(COST, cap=32)
    plan = planner.row()
    plan.start_request()

    def choose():
        plan.choose(proposal, tree)
        return planner.cut({0: tree}, {0: plan}, OneSequence())

    return choose


@pytest.mark.parametrize("nodes", SIZES)
def test_choice(benchmark, nodes):
    benchmark(case(nodes))


def main(calls: int = 2000) -> None:
    for nodes in SIZES:
        choose = case(nodes)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            choose()
            times.append(time.perf_counter() - start)
        print(f"{nodes:3d} nodes: median {1e6 * np.median(times):5.0f} us, "
              f"p99 {1e6 * np.percentile(times, 99):5.0f} us")


if __name__ == "__main__":
    main()
