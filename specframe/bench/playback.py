"""The target of a replay, played back from a recording: components that the one decode loop runs in place
of the target's backend and verifier (see `specframe.bench.replay`).

A `Playback` holds the recorded turn being replayed. `RecordedBackend` scores a tree without a forward:
its time is the calibrated step cost of the tree at the step's context, and its features (for drafters
that need hidden states) are the turn's teacher-forced ones. `RecordedVerifier` accepts the longest tree
path that the recorded continuation follows, with the next recorded token as the bonus: what any verifier
that emits the target's own tokens accepts. `ModelledTimer` times a step as a replay models it, and
`OraclePlanner` keeps of each tree only the path the recording accepts.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from specframe.contract.interfaces import BackendCapabilities, StateBackend, Verifier, VerifierCapabilities
from specframe.terms.cost import CostModel
from specframe.terms.metrics import PhaseTimer
from specframe.terms.records import TargetScores, VerifyResult
from specframe.terms.tree import TokenTree


@dataclass
class Playback:
    """The recorded turn a replay is at, and what the steps replayed so far of it would have cost.

    `cost` prices a step at its context; `oracle_cap`, when set, prices each (oracle) tree as the cheapest
    tree of up to that many nodes holding it (`oracle_seconds`)."""

    cost: CostModel
    oracle_cap: int | None = None
    tokens: Sequence[int] = ()  # what the target emitted in this turn
    features: torch.Tensor | None = None  # (L, H) teacher-forced over the turn, or None
    emitted: int = 0  # tokens of `tokens` committed so far
    forward_s: float = 0.0  # the modelled forward of the latest scored tree
    plain_s: float = 0.0  # plain decoding's modelled time for the tokens emitted so far in this turn

    def start(self, tokens: Sequence[int], features: torch.Tensor | None) -> None:
        """Replay a new turn whose target emitted `tokens` (`features`: row i predicted token i + 1)."""
        self.tokens, self.features = list(tokens), features
        self.emitted, self.forward_s, self.plain_s = 0, 0.0, 0.0

    @property
    def future(self) -> list[int]:
        """The recorded tokens not emitted yet."""
        return self.tokens[self.emitted:]


class RecordedBackend(StateBackend):
    """Scores trees by the recording: no forward runs, its time is modelled into `Playback.forward_s`."""

    name = "recorded"
    capabilities = BackendCapabilities(supports_trees=True, provides_hidden_states=True)

    def __init__(self, target, playback: Playback):
        super().__init__(target)
        self.playback = playback
        self._committed = 0

    @property
    def committed_length(self) -> int:
        return self._committed

    def prefill(self, ids: list[int]) -> None:
        self._committed = len(ids) - 1

    def score(self, tree: TokenTree) -> TargetScores:
        """Price `tree` at this step's context; the features at the root and every node, when the
        playback has them. The logits are empty: `RecordedVerifier` reads the recording instead."""
        play = self.playback
        here = play.cost.at_context(self._committed + 1)  # the step attends to the context and its root
        depth = int(tree.depth.max()) if len(tree) else 0
        play.forward_s = (oracle_seconds(len(tree), here, play.oracle_cap) if play.oracle_cap is not None
                          else here.step_seconds(len(tree), depth))
        hidden = None
        if play.features is not None:  # the root's at the context's end, a node's `depth` tokens further
            rows = np.minimum(self._committed + np.concatenate([[0], tree.depth]), len(play.features) - 1)
            hidden = play.features[torch.as_tensor(rows, device=play.features.device)]
        return self.issue(TargetScores(torch.empty(len(tree) + 1, 0), hidden, tree=tree, state=here))

    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        """Advance through the recording; count plain decoding's time for the tokens the turn keeps."""
        self.redeem(scored)
        play = self.playback
        kept = min(len(path) + 1, len(play.tokens) - play.emitted)
        play.plain_s += kept * scored.state.step_seconds(0, 0)  # plain steps, about this context
        play.emitted += len(path) + 1
        self._committed += len(path) + 1


class RecordedVerifier(Verifier):
    """Accepts the longest tree path the recorded continuation follows, then the next recorded token."""

    name = "recorded"
    capabilities = VerifierCapabilities(matches_draws=True)

    def __init__(self, playback: Playback):
        super().__init__()
        self.playback = playback

    def verify(self, tree, scores, sampling) -> VerifyResult:
        future = self.playback.future
        path = accepted_path(tree, future)
        return VerifyResult(path, future[len(path)])


class ModelledTimer(PhaseTimer):
    """A replayed step's time as the replay models it: drafting as it ran, the forward as `Playback`
    priced it, nothing else (verify, commit and the loop are not counted: the planner's overhead
    estimate then stays 0)."""

    def __init__(self, playback: Playback):
        super().__init__()
        self.playback = playback

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        if phase == "draft":
            self.times["draft"] = time.perf_counter() - start
        elif phase == "forward":
            self.times["forward"] = self.playback.forward_s

    def close(self) -> dict[str, float]:
        return self.times


class OraclePlanner:
    """`planner`, except that of each tree a row keeps only the path the recording accepts (what a
    planner that knew the target's next tokens would keep); the step is priced by `oracle_seconds`."""

    def __init__(self, planner, playback: Playback):
        self.planner, self.playback = planner, playback

    def __getattr__(self, name: str):
        return getattr(self.planner, name)

    def row(self) -> OracleRow:
        return OracleRow(self.planner.row(), self.playback)

    def cut(self, trees, plans, rows) -> dict:
        return {}  # each row kept its accepted path already


class OracleRow:
    """A row's plan of `OraclePlanner`: its planner's, but choosing the accepted path."""

    def __init__(self, plan, playback: Playback):
        self.plan, self.playback = plan, playback

    def __getattr__(self, name: str):
        return getattr(self.plan, name)

    def choose(self, proposal, tree: TokenTree) -> tuple[TokenTree, None]:
        return accepted_subtree(tree, self.playback.future), None


def accepted_path(tree: TokenTree, future: list[int]) -> list[int]:
    """The longest root path of `tree` whose tokens are a prefix of `future` (node indices)."""
    path, node = [], -1
    children = defaultdict(dict)
    for i, (token, parent) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist())):
        children[parent][token] = i
    while len(path) < len(future) and future[len(path)] in children[node]:
        node = children[node][future[len(path)]]
        path.append(node)
    return path


def accepted_subtree(tree: TokenTree, future: list[int]) -> TokenTree:
    """The `accepted_path` of `tree` alone, as a chain."""
    path = accepted_path(tree, future)
    return tree.subtree(np.array(path, np.int64)) if path else TokenTree.empty()


def oracle_seconds(accepted: int, cost: CostModel, cap: int) -> float:
    """A step whose tree holds the `accepted` path, priced as the cheapest tree of up to `cap` nodes that
    holds it (on CPUs where a few rows cost less than one, throwaway nodes can make a step cheaper)."""
    return min(cost.step_seconds(n, max(accepted, 1) if n else 0)
               for n in range(accepted, max(cap, accepted) + 1))


def oracle_choice(tree: TokenTree, future: list[int], cost: CostModel, cap: int) -> tuple[TokenTree, float]:
    """What a planner that knew the target's next tokens would keep of `tree`: the path the target
    accepts and nothing else, timed by `oracle_seconds`. (kept tree, seconds)"""
    kept = accepted_subtree(tree, future)
    return kept, oracle_seconds(len(kept), cost, cap)
