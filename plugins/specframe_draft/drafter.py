"""`draft-model`: classic speculative decoding with a small causal LM that shares the target's tokenizer.

`draft-model(model=DIR)` loads any local Hugging Face causal LM (or alias) as the drafter;
`draft-model(layers=N)` (or `model="layers:N"`) is self-speculation: the target's own first N decoder
layers with its final norm and LM head, sharing the target's weights (no training, no extra weights).

The drafter keeps its own KV cache of the tokens it has read. Each step it feeds the tokens it has not
read yet (the last step's accepted tokens and the new root) and then drafts a chain of `num_tokens`
greedy tokens, one forward each. Every chain node also gets its `topk - 1` next best tokens as sibling
leaves, so the proposal is a candidate forest (scores = cumulative log q, `draft_probs` = the draft
model's real distributions) that `static(preset=continuous)`, `beam` and `dynamic` can shape.
When the request samples (`draw=auto`, the default), the chain and its siblings are i.i.d. draws from
the draft distribution processed like the target's, the first draw continuing the chain, numbered depth
by depth in draw order: with `chain` (which then follows the first-drawn child) and the `rejection`
verifier that is classic speculative sampling, accepting each draft with probability min(1, p/q);
`trie` and `static` keep a draw-order prefix of the siblings too.
`observe` rolls the cache back to the committed tokens; `propose` also checks the cached tokens against
the context, so a new request or an unexpected context never reuses stale state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import specframe
from specframe import (
    ComponentKind, ConfigurationError, DraftContext, DraftProposal, Drafter, DrafterCapabilities, DrawMethod,
    ScoreKind, StepOutcome, UnsupportedModelError,
)
from specframe.kit.components import required
from specframe.kit.drafting import DraftDraw, check_draw, samples_drafts
from specframe.kit.inference import inference_mode

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the drafter loads none
    import torch
    from torch import nn


def truncated_model(target: specframe.Target, layers: int) -> nn.Module:
    """A causal LM made of the target's first `layers` decoder layers, final norm and LM head (shared)."""
    from specframe.kit.models import truncated_model as _truncated_model

    return _truncated_model(target, layers, "draft-model")


