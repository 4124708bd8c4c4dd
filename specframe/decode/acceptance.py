"""Calibrated acceptance: the probability that the target accepts a draft node given its parent was.

Drafters score nodes in their own units (`ScoreKind`): log-probabilities under a draft model, retrieval
frequencies, or a bare rank. None of them is the probability we need, and how far off they are depends on
the drafter, the text and the target. So every node gets a *conditional score* c in [0, 1] from its
proposal (q of its token for log-probabilities, its share of the parent's weight for frequencies, a
rank-based guess for ranks) and is filed under a bucket key (score bucket, depth, the drafter's group
such as a match length or a source). Each bucket counts how often its nodes were accepted when their
parent was; the estimate is the Beta posterior mean, shrunk first towards the score bucket pooled over
depths and groups, and that towards c itself, so a new decoder starts from the drafter's own scores and
moves to what the verifier actually does within a few steps.

Only draft-side information enters a prediction (the proposal and earlier steps), never the target's
output for the step being chosen, so selecting trees with it keeps every verifier lossless.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specframe.support.atomic_dirs import FILE_LOCK_WAIT, file_lock, locked_update, write_atomically
from specframe.terms.errors import ConfigurationError, SpecframeWarning
from specframe.terms.proposal import DraftProposal, ScoreKind

SCORE_BUCKETS = 10  # c in [0, 1] cut into tenths; rank scores use the sibling rank (0..9) instead
DEPTHS = 8  # depth 8 and deeper share a bucket
GROUPS = 16  # drafter-defined groups (`DraftProposal.group`), clipped to 0..15
FORMAT = 2  # raised when the tables change shape (`GROUPS` among them): a file of another format starts fresh


@dataclass
class NodeFeatures:
    """Per tree node: the conditional score and the bucket keys the acceptance statistics use."""

    prior: np.ndarray  # (N,) c in [0, 1]
    score_bucket: np.ndarray  # (N,) int64 in [0, SCORE_BUCKETS)
    fine_key: np.ndarray  # (N,) int64 index into the fine table

    @classmethod
    def of(cls, proposal: DraftProposal, origin: np.ndarray, depth: np.ndarray) -> NodeFeatures:
        """Features of the tree nodes that came from `proposal` nodes `origin` at tree depths `depth`."""
        prior, bucket = conditional_scores(proposal)
        prior, bucket = prior[origin], bucket[origin]
        group = np.zeros(len(origin), np.int64) if proposal.group is None else proposal.group[origin]
        d = np.minimum(depth, DEPTHS) - 1
        fine = (np.clip(group, 0, GROUPS - 1) * DEPTHS + d) * SCORE_BUCKETS + bucket
        return cls(prior, bucket, fine.astype(np.int64))

    def take(self, keep: np.ndarray) -> NodeFeatures:
        """The features of the nodes `keep`, in that order (for a cut tree)."""
        return NodeFeatures(self.prior[keep], self.score_bucket[keep], self.fine_key[keep])


def conditional_scores(proposal: DraftProposal) -> tuple[np.ndarray, np.ndarray]:
    """(c, score bucket) of every proposal node, from what its scores mean (`ScoreKind`)."""
    n, parents, scores = len(proposal), proposal.parents, proposal.scores
    if proposal.score_kind is ScoreKind.LOG_PROB:
        parent_scores = np.where(parents >= 0, scores[np.maximum(parents, 0)], 0.0)
        c = np.exp(np.minimum(scores - parent_scores, 0.0))  # q of the node's token
    elif proposal.score_kind is ScoreKind.FREQUENCY:
        totals = np.zeros(n + 1)  # weight under each parent (index 0: the root)
        np.add.at(totals, parents + 1, scores)
        parent_weight = np.where(parents >= 0, scores[np.maximum(parents, 0)], totals[0])
        c = np.divide(scores, parent_weight, out=np.zeros(n), where=parent_weight > 0)  # weights have no unit
    else:  # a bare ordering: rank among siblings, best first, and a guess that halves with each rank
        rank = sibling_ranks(parents, scores)
        return 0.6 * 0.5 ** rank, np.minimum(rank, SCORE_BUCKETS - 1)
    c = np.clip(c, 0.0, 1.0)
    return c, np.minimum((c * SCORE_BUCKETS).astype(np.int64), SCORE_BUCKETS - 1)


def sibling_ranks(parents: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Rank of each node among its siblings by score (0 = best; ties by index)."""
    order = np.lexsort((np.arange(len(parents)), -scores, parents))  # grouped by parent, best first
    ranks = np.zeros(len(parents), np.int64)
    previous, r = None, 0
    for i in order.tolist():
        r = r + 1 if parents[i] == previous else 0
        ranks[i], previous = r, parents[i]
    return ranks


