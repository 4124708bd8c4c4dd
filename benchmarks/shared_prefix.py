"""How long a best-of-n sample follows an earlier sample of the same prompt, token for token.

    python benchmarks/shared_prefix.py results/bon              # a `specframe bench --repeats N` run

While a sample repeats an earlier sample's exact prefix, the target's next-token distribution at that
point was already computed (the earlier sample's verification step), so a drafter could propose its top
tokens with their exact probabilities. This script measures how often that holds: for every later sample
(repeat > 0) the longest prefix it shares with an earlier sample of its prompt, and the share of all
output positions whose whole prefix an earlier sample had already been through.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from specframe.bench.replay import open_run


def shared_prefix(tokens: list[int], earlier: list[list[int]]) -> int:
    """The longest prefix `tokens` shares with any of `earlier`."""
    best = 0
    for other in earlier:
        n = 0
        while n < min(len(other), len(tokens)) and other[n] == tokens[n]:
            n += 1
        best = max(best, n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a `specframe bench --out` directory with --repeats > 1")
    parser.add_argument("--method", default="baseline", help="the method whose samples are read")
    args = parser.parse_args()
    run = open_run(args.run, args.method)
    settings, turns = run.settings, run.turns
    earlier: dict[str, list[list[int]]] = defaultdict(list)
    shared, covered, total = [], 0, 0
    for turn in turns:
        if earlier[turn.qid]:
            n = shared_prefix(turn.tokens, earlier[turn.qid])
            shared.append(n)
            covered += min(n + 1, len(turn.tokens))  # positions 0..n have a prefix seen before
        total += len(turn.tokens)
        earlier[turn.qid].append(turn.tokens)
    if not shared:
        raise SystemExit(f"{args.run}: no prompt was sampled more than once (run the bench with --repeats)")
    s = np.array(shared)
    print(f"{args.run}: {len(turns)} samples of '{args.method}', temperature {settings['temperature']}")
    print(f"later samples: {len(s)}; prefix shared with an earlier sample: mean {s.mean():.1f}, "
          f"median {np.median(s):.0f}, max {s.max()} tokens; at least 5: {np.mean(s >= 5):.0%}, "
          f"10: {np.mean(s >= 10):.0%}, 20: {np.mean(s >= 20):.0%}")
    print(f"output positions whose whole prefix an earlier sample went through: {covered}/{total} "
          f"= {covered / total:.1%}")


if __name__ == "__main__":
    main()
