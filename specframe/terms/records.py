"""Typed records passed between the four components of a speculative decoding step.

One step reads: a `Drafter` turns a `DraftContext` into a `DraftProposal` (both in
`specframe.terms.proposal`); a `TreeBuilder` turns the proposal into a `TokenTree` (see
`specframe.terms.tree`); a `StateBackend` scores the tree into `TargetScores`; a `Verifier` turns the
scores into a `VerifyResult`; the drafter then observes a `StepOutcome`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specframe.terms.proposal import DraftProposal

if TYPE_CHECKING:
    import torch

    from specframe.terms.tree import TokenTree


@dataclass
class TargetScores:
    """The target's outputs on a packed tree. Row 0 is the root, row i + 1 is tree node i.

    A backend's `score` fills `tree` (the tree it scored) and may put in `state` whatever its `commit`
    needs from that forward (per-node recurrent states, a cache length); `commit` receives this object
    back, so no backend keeps the last tree on the side. Verifiers read only `logits`.
    """

    logits: torch.Tensor  # (N + 1, V) float32
    hidden: torch.Tensor | None = None  # (N + 1, H) last hidden states, when requested
    tree: TokenTree | None = None  # the scored tree; set by every backend's `score`
    state: Any = None  # backend-private: what `commit` needs from the forward
    # (P - 1, H) the features of the row's prompt but its pending last token, from the forward that read it:
    # on a row's first scores only, from a backend that keeps them (None otherwise)
    prompt_hidden: torch.Tensor | None = None


@dataclass
class VerifyResult:
    """What the target accepts: a root-to-node path of tree node indices, then one bonus token."""

    path: list[int]  # accepted tree nodes, root child first
    bonus: int  # the token sampled from the target after the last accepted node
    # Why a verifier that uses draft probabilities verified this step by sampling and matching instead
    # (e.g. "no draft q", "deterministic drafts", "not a draw-order prefix"); None when it did not.
    fallback: str | None = None

    @property
    def accepted(self) -> int:
        return len(self.path)


@dataclass
class StepOutcome:
    """Told to the drafter (and to observers) after each step."""

    proposal: DraftProposal
    tree_size: int
    accepted_tokens: list[int]  # the draft tokens the target accepted
    bonus: int
    hidden: torch.Tensor | None = None  # (H,) target feature at the last accepted node
    # (A + 1, H) the target's features at the root and at each accepted node: row k predicted `emitted[k]`
    hidden_path: torch.Tensor | None = None
    # (P - 1, H) the prompt's features (`TargetScores.prompt_hidden`), on a request's first step only
    prompt_hidden: torch.Tensor | None = None

    @property
    def emitted(self) -> list[int]:
        return [*self.accepted_tokens, self.bonus]


@dataclass(frozen=True)
class Prediction:
    """What adaptive speculation expected of one step: emitted tokens (bonus included) and seconds
    without drafting (`specframe.decode`)."""

    tokens: float
    seconds: float


@dataclass
class StepEvent:
    """Passed to the `on_step` observer hook."""

    step: int
    tree_size: int
    accepted: int
    emitted: list[int]
    times: dict[str, float] = field(default_factory=dict)  # seconds per phase in this step
    prediction: Prediction | None = None  # with budget="auto", what the planner expected
    drafted: bool = True  # False when the planner skipped drafting because it did not pay (not at the end)