class DraftModelDrafter(Drafter):
    name = "draft-model"
    capabilities = DrafterCapabilities(provides_draft_probs=True, proposes_trees=True,
                                       samples_drafts=True, score_kind=ScoreKind.LOG_PROB,
                                       drafting_grows_with_budget=True)

    option_limits = {"layers": (1, 4096), "num_tokens": (1, 4096), "topk": (1, 4096)}
    # The drafter rolls its model back as `kv` rolls the target back, so it asks `kv` which models it may
    # draft with (`check_croppable`).
    requires = ((ComponentKind.BACKEND, "kv"),)

    def __init__(self, target, *, model: str | None = None, layers: int | None = None, num_tokens: int = 4,
                 topk: int = 1, draw: DraftDraw = "auto"):
        super().__init__(target)
        if isinstance(model, str) and model.startswith("layers:"):
            model, layers = None, int(model.split(":", 1)[1])
        if (model is None) == (layers is None):
            raise ConfigurationError("draft-model: give exactly one of model=DIR_OR_ALIAS or layers=N "
                                     "(e.g. draft-model(layers=8))")
        if num_tokens < 1 or topk < 1:
            raise ConfigurationError(
                f"draft-model: num_tokens and topk must be >= 1, got {num_tokens}, {topk}")
        self.num_tokens, self.topk, self.draw = int(num_tokens), int(topk), check_draw("draft-model", draw)
        self.shares_target = layers is not None
        if layers is not None:
            check_layers_croppable(target, int(layers))
            self.model = truncated_model(target, int(layers))
        else:
            draft = specframe.load_target(model, dtype=next(target.model.parameters()).dtype,
                                          device=str(target.device))
            check_same_tokenizer(target, draft)
            check_croppable(draft)
            self.model = draft.model
        self.reset()

    @property
    def extra_parameters(self) -> int:
        """Parameters this drafter adds to the target: none for `layers=N`."""
        return 0 if self.shares_target else sum(p.numel() for p in self.model.parameters())

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.cached: list[int] = []  # the tokens whose keys/values the cache holds, in order
        self._step_base = 0

    @classmethod
    def example_options(cls, target, workdir: str) -> dict:
        """Self-speculation with the target's first layer and two candidates per depth (so tree builders
        have siblings to choose from): works for any decoder-only target."""
        return {"layers": 1, "num_tokens": 3, "topk": 2}

    @inference_mode
    def propose(self, context: DraftContext) -> DraftProposal:
        import torch
        from torch import nn

        length = min(self.num_tokens, context.budget)
        if length < 1:
            return DraftProposal.empty()
        tokens = context.tokens.tolist()
        common = common_prefix(self.cached, tokens[:-1])  # always re-read the root: we need its logits
        self._crop(common)
        self._step_base = len(tokens)
        logits = self._feed(tokens[common:])  # (V,) the draft distribution after the root
        sampler = context.sampler if samples_drafts(self.draw, context.sampler) else None
        vocab = self.target.vocab_size
        picks, q_rows = [], []  # per depth: the chain token first, then its siblings; the q they came from
        for d in range(length):
            q = sampler.probs(logits) if sampler is not None else torch.softmax(logits.float(), -1)
            q = nn.functional.pad(q, (0, vocab - q.shape[0])) if q.shape[0] < vocab else q[:vocab]  # (V,)
            q_rows.append(q)
            picks.append(sampler.draw_drafts(q[None], self.topk)[0] if sampler is not None  # i.i.d. draws
                         else q.topk(self.topk).indices.tolist())  # the first of either continues the chain
            if d + 1 < length:
                logits = self._feed([picks[-1][0]])
        if sampler is None:
            return forest_from_picks(picks, torch.stack(q_rows), DrawMethod.ARGMAX if self.topk == 1
                                     else DrawMethod.TOPK)
        return forest_from_picks(picks, torch.stack(q_rows), DrawMethod.SAMPLED, limit=context.budget)

    def observe(self, outcome: StepOutcome) -> None:
        """Keep the cache of the context and of the chain tokens the target accepted, drop the rest."""
        chain = self.cached[self._step_base:]
        kept = common_prefix(chain, outcome.accepted_tokens)
        self._crop(self._step_base + kept)

    def _feed(self, ids: list[int]) -> torch.Tensor:
        """Run the draft model on `ids` after its cache; (V_draft,) logits after the last one."""
        import torch

        device = self.target.device
        out = self.model(input_ids=torch.tensor([ids], device=device), past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.cached += ids
        return out.logits[0, -1]

    def _crop(self, length: int) -> None:
        extra = len(self.cached) - length
        if extra > 0:
            self.cache.crop(-extra)
            del self.cached[length:]


def forest_from_picks(picks: list[list[int]], q: torch.Tensor, draw: DrawMethod,
                      limit: int | None = None) -> DraftProposal:
    """A chain whose depth-d node is `picks[d][0]`, with `picks[d][1:]` as sibling leaves.

    `q` (L, V): row d is the distribution the depth-(d + 1) tokens came from. Nodes are ordered depth by
    depth, the chain node first, so a parent always precedes its children; at most `limit` nodes (a
    prefix in that order, which keeps sampled siblings a prefix of their draws). Scores are cumulative
    log q.
    """
    import torch

    tokens, parents, scores, rows = [], [], [], []
    parent, base = -1, 0.0
    for d, siblings in enumerate(picks):
        logq = torch.log(q[d].clamp_min(1e-30))  # (V,)
        first = len(tokens)
        for t in siblings[: None if limit is None else limit - len(tokens)]:
            tokens.append(t)
            parents.append(parent)
            scores.append(base + float(logq[t]))
            rows.append(d)
        if len(tokens) == first:
            break
        parent, base = first, scores[first]
    probs = q[torch.tensor(rows)]  # (N, V) siblings share their row
    return DraftProposal(np.array(tokens), np.array(parents), np.array(scores), probs, draw,
                         ScoreKind.LOG_PROB)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def check_croppable(draft: specframe.Target) -> None:
    """The draft model's state must roll back by cropping a KV cache, as the `kv` backend's does."""
    reason = required(DraftModelDrafter, ComponentKind.BACKEND, "kv").unsupported_reason(draft)
    if reason:
        raise UnsupportedModelError(
            f"draft-model: '{draft.name}' cannot be a draft model: the drafter rolls its state back by "
            f"cropping a KV cache after every step, so it needs an attention-only model, and {reason}. "
            "Pick an attention-only draft model of the target's family, or draft-model(layers=N)")


def check_layers_croppable(target: specframe.Target, layers: int) -> None:
    """The target's own first layers draft only when cropping a KV cache rolls them back exactly: when the
    `kv` backend serves the target (attention-only, of a verified family)."""
    reason = required(DraftModelDrafter, ComponentKind.BACKEND, "kv").unsupported_reason(target)
    if reason:
        raise UnsupportedModelError(
            f"draft-model(layers={layers}) cannot draft with the first layers of '{target.name}': the "
            "drafter rolls its state back by cropping a KV cache after every step, which serves only "
            "attention-only models of the families the 'kv' backend is verified on, and the 'kv' backend "
            f"refuses this one ({reason}). Draft with a drafter that runs no target layers (e.g. pld), or "
            "with draft-model(model=DIR), an attention-only model that shares the target's tokenizer")


def check_same_tokenizer(target: specframe.Target, draft: specframe.Target) -> None:
    """The draft must use the target's tokenizer: same vocabulary (ids may be padded at the end)."""
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    same = (t_tok is None and d_tok is None) or (
        t_tok is not None and d_tok is not None and t_tok.get_vocab() == d_tok.get_vocab())
    if not same or draft.vocab_size > target.vocab_size:
        raise ConfigurationError(
            f"draft-model: '{draft.name}' does not share the tokenizer of target '{target.name}' "
            f"(vocab {draft.vocab_size} vs {target.vocab_size}); pick a draft model of the same family")
