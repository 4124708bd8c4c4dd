"""The four component interfaces. Plugins subclass these and register the classes through hooks.

Each class has a `name` (the registry key) and declared capabilities, checked when a pipeline is
assembled (`specframe.plugging.pipeline.assemble`), never inferred from the name.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from specframe.terms.cost import CostModel
from specframe.terms.errors import ConfigurationError
from specframe.terms.kinds import DEFAULT_COMPONENTS, ComponentKind
from specframe.terms.proposal import DraftContext, DraftProposal, ScoreKind
from specframe.terms.records import StepOutcome, TargetScores, VerifyResult
from specframe.terms.sampling import Sampler
from specframe.terms.tree import TokenTree

if TYPE_CHECKING:
    from specframe.terms.target import Target


@dataclass(frozen=True)
class DrafterCapabilities:
    needs_hidden_states: bool = False  # wants `DraftContext.hidden` from the target
    provides_draft_probs: bool = False  # fills `DraftProposal.draft_probs` with the real q
    proposes_trees: bool = False  # may propose several children per node (chain-only backends need a chain)
    score_kind: ScoreKind = ScoreKind.RANK  # what its `DraftProposal.scores` mean
    samples_drafts: bool = False  # may propose `DrawMethod.SAMPLED` drafts (when the request samples)
    # Drafting time grows with the budget (a draft model runs once per draft token), so adaptive
    # speculation sizes the budget before drafting when drafting is dear. Drafters whose cost does not
    # depend on the budget (retrieval, heads that run once) draft to the cap; the planner then prunes.
    drafting_grows_with_budget: bool = False
    # Keeps what earlier requests emitted and drafts from it (a cache of responses): a benchmark's
    # repeats of one prompt are then not alike, since later ones can copy the first one's answer.
    remembers_requests: bool = False


@dataclass(frozen=True)
class TreeBuilderCapabilities:
    needs_draft_probs: bool = False  # expands by draft distributions (beam, dynamic)
    needs_score_kind: ScoreKind | None = None  # the proposal scores it relies on; None: any ordering
    makes_chains: bool = False  # always returns a chain (one child per node), for chain-only backends
    keeps_draft_probs: bool = True  # passes q of the kept nodes on to the tree
    # Keeps, from a sampled proposal, a draw-order prefix under every node chosen without looking at the
    # tokens (`specframe.terms.tree.draw_order_prefix`), so the tree stays `SAMPLED` and `rejection` can use
    # q.
    keeps_draw_order: bool = False


@dataclass(frozen=True)
class VerifierCapabilities:
    lossless: bool = True  # preserves the target's (processed) distribution exactly
    needs_draft_probs: bool = False  # refuses drafters without q
    uses_draft_probs: bool = False  # uses q of sampled trees; other trees are verified by sample-and-match
    supports_sampling: bool = False  # handles temperature > 0
    # Accepts a child exactly when its token is the target's own draw at its parent (the argmax when
    # greedy), drawn whatever the tree holds: the adaptive planner then learns from the nodes it left out
    matches_draws: bool = False


@dataclass(frozen=True)
class BackendCapabilities:
    supports_trees: bool = True  # scores branching trees, not only chains
    provides_hidden_states: bool = False
    # `prefill` starts all of a sequence's state afresh (assigns new objects; nothing a shallow copy of the
    # backend shares with it is changed in place), so copies prefilled with different prompts are independent
    # sequences. The default `StateBackend.batch` (`RowByRow`) needs it and refuses backends without it.
    fresh_state_per_copy: bool = False
    # Scores with the target's own torch model, so transformers' `generate` on that model computes what plain
    # decoding through the backend does; False for a backend that runs other weights or kernels (llama.cpp on
    # the GGUF's quantized weights), which `generate --compare` times against plain decoding through itself.
    runs_target_model: bool = True


class Drafter(ABC):
    """Proposes draft tokens for the next step. Constructed as `cls(target, **options)`."""

    name: ClassVar[str]
    capabilities: ClassVar[DrafterCapabilities] = DrafterCapabilities()

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

    def __init__(self, **options):
        if options:
            raise TypeError(f"verifier '{self.name}' takes no options, got {sorted(options)}")

    @abstractmethod
    def verify(self, tree: TokenTree, scores: TargetScores, sampling: Sampler) -> VerifyResult:
        """Accepted path and bonus token. Must not modify `tree` or `scores`."""


class StateBackend(ABC):
    """Runs the target on a packed tree and commits the accepted path to the target's state.

    The backend keeps one *pending* token: the last emitted token, fed to the target as the tree root
    in the next `score`. `prefill(ids)` processes `ids[:-1]` and makes `ids[-1]` pending;
    `score(tree)` returns `TargetScores` that carry the tree and whatever the backend needs to commit
    (`TargetScores.state`); `commit(scored, path, bonus)` appends the root and the accepted nodes of
    `scored.tree` to the state and makes `bonus` pending. Only the latest `score` can be committed: a
    new `score` discards the previous uncommitted one, and committing stale scores raises. `issue` and
    `redeem` implement that check for any backend: `score` returns `self.issue(scores)`, `commit` starts
    with `self.redeem(scored)`.
    """

    name: ClassVar[str]
    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities()

    def __init__(self, target: Target, *, want_hidden: bool = False, **options):
        self.target = target
        self.want_hidden = want_hidden
        if options:
            raise TypeError(f"backend '{self.name}' takes no options, got {sorted(options)}")
        self._issued: TargetScores | None = None  # what the latest `score` returned, until committed

    @classmethod
    def unsupported_reason(cls, target: Target) -> str | None:
        """Why this backend cannot serve `target`, or None when it can."""
        return None

    def cost_model(self) -> CostModel | None:
        """Predicted step time by tree size and depth, for tree builders (see `BuildContext`).

        Default: None, and the decoder gives builders the calibration stored for this backend, target,
        device, dtype and thread count (`specframe calibrate`), if there is one. Called once per decoder,
        at its first request, when the budget is a fixed number; with `budget="auto"` builders receive
        instead the cost measured for this backend on this machine (`specframe.decode.calibration`), which
        also drives the planner.
        """
        return None

    def cost_options(self) -> dict:
        """This instance's options that change what a step costs (a key of the stored calibration, so
        `kv(min_rows=1)` and `kv` are measured apart). Default: none."""
        return {}

    @property
    @abstractmethod
    def committed_length(self) -> int:
        """Tokens in the committed state, the pending root excluded."""

    @abstractmethod
    def prefill(self, ids: list[int]) -> None:
        """Start a new sequence: process `ids[:-1]`, keep `ids[-1]` pending."""

    @abstractmethod
    def score(self, tree: TokenTree) -> TargetScores:
        """Target logits at the root and every node. Never changes the committed state."""

    @abstractmethod
    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        """Append the root and the nodes `path` of `scored.tree` to the state; `bonus` becomes pending.

        `scored` must be what the latest `score` returned, not committed yet; raise `ValueError`
        otherwise (`redeem` does).
        """

    def batch(self) -> BatchBackend:
        """The state of several sequences decoded together (`SpeculativeDecoder.generate_batch`), each
        row with its own committed tokens and pending root, started empty.

        Default: `RowByRow`, one copy of this backend per row, scored one after the other: right for a
        backend whose `prefill` starts a sequence's whole state afresh, which it declares
        (`BackendCapabilities.fresh_state_per_copy`; without it this raises `ConfigurationError`), and no
        faster than decoding the rows alone. A backend that can score every row's tree in one forward
        overrides this (`kv` does).
        """
        return RowByRow(self)

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


Commit = tuple[TargetScores, list[int], int]  # what one row commits: its scores, accepted path, bonus


class BatchBackend(ABC):
    """The target's state for several sequences (rows) decoded together: each step scores every active
    row's tree, ideally in one forward, and commits each row's accepted path on its own.

    Rows are keyed by the int `add` returns and may come and go between steps (a finished request's row
    is removed, a queued one added: continuous batching). A row's scores must be what
    `StateBackend.score` would give for that row's tree alone, so that each row decodes exactly as its
    request would alone; how a backend keeps that true across batch shapes is for it to say and test
    (`specframe.testing.checks` has the check). `one_forward` says whether a step's rows share one
    forward (False: scored one after the other, as `RowByRow` does).
    """

    one_forward: ClassVar[bool] = False

    def __init__(self, backend: StateBackend):
        self.backend = backend  # the single-sequence backend this batches (its options, its target)

    @abstractmethod
    def add(self, ids: list[int]) -> int:
        """Start a row: process `ids[:-1]`, keep `ids[-1]` pending (as `StateBackend.prefill`); its key."""

    @abstractmethod
    def remove(self, row: int) -> None:
        """Drop a row and free its state."""

    @abstractmethod
    def committed_length(self, row: int) -> int:
        """Tokens in `row`'s committed state, its pending root excluded."""

    @abstractmethod
    def score(self, trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        """Target logits at the root and every node of each row's tree (rows not in `trees` idle this
        step). Never changes a committed state; a new `score` discards the previous uncommitted one."""

    def forward_rows(self, sizes: Mapping[int, int]) -> list[int]:
        """The query rows of each forward one `score` runs for trees of `sizes[row]` nodes: what the
        batch planner prices with the backend's single-sequence cost (a forward of n rows costs what a
        tree of n - 1 nodes costs alone). Default: one forward per row, its root and nodes, as `RowByRow`
        scores; a backend that packs rows into one forward says how (padding included)."""
        return [n + 1 for n in sizes.values()]

    @abstractmethod
    def commit(self, accepted: Mapping[int, Commit]) -> None:
        """For each row in `accepted`: append the root and the nodes `path` of its scored tree, make
        `bonus` pending (as `StateBackend.commit`). Every row scored by the latest `score` is committed
        in this one call."""


@dataclass
class SlottedRow:
    """Where a row of a `SlottedRows` batch stands: its slot in the shared buffers, committed length and
    pending root."""

    slot: int
    length: int  # committed tokens, the pending root excluded
    pending: int  # the root of its next tree
    written: int = 0  # columns past `length` its latest scoring wrote (carried along when the row moves)


class SlottedRows(BatchBackend):
    """What a batch of rows in slots of shared buffers keeps, whatever the buffers hold (`kv`'s keys,
    `ssm-tree`'s attention keys beside per-row recurrent states): active rows fill slots 0..N-1, so a step
    reads them as one view; removing a row moves the last slot's row into the freed one (`move_slot`);
    the scores of the latest `score` are issued, and a `commit` must redeem exactly them (`redeem`)."""

    def __init__(self, backend: StateBackend):
        super().__init__(backend)
        self.rows: dict = {}  # row key -> its `SlottedRow` (or a subclass)
        self._next = 0
        self._issued: dict[int, TargetScores] = {}  # what the latest `score` returned, until committed

    def admit(self, state: SlottedRow) -> int:
        """Key a new row whose state sits in slot `len(self.rows)`."""
        row, self._next = self._next, self._next + 1
        self.rows[row] = state
        return row

    def remove(self, row: int) -> None:
        gone = self.row_state(row)
        del self.rows[row]
        self._issued.pop(row, None)
        last = len(self.rows)  # the slot that empties: its row moves into the freed one
        if gone.slot != last:
            mover = next(state for state in self.rows.values() if state.slot == last)
            self.move_slot(last, gone.slot, mover.length + mover.written)
            mover.slot = gone.slot

    def move_slot(self, source: int, target: int, columns: int) -> None:
        """Move the first `columns` columns of slot `source`'s buffers into slot `target`."""

    def committed_length(self, row: int) -> int:
        return self.row_state(row).length

    def row_state(self, row: int) -> SlottedRow:
        if row not in self.rows:
            raise KeyError(f"backend '{self.backend.name}': row {row} is not in this batch (it was removed, "
                           f"or never added); rows now: {sorted(self.rows)}")
        return self.rows[row]

    def advance(self, row: int, path: list[int], bonus: int,
                moves: tuple[list[int], list[int], list[int]]) -> list[int]:
        """Commit `row`'s root and accepted `path` and make `bonus` pending; when the path is a branch
        other than the first chain, the columns whose keys must move go into `moves` (slots, sources,
        targets). Returns the kept columns' tree positions, root first (0, then each node + 1)."""
        state = self.rows[row]
        packed = [0] + [int(i) + 1 for i in path]
        keep = [state.length + i for i in packed]
        target = list(range(state.length, state.length + len(keep)))
        if keep != target:
            moves[0].extend([state.slot] * len(keep))
            moves[1].extend(keep)
            moves[2].extend(target)
        state.length, state.pending, state.written = state.length + len(keep), int(bonus), 0
        return packed

    def redeem(self, accepted: Mapping[int, Commit]) -> None:
        """Raise `ValueError` unless `accepted` commits exactly the rows of the latest `score`, each
        with the scores it returned for that row; then nothing is committable until the next `score`."""
        name = self.backend.name
        missing = sorted(set(self._issued) - set(accepted))
        if missing:
            raise ValueError(f"backend '{name}': rows {missing} were scored but are not in commit(); commit "
                             "every row of the latest score() in one call (an empty path keeps the root "
                             "alone)")
        for row, (scored, _, _) in accepted.items():
            if scored is None or self._issued.get(row) is not scored:
                raise ValueError(
                    f"backend '{name}': commit() was given scores for row {row} other than those of the "
                    "latest score() (a newer score() replaced them, they were committed already, the row "
                    "was not scored, or they come from another backend); commit exactly what the latest "
                    "score() returned")
        self._issued = {}


class RowByRow(BatchBackend):
    """A batch as one copy of a single-sequence backend per row, scored one after the other: the default
    `StateBackend.batch` (see there). Each copy starts its own state at `prefill`; what the copies share
    (the target, measured limits) is read-only. Refuses a backend that does not declare so
    (`BackendCapabilities.fresh_state_per_copy`): its copies could share one sequence's state."""

    def __init__(self, backend: StateBackend):
        if not backend.capabilities.fresh_state_per_copy:
            name, default = backend.name, DEFAULT_COMPONENTS[ComponentKind.BACKEND]
            raise ConfigurationError(
                f"backend '{name}' cannot decode a batch: its rows would be copies of one backend, "
                f"independent only when prefill starts all of a sequence's state afresh, and '{name}' does "
                "not declare that (BackendCapabilities.fresh_state_per_copy). Call generate for each "
                f"prompt, or decode the batch with a backend that batches, such as --backend {default}; a "
                "backend's author declares fresh_state_per_copy=True when prefill makes all state new, or "
                "overrides batch() (docs/how-to/batch-decoding.md)")
        super().__init__(backend)
        self.rows: dict[int, StateBackend] = {}
        self._next = 0

    def add(self, ids: list[int]) -> int:
        row, self._next = self._next, self._next + 1
        state = copy.copy(self.backend)
        state.prefill(ids)
        self.rows[row] = state
        return row

    def remove(self, row: int) -> None:
        del self.rows[row]

    def committed_length(self, row: int) -> int:
        return self.rows[row].committed_length

    def score(self, trees: Mapping[int, TokenTree]) -> dict[int, TargetScores]:
        return {row: self.rows[row].score(tree) for row, tree in trees.items()}

    def commit(self, accepted: Mapping[int, Commit]) -> None:
        for row, (scored, path, bonus) in accepted.items():
            self.rows[row].commit(scored, path, bonus)