def matched_outcomes(tokens: np.ndarray, parents: np.ndarray, depth: np.ndarray,
                     emitted: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(tried, accepted) of every node of a tree, verified or not, after a step that emitted `emitted`
    (the accepted tokens, then the bonus), for verifiers that accept a child exactly when its token is
    the target's own draw at its parent, a draw that does not depend on the tree (greedy decoding,
    sampling and matching). Such a step draws at every position it emits; so a node whose parent's path
    is a prefix of `emitted` (or the root) was, in effect, tried at its depth, and accepted when its token
    is the draw there, whether or not the planner kept it. Learning from the nodes it left out as well
    spares the acceptance model the bias of seeing only what it already chose."""
    n = len(tokens)
    matched = np.zeros(n + 1, bool)  # index 0: the root
    matched[0] = True
    tried = np.zeros(n, bool)
    draws = np.asarray(emitted, np.int64)
    for i in range(n):  # topological order: a parent comes before its children
        d = int(depth[i])
        tried[i] = matched[parents[i] + 1] and d <= len(draws)
        matched[i + 1] = tried[i] and tokens[i] == draws[d - 1]
    return tried, matched[1:]


class AcceptanceModel:
    """Online Beta-binomial estimates of P(node accepted | parent accepted), kept across requests.

    `strength` is the weight, in observations, of each level's prior: the fine bucket shrinks towards
    its score bucket, the score bucket towards the drafter's own conditional score.
    """

    def __init__(self, strength: float = 4.0):
        self.strength = strength
        size = GROUPS * DEPTHS * SCORE_BUCKETS
        self.fine = np.zeros((2, size))  # [accepted, tried] per fine key
        self.coarse = np.zeros((2, SCORE_BUCKETS))  # [accepted, tried] per score bucket
        self._saved = (self.fine.copy(), self.coarse.copy())  # the counts already in the file (`save`)

    @property
    def observations(self) -> int:
        return int(self.coarse[1].sum())

    def predict(self, features: NodeFeatures) -> np.ndarray:
        """(N,) calibrated conditional acceptance probabilities."""
        k = self.strength
        a, t = self.coarse[:, features.score_bucket]
        coarse = (a + k * features.prior) / (t + k)
        a, t = self.fine[:, features.fine_key]
        return (a + k * coarse) / (t + k)

    def update(self, features: NodeFeatures, parents: np.ndarray, path: list[int]) -> None:
        """Learn from one verified tree: every node whose parent was accepted (or is the root) was tried,
        and accepted when it is on the accepted `path`."""
        on_path = np.zeros(len(parents) + 1, bool)  # index 0: the root, always "accepted"
        on_path[0] = True
        on_path[np.asarray(path, np.int64) + 1] = True
        tried = on_path[parents + 1]
        self.record(features, tried, on_path[1:] & tried)

    def record(self, features: NodeFeatures, tried: np.ndarray, accepted: np.ndarray) -> None:
        """Count the nodes `tried` (their parent accepted), and which of them were `accepted`."""
        for table, key in ((self.fine, features.fine_key), (self.coarse, features.score_bucket)):
            np.add.at(table[0], key[tried], accepted[tried])
            np.add.at(table[1], key[tried], 1.0)

    # --- persistence -------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Add the counts learned since the last `load` or `save` to those in the file, and write it as
        JSON, atomically (a crash leaves the previous file whole). The file is read again under its lock,
        so two processes sharing it add up their counts instead of the last one replacing the other's."""
        def busy() -> ConfigurationError:
            return ConfigurationError(f"acceptance file {path} stayed locked by another process for "
                                      f"{FILE_LOCK_WAIT:g} s ({file_lock(path)}); if no specframe process "
                                      "is running, delete that lock file")

        with locked_update(path, busy, f"acceptance file '{path}'"):
            stored = type(self).load(path)
            fine = stored.fine + self.fine - self._saved[0]
            coarse = stored.coarse + self.coarse - self._saved[1]
            write_atomically(path, json.dumps({"format": FORMAT, "strength": self.strength,
                                               "fine": fine.tolist(), "coarse": coarse.tolist()}))
        self._saved = (self.fine.copy(), self.coarse.copy())

    @classmethod
    def load(cls, path: Path) -> AcceptanceModel:
        """Counts saved by `save`. A missing file gives a fresh model; so does one of another format or
        shape (written by another specframe version), with a warning, since the next save replaces it.
        A file `save` did not write (not JSON, no counts) is refused: saving over it would destroy it."""
        model = cls()
        if not path.exists():
            return model
        try:
            data = json.loads(path.read_text())
            fine, coarse = np.asarray(data["fine"], float), np.asarray(data["coarse"], float)
            strength = float(data["strength"])
        except (OSError, ValueError, KeyError, TypeError, ArithmeticError, RecursionError) as err:
            raise ConfigurationError(
                f"acceptance file {path} is not one specframe wrote ({type(err).__name__}: {err}); it is "
                "left as it is: delete it, or pass another acceptance_file") from None
        shapes = (fine.shape, coarse.shape) == (model.fine.shape, model.coarse.shape)
        if data.get("format") != FORMAT or not shapes:
            warnings.warn(SpecframeWarning(
                f"acceptance file {path} holds counts of another format (format {data.get('format')}, this "
                f"version writes {FORMAT}); starting from fresh counts, which replace it at the next save"),
                stacklevel=2)
            return model
        counts = all(np.all(np.isfinite(t)) and np.all(t >= 0) and np.all(t[0] <= t[1])
                     for t in (fine, coarse))  # [accepted, tried] rows
        if not (counts and math.isfinite(strength) and strength > 0):
            raise ConfigurationError(
                f"acceptance file {path} holds counts specframe never writes (negative, not finite, more "
                "accepted than tried, or a strength that is not positive); it is left as it is: delete it, "
                "or pass another acceptance_file")
        model.strength, model.fine, model.coarse = strength, fine, coarse
        model._saved = (fine.copy(), coarse.copy())
        return model
