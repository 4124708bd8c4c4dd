"""What a drafter sees and what it proposes: the first half of a speculative decoding step.

A `Drafter` turns a `DraftContext` into a `DraftProposal`, a forest of candidate tokens labelled with how
they were drawn (`DrawMethod`) and what their scores mean (`ScoreKind`); a `TreeBuilder` then cuts it into a
`TokenTree` (`specframe.terms.tree`). The records of the rest of the step are in `specframe.terms.records`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from specframe.terms.forest import Forest

if TYPE_CHECKING:
    import torch

    from specframe.terms.sampling import Sampler


class DrawMethod(str, enum.Enum):
    """How a drafter chose its tokens. Verifiers that use draft probabilities need to know.

    For the sampled methods, lossless rejection sampling (verifier `rejection`) relies on this contract
    (`docs/explanation/lossless-sampling.md` gives the proof):

    1. The children of a node are listed in the order they were drawn from their shared q row: i.i.d.
       draws either merged at their first appearance (`DraftProposal.from_sequences`,
       `Sampler.draw_drafts`) or left as the raw stream with repeats (the verifier skips a repeat).
    2. Nodes are numbered in the order the drafter drew them: whether node i exists, and its index, are
       decided before its own token is drawn, by draws that are neither its later siblings nor their
       descendants. (Depth by depth, or sequence by sequence, both satisfy this.)
    3. A tree built from such a proposal keeps its `SAMPLED` label only if the builder keeps a prefix of
       every node's children in draw order, decided without looking at the kept tokens
       (`specframe.terms.tree.draw_order_prefix` is such a rule). `TokenTree.from_proposal` drops the label
       otherwise, and the verifier then samples and matches instead (lossless for any tree).

    Deterministic drafts (argmax, top-k) may be shaped freely: they are verified as if q were one-hot.
    """

    ARGMAX = "argmax"  # deterministic: the most likely token(s) of the drafter
    TOPK = "top-k"  # deterministic: the k most likely tokens, children of one parent are distinct
    SAMPLED = "sampled"  # children drawn i.i.d. (with replacement) from `draft_probs`
    SAMPLED_WITHOUT_REPLACEMENT = "sampled-without-replacement"
    RETRIEVED = "retrieved"  # copied from text (prompt lookup, REST): no draft distribution


SAMPLED_DRAWS = (DrawMethod.SAMPLED, DrawMethod.SAMPLED_WITHOUT_REPLACEMENT)
"""The draw methods whose drafts were sampled from the drafter's q. A tree builder keeps such a proposal's
nodes by a draw-order prefix (`specframe.terms.tree.draw_order_prefix`), not by score, so the tree keeps its
sampled label and `rejection` can accept drafts with probability min(1, p/q) (`DrawMethod`, rule 3)."""


class ScoreKind(str, enum.Enum):
    """What the numbers in `DraftProposal.scores` mean, so a tree builder can rely on them.

    Both meaningful kinds never increase from a parent to its child, so the best-scored nodes of a
    proposal are closed under parents.
    """

    LOG_PROB = "log-prob"  # cumulative log-probability of the path to the node under the draft q (<= 0)
    FREQUENCY = "frequency"  # total weight of the retrieved sequences passing through the node (>= 0)
    RANK = "rank"  # an ordering only (higher is better), with no further meaning


@dataclass
class DraftContext:
    """What a drafter sees before each step.

    `tokens` holds the prompt and every token emitted so far; its last token is the tree root, whose
    target output is not computed yet. `hidden` is the target's last hidden state at the previous
    root (the feature that predicted the last token), when the pipeline asked the backend for it.
    `sampler` is the request's sampler: a drafter that samples its drafts (for lossless rejection
    sampling) processes its logits with `sampler.probs` and draws with `sampler.generator`, so a whole
    request replays from one seed; it is greedy when the request is.
    """

    tokens: np.ndarray  # (L,) int64
    prompt_len: int
    budget: int
    hidden: torch.Tensor | None = None  # (H,)
    sampler: Sampler | None = None


@dataclass
class DraftProposal(Forest):
    """Candidate tokens as a forest under the root: node i has `tokens[i]` and parent `parents[i]`.

    `parents[i] == -1` means a child of the root; parents always come before children (`Forest` checks
    this and gives `depth`, `children`, `child`, `paths`). `scores` rank nodes (higher is better);
    `score_kind` says what they mean (see `ScoreKind`) and must match the drafter's
    `DrafterCapabilities.score_kind`. `draft_probs[i]` is the distribution q the token of node i was
    drawn from (siblings share it); present only when the drafter has real probabilities. `group[i]`
    is an optional small drafter-defined label of node i (a match length, which source it came from)
    under which adaptive speculation learns acceptance separately (values 0-7; larger ones share 7).
    """

    scores: np.ndarray  # (N,) float64
    draft_probs: torch.Tensor | None = None  # (N, V)
    draw: DrawMethod = DrawMethod.RETRIEVED
    score_kind: ScoreKind = ScoreKind.RANK
    group: np.ndarray | None = None  # (N,) int64

    def __post_init__(self) -> None:
        super().__post_init__()
        self.scores = np.asarray(self.scores, dtype=np.float64).reshape(-1)
        n = len(self.tokens)
        if len(self.scores) != n:
            raise ValueError(f"DraftProposal: {n} tokens but {len(self.scores)} scores")
        if self.draft_probs is not None and self.draft_probs.shape[0] != n:
            raise ValueError(f"DraftProposal: draft_probs has {self.draft_probs.shape[0]} rows for {n} nodes")
        if self.group is not None:
            self.group = np.asarray(self.group, dtype=np.int64).reshape(-1)
            if len(self.group) != n or (n and self.group.min() < 0):
                raise ValueError(f"DraftProposal: group needs {n} labels >= 0, got {self.group.tolist()}")

    @classmethod
    def empty(cls) -> DraftProposal:
        """No candidates: the step decodes exactly one token."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))

    def subtree(self, keep: np.ndarray | list[int]) -> DraftProposal:
        """The nodes `keep` (closed under parents), renumbered, with their scores, q and groups. Sampled
        drafts become `RETRIEVED` (verified by sampling and matching): a cut chosen after the draws is no
        draw-order prefix, as for `TokenTree.subtree`."""
        keep = np.sort(np.asarray(keep, dtype=np.int64))
        draw = DrawMethod.RETRIEVED if self.draw in SAMPLED_DRAWS else self.draw
        probs = None if self.draft_probs is None else self.draft_probs[keep.tolist()]
        return replace(self, tokens=self.tokens[keep], parents=self.kept_parents(keep),
                       scores=self.scores[keep], draft_probs=probs, draw=draw,
                       group=None if self.group is None else self.group[keep])

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]], weights: Sequence[float] | None = None
                       ) -> DraftProposal:
        """Merge token sequences into one trie. A node's score is the total weight of the sequences
        passing through it (REST's frequency weighting); nodes keep first-insertion order."""
        weights = [1.0] * len(sequences) if weights is None else list(weights)
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        for seq, w in zip(sequences, weights):
            parent = -1
            for tok in seq:
                key = (parent, int(tok))
                node = index.get(key)
                if node is None:
                    node = index[key] = len(tokens)
                    tokens.append(int(tok))
                    parents.append(parent)
                    scores.append(0.0)
                scores[node] += w
                parent = node
        return cls(np.array(tokens, np.int64), np.array(parents, np.int64), np.array(scores),
                   score_kind=ScoreKind.FREQUENCY)
