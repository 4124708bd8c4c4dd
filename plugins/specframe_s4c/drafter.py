"""The `s4c` drafter: a candidate forest from S4C heads on the target's last feature.

Mapping S4C onto specframe's step: the target's next token is already the pending root, and
`DraftContext.hidden` is the feature that predicted it. Head 1 reads [e(root), hidden] and gives the
depth-1 distribution; its top tokens are the root's children. S4C's "top-2 tokens as two inputs" then
feed the next head in parallel: head k + 1 expands `widths[k]` nodes of depth k at once (batched, each
with the feature head k predicted for it), the top-1 chain always among them (the vertical chain) and
the rest by cumulative log-probability; every expanded node gets its `topk` most likely children
(the horizontal alternatives). Scores are cumulative log q, so `static`, `beam` and `dynamic` tree
builders can all shape the forest; rows of `draft_probs` are the real head distributions.

`draw=auto` (the default) drafts that way for greedy requests. When the request samples, the children of
each node are instead `topk` i.i.d. draws from the head's distribution processed like the target's
(temperature, top-k, top-p), merged in the order first drawn, numbered depth by depth (so a node's index
is fixed before its token is drawn), and the proposal stops at the step's budget. `chain`, `trie` and
`static` then keep a draw-order prefix of every node's children and the `rejection` verifier accepts each
draft with probability min(1, p/q), losslessly; `beam` and `dynamic` choose by score, so pairing them with
`rejection` while sampling is refused when the pipeline is assembled. Which nodes a head expands may
depend on their scores: that decides whether a node has children, never which tokens its children are.
`draw=top-k` or `draw=sample` force one mode. `depth=N` drafts with the first N heads only: shallower
forests, for a fraction of the drafting time (each head costs about as much as the first).

`dtype` is what the heads and their LM-head rows compute in. Drafting reads about 66 MB of weights per
step (three heads and 8,192 LM-head rows in float32), which on a CPU costs a fifth of a SmolLM2 step,
and a draft needs no float32 accuracy: `auto` (the default) drafts in bfloat16, packed for oneDNN, where
the target runs on oneDNN-packed float32 weights (the CPU default) and the CPU multiplies bfloat16
natively, else in the target's dtype; `target` keeps the target's. Drafts only ever decide what is
proposed, so the output stays the target's; a sampled draft's q is the distribution its tokens were
drawn from, whatever dtype computed it. On SmolLM2 bfloat16 drafted the same trees in 12 % less time
(`docs/results/conclusions.md`): the rest is per-call work.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specframe import (
    ConfigurationError, DraftContext, DraftProposal, Drafter, DrafterCapabilities, DrawMethod, ModelLoadError,
    Sampler, ScoreKind,
)
from specframe.kit.drafting import DraftDtype, DraftDraw, check_draw, samples_drafts
from specframe.kit.inference import inference_mode

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the drafter loads none
    import torch

WEIGHTS_DIR = Path(__file__).parent / "weights"
DEFAULT_WIDTHS = (1, 2, 1)  # head 1 on the root, head 2 on the top-2 of head 1, head 3 on the top-1 chain


def packaged_heads(model_name: str) -> Path:
    """The heads shipped with specframe for a model alias."""
    return WEIGHTS_DIR / model_name / "heads.safetensors"


class S4CDrafter(Drafter):
    name = "s4c"
    capabilities = DrafterCapabilities(needs_hidden_states=True, provides_draft_probs=True,
                                       proposes_trees=True, samples_drafts=True,
                                       score_kind=ScoreKind.LOG_PROB)

    option_limits = {"topk": (1, 4096), "widths": (1, 4096), "depth": (1, 64)}  # 64: heads.MAX_HEADS

    def __init__(self, target, *, heads: str | None = None, topk: int = 4,
                 widths: int | tuple[int, ...] | list[int] = DEFAULT_WIDTHS, draw: DraftDraw = "auto",
                 depth: int | None = None, dtype: DraftDtype = "auto"):
        import torch
        from specframe.kit.models import PackedLinear, drafting_dtype, linear_kernel, pack_linear_layers
        from specframe_s4c.heads import S4CHeads, target_parts

        super().__init__(target)
        path = Path(heads) if heads else packaged_heads(target.name)
        if not heads and not path.is_file():
            raise ModelLoadError(
                f"s4c: no trained heads ship for model '{target.name}' (looked in {path.parent}); train them "
                f"with `specframe train s4c --model {target.name} --data python-stdlib` and pass "
                "s4c(heads='RUN/heads.safetensors')")
        self.heads = S4CHeads.load(target, path)
        trained = len(self.heads)
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                                  or not 1 <= depth <= trained):
            raise ConfigurationError(f"s4c: depth (the heads used) must be 1 to {trained}, got {depth!r}")
        k = self.depth = trained if depth is None else depth  # each head drafts one level deeper
        if isinstance(widths, int):
            widths = (1, *([int(widths)] * (k - 1)))
        elif len(widths) > k and depth is not None:
            widths = widths[:k]  # the default widths, or any given, for the heads in use
        widths = tuple(int(w) for w in widths)
        if len(widths) != k or widths[0] != 1 or min(widths) < 1 or topk < 1:
            raise ConfigurationError(
                f"s4c: widths must list {k} positive counts of nodes each head expands, starting with 1 "
                f"(the root), and topk >= 1; got widths={widths}, topk={topk}")
        self.widths, self.topk, self.draw = widths, int(topk), check_draw("s4c", draw)
        self.embed, _, lm_head, _ = target_parts(target)
        self.dtype = drafting_dtype(dtype, target, "s4c")
        self.heads.to(self.dtype)
        self.vocab_ids = self.heads.vocab_ids  # (Vd,)
        # (Vd, H) the draft vocabulary's rows
        self.lm_weight = lm_head.weight[self.vocab_ids].detach().to(self.dtype, copy=True)
        self.draft_lm = torch.nn.Linear(*self.lm_weight.shape[::-1], bias=False, device="meta")
        self.draft_lm.weight = torch.nn.Parameter(self.lm_weight, requires_grad=False)  # shared, not copied
        if linear_kernel(target.model) != "torch":  # the target runs on packed weights: so do the heads
            # (on the CPU a 1-2 row product is faster packed: docs/explanation/metrics-and-costs.md)
            bfloat16 = self.dtype == torch.bfloat16
            pack_linear_layers(self.heads, bfloat16=bfloat16)
            self.draft_lm = PackedLinear(self.draft_lm, bfloat16=bfloat16)

    @property
    def extra_parameters(self) -> int:
        """Parameters this drafter adds to the target (heads plus the draft vocabulary's LM-head rows)."""
        return sum(p.numel() for p in self.heads.parameters()) + self.lm_weight.numel()

    @classmethod
    def example_options(cls, target, workdir: str) -> dict:
        """Untrained heads for any target, saved in `workdir`: drafts are poor but verification still runs."""
        import torch
        from specframe_s4c.heads import S4CHeads

        path = Path(workdir) / f"s4c-untrained-{target.name}.safetensors"
        if not path.is_file():
            torch.manual_seed(0)
            S4CHeads(target).save(path)
        return {"heads": str(path)}

    @inference_mode
    def propose(self, context: DraftContext) -> DraftProposal:
        import torch

        if context.hidden is None or context.budget < 1:
            return DraftProposal.empty()  # first step after prefill: no target feature yet
        sampled = samples_drafts(self.draw, context.sampler)
        tokens, parents, scores, rows, dists = self.expand(context, sampled)
        device = self.lm_weight.device
        q_all = torch.cat(dists)  # (rows, Vd)
        full = torch.zeros(q_all.shape[0], self.target.vocab_size, dtype=torch.float32, device=device)
        full[:, self.vocab_ids] = q_all.float()  # (rows, V): q is zero outside the draft vocabulary
        probs = full[torch.tensor(rows, device=device)]  # (N, V) siblings share their row
        draw = DrawMethod.SAMPLED if sampled else DrawMethod.TOPK
        return DraftProposal(np.array(tokens), np.array(parents), np.array(scores), probs, draw,
                             ScoreKind.LOG_PROB)

    @inference_mode  # also when called directly (`suffix-heads` ranks the nodes without `propose`)
    def expand(self, context: DraftContext, sampled: bool = False):
        """The draft forest without its q rows: (tokens, parents, cumulative log q scores, node -> row of
        the q blocks, the (n_k, Vd) q block of each head). `propose` adds the (N, V) q matrix that the
        `rejection` verifier needs; a caller that only ranks the nodes (`suffix-heads`) skips it. Needs
        `context.hidden` and a budget >= 1."""
        import torch

        limit = context.budget if sampled else None  # sampled: stop at the budget, so no builder prunes
        device = self.lm_weight.device
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        rows: list[int] = []  # node -> row of `dists`
        dists: list[torch.Tensor] = []  # one (n_k, Vd) block per head
        # Frontier: nodes to expand now, with the feature that predicted them. The root first.
        frontier = [-1]
        frontier_tokens = torch.tensor([int(context.tokens[-1])], device=device)
        frontier_feats = context.hidden.reshape(1, -1).to(self.dtype)  # (1, H)
        chain = -1  # the top-1 (sampled: first-drawn) chain's deepest node
        row_base = 0
        for k in range(self.depth):
            feats = self.heads(k, self.embed(frontier_tokens).to(self.dtype), frontier_feats)  # (n, H)
            logits = self.draft_lm(feats)  # (n, Vd)
            q = context.sampler.probs(logits) if sampled else torch.softmax(logits.float(), -1)  # (n, Vd)
            picks = self._pick(q, context.sampler if sampled else None)  # per row: draft-vocab indices
            dists.append(q)
            first = len(tokens)
            for j, parent in enumerate(frontier):
                base = scores[parent] if parent >= 0 else 0.0
                for index in picks[j][: None if limit is None else limit - len(tokens)]:
                    tokens.append(int(self.vocab_ids[index]))
                    parents.append(parent)
                    scores.append(base + float(q[j, index].log()))
                    rows.append(row_base + j)
            batch_start, row_base = row_base, row_base + len(frontier)
            new = list(range(first, len(tokens)))
            if k + 1 == self.depth or not new or (limit is not None and len(tokens) >= limit):
                break
            chain = next((i for i in new if parents[i] == chain), new[0])  # first child of the chain's end
            rest = sorted((i for i in new if i != chain), key=lambda i: -scores[i])
            frontier = [chain, *rest[: self.widths[k + 1] - 1]]
            frontier_tokens = torch.tensor([tokens[i] for i in frontier], device=device)
            slots = [rows[i] - batch_start for i in frontier]  # where each node's parent sits in this batch
            frontier_feats = feats[slots]  # (n', H) the feature head k predicted for each chosen node
        return tokens, parents, scores, rows, dists

    def _pick(self, q: torch.Tensor, sampler: Sampler | None) -> list[list[int]]:
        """Children of each row of (n, Vd) q as draft-vocabulary indices: the `topk` most likely, or (with
        a sampler) `topk` i.i.d. draws merged in the order first drawn."""
        if sampler is not None:
            return sampler.draw_drafts(q, self.topk)
        return q.topk(min(self.topk, q.shape[-1]), dim=-1).indices.tolist()
