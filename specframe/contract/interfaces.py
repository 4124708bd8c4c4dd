"""The four component interfaces. Plugins subclass these and register the classes through hooks.

Each class has a `name` (the registry key) and declared capabilities (`specframe.contract.capabilities`,
re-exported here), checked when a pipeline is assembled (`specframe.plugging.pipeline.assemble`), never
inferred from the name. A state backend is handed its calibration when it is built
(`specframe.contract.calibration.Calibration`). A class that needs another component declares it in
`requires` (checked at assembly; obtained through `specframe.kit.components.required`).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from specframe.contract.batch import BatchBackend, Commit, OneRow, RowByRow  # noqa: F401 (re-exported)
from specframe.contract.calibration import Calibration
from specframe.contract.capabilities import (
    BackendCapabilities, DrafterCapabilities, TreeBuilderCapabilities, VerifierCapabilities,
)
from specframe.terms.cost import CostModel
from specframe.terms.kinds import ComponentKind
from specframe.terms.proposal import DraftContext, DraftProposal
from specframe.terms.records import StepOutcome, TargetScores, VerifyResult
from specframe.terms.sampling import Sampler
from specframe.terms.tree import TokenTree

if TYPE_CHECKING:
    from specframe.terms.target import Target


class Drafter(ABC):
    """Proposes draft tokens for the next step. Constructed as `cls(target, **options)`."""

    name: ClassVar[str]
    capabilities: ClassVar[DrafterCapabilities] = DrafterCapabilities()
    requires: ClassVar[tuple[tuple[ComponentKind | str, str], ...]] = ()  # (kind, name) it needs

    def __init__(self, target: Target, **options):
        self.target = target
        if options:
            raise TypeError(f"drafter '{self.name}' takes no options, got {sorted(options)}")

    @abstractmethod
    def propose(self, context: DraftContext) -> DraftProposal:
        """Candidate tokens following `context.tokens`; `DraftProposal.empty()` when there are none."""

    @classmethod
    def example_options(cls, target: Target, workdir: str) -> dict:
        """Options that make this drafter work on any `target` (e.g. a small datastore built in `workdir`).

        Used by conformance tests and demos that try every registered drafter. Default: none needed.
        """
        return {}

    def observe(self, outcome: StepOutcome) -> None:
        """Called after every step with what the target accepted. Default: nothing."""

    def reset(self) -> None:
        """Called before each new request. Default: nothing."""

    def spawn(self) -> Drafter:
        """A drafter for another request decoded at the same time (another row of a batch): it shares
        what serves every request (weights, a datastore, a cache of earlier responses, which then learns
        each finished row through `finish`) and owns its per-request state, so rows drafting in turns
        propose what each would alone. `reset` is called on it before its request.

        Default: a shallow copy. Right when `reset` and every per-request update assign new objects
        rather than change shared ones in place; a drafter that changes per-request state in place
        overrides this (`specframe.testing.check_batch_rows` tests it)."""
        return copy.copy(self)

    def finish(self, prompt: Sequence[int], response: Sequence[int]) -> None:
        """Called once when a request this drafter drafted for ends, whatever ended it (EOS, a stop string,
        the length limit): `prompt` holds the request's prompt ids and `response` its new tokens, exactly
        `GenerationResult.tokens` (tokens verified past the end are not in it). A drafter with memory
        across requests learns the response here (`suffix` adds it to its cache of earlier responses).
        Called after the result is complete, before the `on_decode_end` observers see it.

        A request that raises ends without `finish`: the next `reset` finds what the failed request left
        and decides whether to keep it (`suffix` keeps the tokens emitted until the error) or drop it.
        An exception `finish` raises reaches the caller of `generate`. Default: nothing."""

    def remember(self, prompt: Sequence[int], response: Sequence[int]) -> None:
        """A request decoded elsewhere answered `prompt` with `response`: a resumed benchmark replays its
        recorded requests here, so that a drafter which `remembers_requests` holds what it would have
        held had the run not stopped. Default: nothing (a drafter without memory across requests)."""


@dataclass(frozen=True)
class BuildContext:
    """What a tree builder may weigh besides the proposal, for one step.

    `budget` is a cap, never a quota: a builder may return fewer nodes, the empty tree included, when
    more would not pay. `cost` predicts the step time of a tree from its size and depth (the backend's
    `StateBackend.cost_model()`, else its stored calibration), or is None when there is neither.
    """

    budget: int  # the most nodes the tree may have (>= 1)
    cost: CostModel | None = None


class TreeBuilder(ABC):
    """Turns a proposal into a `TokenTree` of at most `context.budget` nodes. Constructed as
    `cls(**options)`."""

    name: ClassVar[str]
    capabilities: ClassVar[TreeBuilderCapabilities] = TreeBuilderCapabilities()
    requires: ClassVar[tuple[tuple[ComponentKind | str, str], ...]] = ()  # (kind, name) it needs

    def __init__(self, **options):
        if options:
            raise TypeError(f"tree builder '{self.name}' takes no options, got {sorted(options)}")

    @abstractmethod
    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        """A tree of at most `context.budget` nodes taken from `proposal` (closed under parents)."""


class Verifier(ABC):
    """Decides which path of the tree the target accepts, and the bonus token after it."""

    name: ClassVar[str]
    capabilities: ClassVar[VerifierCapabilities] = VerifierCapabilities()
    requires: ClassVar[tuple[tuple[ComponentKind | str, str], ...]] = ()  # (kind, name) it needs

    def __init__(self, **options):
        if options:
            raise TypeError(f"verifier '{self.name}' takes no options, got {sorted(options)}")

    @abstractmethod
    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        """Accepted path and bonus token. Must not modify `tree` or `scores`."""


class StateBackend(ABC):
    """Runs the target on packed trees and commits the accepted paths to the target's state.

    A backend implements one of two forms, whichever its engine has; the other comes with the contract:
    - **rows** (`batch()`): several sequences keyed by row, each step scoring every row's tree, ideally in
      one forward (`BatchBackend`; `specframe.kit.backend.SlottedRows` keeps slots). The single-sequence
      methods below are then that batch with one row: `kv` and `ssm-tree` implement this form only.
    - **one sequence** (`prefill`, `score`, `commit`, `committed_length`): for an engine that holds one
      sequence; a batch is then one copy per row, scored one after the other (`RowByRow`).

    One sequence keeps one *pending* token: the last emitted token, fed to the target as the tree root in
    the next `score`. `prefill(ids)` processes `ids[:-1]` and makes `ids[-1]` pending; `score(tree)`
    returns `TargetScores` that carry the tree and whatever the backend needs to commit
    (`TargetScores.state`); `commit(scored, path, bonus)` appends the root and the accepted nodes of
    `scored.tree` to the state and makes `bonus` pending. Only the latest `score` can be committed: a new
    `score` discards the previous uncommitted one, and committing stale scores raises. `issue` and
    `redeem` implement that check for a one-sequence backend: `score` returns `self.issue(scores)`,
    `commit` starts with `self.redeem(scored)`.
    """

    name: ClassVar[str]
    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities()
    requires: ClassVar[tuple[tuple[ComponentKind | str, str], ...]] = ()  # (kind, name) it needs

    def __init__(self, target: Target, *, want_hidden: bool = False, calibration: Calibration | None = None,
                 **options):
        self.target = target
        self.want_hidden = want_hidden
        # What calibration measured for this backend, handed down at assembly; empty where nothing is
        # stored. Read it while building (the padding) or after (the cost); it never changes.
        self.calibration = calibration if calibration is not None else Calibration()
        if options:
            raise TypeError(f"backend '{self.name}' takes no options, got {sorted(options)}")
        self._issued: TargetScores | None = None  # what the latest `score` returned, until committed
        self._sequence: tuple[BatchBackend, int] | None = None  # rows form: the one row `prefill` added

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if getattr(cls, "__abstractmethods__", None) or "name" not in vars(cls):
            return  # an abstract base, or a subclass tweaking a registered backend
        one = all(getattr(cls, m) is not getattr(StateBackend, m) for m in ONE_SEQUENCE)
        if not one and cls.batch is StateBackend.batch:
            raise TypeError(f"backend '{cls.name}' implements neither form of StateBackend: override batch() "
                            f"(rows) or all of {', '.join(ONE_SEQUENCE)} (one sequence)")

    @classmethod
    def unsupported_reason(cls, target: Target) -> str | None:
        """Why this backend cannot serve `target`, or None when it can. Say only why this one cannot:
        where to go instead is added by the registry (`specframe.plugging.pipeline.backend_refusal`)."""
        return None

    def cost_model(self) -> CostModel | None:
        """Predicted step time by tree size and depth, for tree builders (see `BuildContext`).

        Default: None, and with a fixed budget the decoder gives builders `calibration.cost`, the cost
        stored for this backend on this machine (`specframe calibrate`), if any; with `budget="auto"`
        they receive instead the cost measured for it (`specframe.plugging.calibration`), which also
        drives the planner. Called once per decoder, at its first request."""
        return None

    def cost_options(self) -> dict:
        """This instance's options that change what a step costs (a key of the stored calibration, so
        `kv(min_rows=1)` and `kv` are measured apart). Default: none."""
        return {}

    def pads_by_measurement(self) -> bool:
        """Whether this backend, with the options it was built with, leaves the rows it pads each forward
        to to calibration, which then times a plain step alone and padded on backends built with
        `Calibration(min_rows=1)` and `Calibration(min_rows=4)` and hands its choice to the backends
        built after it (`Calibration.min_rows`). Default: False (padding is not measured)."""
        return False

    def batch(self) -> BatchBackend:
        """The state of several sequences decoded together (`SpeculativeDecoder.generate_batch`), each
        row with its own committed tokens and pending root, started empty: a new one each call.

        Default (a one-sequence backend): `RowByRow`, one copy of this backend per row, scored one after
        the other: right for a backend whose `prefill` starts a sequence's whole state afresh, which it
        declares (`BackendCapabilities.fresh_state_per_copy`; without it this raises
        `ConfigurationError`), and no faster than decoding the rows alone.
        """
        return RowByRow(self)

    def rows(self, size: int) -> BatchBackend:
        """The rows the decode loop decodes requests with, `size` at a time: `batch()`, except one at a time
        on a backend that writes the one-sequence form, which is then its own one row (`OneRow`: no copy)."""
        if size == 1 and type(self).prefill is not StateBackend.prefill:
            return OneRow(self)
        return self.batch()

    # --- one sequence: implement these, or `batch` and inherit them -----------------------------------

    @property
    def committed_length(self) -> int:
        """Tokens in the committed state, the pending root excluded."""
        return 0 if self._sequence is None else self._sequence[0].committed_length(self._sequence[1])

    def prefill(self, ids: list[int]) -> None:
        """Start a new sequence: process `ids[:-1]`, keep `ids[-1]` pending. Rows form: a new batch
        with one row."""
        self._sequence = None  # the previous sequence's batch goes first: its resources can serve the next
        rows = self.batch()
        self._sequence = (rows, rows.add(ids))

    def score(self, tree: TokenTree) -> TargetScores:
        """Target logits at the root and every node. Never changes the committed state."""
        rows, row = self._started()
        return rows.score({row: tree})[row]

    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        """Append the root and the nodes `path` of `scored.tree` to the state; `bonus` becomes pending.

        `scored` must be what the latest `score` returned, not committed yet; raise `ValueError`
        otherwise (`redeem` does; the rows form's batch checks it itself).
        """
        rows, row = self._started()
        rows.commit({row: (scored, path, bonus)})

    def _started(self) -> tuple[BatchBackend, int]:
        if self._sequence is None:
            raise RuntimeError(f"backend '{self.name}': score() or commit() before prefill(): start a "
                               "sequence with prefill(prompt_ids) first")
        return self._sequence

    def issue(self, scores: TargetScores) -> TargetScores:
        """Make `scores` the only ones `redeem` accepts and return them; earlier scores become stale.

        End `score` with `return self.issue(TargetScores(logits, hidden, tree=tree, state=...))`.
        """
        self._issued = scores
        return scores

    def redeem(self, scored: TargetScores) -> None:
        """Start `commit` with this: raises `ValueError` unless `scored` is what the latest `score`
        issued and was not committed yet. Nothing is committable again until the next `score`."""
        if scored is None or scored is not getattr(self, "_issued", None):
            raise ValueError(
                f"backend '{self.name}': commit() was given scores other than those of the latest score() "
                "(a newer score() replaced them, they were committed already, or they come from another "
                "backend); commit exactly what the latest score() returned")
        self._issued = None


ONE_SEQUENCE = ("prefill", "score", "commit", "committed_length")  # the one-sequence form's methods
