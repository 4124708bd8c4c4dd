"""Distribution-driven tree builders (`beam`, `dynamic`) work on a *candidate forest*.

The optional extension they rely on is a convention on `DraftProposal`, not a new interface: a drafter
with real draft probabilities proposes a forest wider than any tree it will be cut to, where

- `scores[i]` is the cumulative log-probability log q(path to node i) under the drafter
  (`score_kind=ScoreKind.LOG_PROB`, declared in the drafter's capabilities too), and
- the children of every node the drafter expanded are its top-k tokens under that node's distribution
  (`draft_probs[i]` is that distribution).

`s4c(widths=..., topk=...)` and `draft-model(topk=...)` propose such forests. A tree builder then decides
which part to verify without calling the drafter back: `beam` keeps the best `width` nodes per depth
among the children of the previous depth's kept nodes, `dynamic` reranks all candidates globally. Both
declare `needs_draft_probs` and `needs_score_kind=ScoreKind.LOG_PROB`, so a pipeline with a drafter whose
scores are not log-probabilities (pld's frequencies) is refused when it is assembled.

Sampled drafts: both choose nodes by their scores, so the nodes they keep are no longer draws from q.
Pipelines that pair them with `rejection` and a drafter that samples are refused when assembled
(`TreeBuilderCapabilities.keeps_draw_order` is False); with `sample-match`, or greedy, they are lossless.
"""

from __future__ import annotations

from specframe import CapabilityError, DraftProposal, ScoreKind


def check_forest(proposal: DraftProposal, builder: str) -> None:
    """Refuse proposals that are not scored by cumulative log-probabilities (a drafter that declares one
    kind of score in its capabilities and proposes another)."""
    if len(proposal) and (proposal.draft_probs is None or proposal.score_kind is not ScoreKind.LOG_PROB):
        raise CapabilityError(
            f"tree builder '{builder}' needs a candidate forest scored by cumulative log-probabilities "
            "with draft_probs; this proposal has "
            + ("no draft_probs" if proposal.draft_probs is None else f"{proposal.score_kind.value} scores"))
