"""What each kind of component declares it can do or needs, checked when a pipeline is assembled
(`specframe.plugging.pipeline.check_compatible`), never inferred from a name. Each interface of
`specframe.contract.interfaces` carries one of these as its `capabilities` (re-exported there).
"""

from __future__ import annotations

from dataclasses import dataclass

from specframe.terms.proposal import ScoreKind


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
    # Returns the target's logits for the decoder to mask, so a constraint (structured output) holds; False
    # for a backend that decodes on its own, which a request with a constraint is refused before any work.
    honours_constraints: bool = True
