"""The `eagle` drafter: an EAGLE head drafting a tree in the target's feature space, level by level.

Mapping EAGLE onto specframe's step. The head reads pairs (f_j, t_{j+1}): the target's feature at
position j (the one that predicted token j + 1) and that token. Before a step the committed context is
t_0..t_n, t_n the pending root, and the target's features f_0..f_{n-1} are known: the prompt's come with
the request's first scores (`StepOutcome.prompt_hidden`, from a backend that keeps them, as `kv` does; else
the drafter computes them once with a forward of the target over the prompt), every later position's with
the step that committed it (`StepOutcome.hidden_path`: the root's and each accepted node's). `propose`
first feeds the pairs not read yet through the head, writing their keys into the head's own KV cache (the
committed context), which gives the head's prediction of f_n; that feature scores the root's children.
Then, level by level, the `width` best nodes of the newest level (by cumulative log q, as EAGLE-2
expands) are fed to the head with their parent's predicted feature, each attending to the context and its
own ancestors; their `topk` most likely tokens are the next level. Greedy drafting stops at the level
after which no deeper node could rank among the `budget` best (cumulative log q only falls with depth):
levels the tree would drop cost no head call. Keys of drafted nodes are written after
the context and never kept: the next step rewrites those columns with the target's real features of the
accepted tokens (the cache rolls back to the accepted path by construction).

Scores are cumulative log q and `draft_probs` the head's real distributions (zero outside an EAGLE-3 draft
vocabulary), so `chain`, `trie`, `static`, `beam` and `dynamic` can shape the forest, and `rejection`
verifies sampled drafts losslessly: with `draw=auto` a sampling request's children are `topk` i.i.d.
draws from the head's distribution processed like the target's, merged in the order first drawn, numbered
depth by depth, the first-drawn chain always expanded, stopping at the budget (the rule s4c and
draft-model follow: `specframe.DrawMethod`).

`dtype` is what the head computes in: `auto` (the default) is bfloat16, packed for oneDNN, where the
target runs on packed float32 weights (the CPU default) and the CPU multiplies bfloat16 natively, else
the target's dtype; `target` keeps the target's. A draft only decides what is proposed, so the output
stays the target's, and a sampled draft's q is the distribution it was drawn from in that dtype.

The first step of a request drafts nothing: no target feature exists before the prompt's forward.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specframe import (
    ConfigurationError, DraftContext, DraftProposal, Drafter, DrafterCapabilities, DrawMethod, ModelLoadError,
    ScoreKind, StepOutcome,
)
from specframe.kit.drafting import DraftDraw, DraftDtype, check_draw, samples_drafts
from specframe.kit.inference import inference_mode

if TYPE_CHECKING:  # torch is imported where it is used, so that registering the drafter loads none
    import torch


FORMS = {"eagle": "EAGLE", "eagle3": "EAGLE-3"}  # the forms' names in messages
WEIGHTS_DIR = Path(__file__).parent / "weights"


def packaged_head(model_name: str) -> Path:
    """The directory of the head shipped with specframe for a model alias (it may not exist)."""
    return WEIGHTS_DIR / model_name


def trained_head_dir(model_name: str) -> Path:
    """Where `specframe train eagle --model MODEL` trains by default: `$SPECFRAME_HOME/eagle/MODEL` (its
    head in `head/`), so that `eagle` and its presets find a head trained here."""
    from specframe.kit.files import specframe_home

    return specframe_home() / "eagle" / model_name.replace("/", "--")


def default_head(model_name: str) -> Path | None:
    """The head `eagle` uses without `heads=`: one shipped for the model, else one `specframe train eagle`
    wrote to its default place; None when neither exists."""
    for directory in (packaged_head(model_name), trained_head_dir(model_name) / "head"):
        if (directory / "config.json").is_file():
            return directory
    return None


class EagleDrafter(Drafter):
    name = "eagle"
    capabilities = DrafterCapabilities(needs_hidden_states=True, provides_draft_probs=True,
                                       proposes_trees=True, samples_drafts=True,
                                       score_kind=ScoreKind.LOG_PROB, drafting_grows_with_budget=True)

    option_limits = {"topk": (1, 4096), "width": (1, 4096), "depth": (1, 64)}

    def __init__(self, target, *, heads: str | None = None, topk: int = 4, width: int = 4, depth: int = 5,
                 draw: DraftDraw = "auto", dtype: DraftDtype = "auto"):
        import torch

        from specframe.kit.models import drafting_dtype, linear_kernel, pack_linear_layers
        from specframe_eagle.checkpoint import draft_token_ids, load_head

        super().__init__(target)
        if not heads:
            default = default_head(target.name)
            heads = str(default) if default is not None else None
        if not heads:
            raise ModelLoadError(
                f"eagle: no head for '{target.name}' ships or was trained here: train one with `specframe "
                f"train eagle --model {target.name}` (it then serves as the default), or name one, "
                "eagle(heads=DIR_OR_HUB_ID) (a directory with config.json and model.safetensors, EAGLE-1/2 "
                "or EAGLE-3 layout)")
        if min(topk, width, depth) < 1:
            raise ConfigurationError(
                f"eagle: topk, width and depth must be >= 1, got {topk}, {width}, {depth}")
        self.topk, self.width, self.depth = int(topk), int(width), int(depth)
        self.draw = check_draw("eagle", draw)
        self.head, self.path = load_head(target, heads)
        self.dtype = drafting_dtype(dtype, target, "eagle")
        for param in self.head.parameters():  # the rotary frequencies stay float32
            param.data = param.data.to(self.dtype)
        if linear_kernel(target.model) != "torch":  # the target runs on packed weights: so does the head
            pack_linear_layers(self.head, bfloat16=self.dtype == torch.bfloat16)
        self.embed = target.model.get_input_embeddings()
        self.vocab_ids = draft_token_ids(self.head)  # (Vd,) target id of each draft row; None: all
        self._vocab_np = None if self.vocab_ids is None else self.vocab_ids.cpu().numpy()  # for each proposal
        self._lm_head = None if self.head.config.form == "eagle3" else target.model.get_output_embeddings()
        self.reset()

    @property
    def extra_parameters(self) -> int:
        """Parameters this drafter adds to the target (the head; the target's embedding is shared)."""
        return sum(p.numel() for p in self.head.parameters())

    @classmethod
    def example_options(cls, target, workdir: str) -> dict:
        """An untrained EAGLE head for any target, saved in `workdir` (`start_from_target`: it proposes what
        the target said at the previous position): drafts are poor, their distributions sharp and real."""
        from pathlib import Path

        import torch

        from specframe_eagle.checkpoint import CONFIG, config_for, save_head
        from specframe_eagle.head import EagleHead, start_from_target

        path = Path(workdir) / f"eagle-untrained-{target.name}"
        if not (path / CONFIG).is_file():
            head = start_from_target(EagleHead(config_for(target)), target, torch.Generator().manual_seed(0))
            save_head(head, path, target, dtype=torch.float32)
        return {"heads": str(path)}

    def reset(self) -> None:
        self.cache = None  # the head's KV cache (`HeadCache`), made at the first step that drafts
        self.length = 0  # committed pairs whose keys the cache holds: positions [0, length)
        self.tokens = np.zeros(0, np.int64)  # the tokens t_0..t_length those keys were computed from
        self.queue: list[torch.Tensor] = []  # target features of the last committed positions, unread
        self.lost = False  # a step came without features: recompute them from the target
        self.root = None  # (1, H) the head's prediction of the feature at position `length`

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.prompt_hidden is not None and self.length == 0 and not self.queue:
            self._check_width(outcome.prompt_hidden)
            self.queue.append(outcome.prompt_hidden)
        if outcome.hidden_path is None:
            self.lost = True
            return
        self._check_width(outcome.hidden_path)
        self.queue.append(outcome.hidden_path)

    def _check_width(self, features: torch.Tensor) -> None:
        config = self.head.config
        if features.shape[-1] == config.feature_width:
            return
        if config.feature_layers:
            fix = (f"it reads the target's hidden states {config.feature_layers} joined "
                   f"({config.feature_width} wide): pass --backend "
                   f"\"kv(hidden_layers={config.feature_layers})\"")
        else:
            fix = (f"it reads the target's final hidden state ({config.feature_width} wide): use a backend "
                   "that hands out that one (kv without hidden_layers)")
        raise ConfigurationError(f"eagle: the backend hands the head features {features.shape[-1]} wide, but "
                                 f"the {FORMS[config.form]} head in {self.path} does not: {fix}")

    @inference_mode
    def propose(self, context: DraftContext) -> DraftProposal:
        if context.budget < 1 or not self._read_context(context):
            return DraftProposal.empty()
        return self._draft(context, samples_drafts(self.draw, context.sampler))

    # --- the committed context -------------------------------------------------------------------------

    def _read_context(self, context: DraftContext) -> bool:
        """Feed the pairs the head has not read (the last steps' accepted tokens, or at first the whole
        context) through it; False when no target feature exists yet (the request's first step)."""
        import torch

        from specframe_eagle.head import HeadCache

        tokens = np.asarray(context.tokens, dtype=np.int64)
        n = len(tokens) - 1
        queued = sum(len(f) for f in self.queue)
        same = self.length <= n and np.array_equal(self.tokens, tokens[: len(self.tokens)])
        if self.lost or not same or queued > n - self.length:  # unexpected context: start afresh
            self.length, self.tokens, self.root, self.lost = 0, tokens[:0], None, False
            self.queue, queued = [], 0
        if self.length == n and self.root is not None:
            return True
        if self.length == 0 and queued == 0 and context.hidden is None:
            return False
        start, known = self.length, n - queued
        parts = [self._target_features(tokens[:known])[start:]] if known > start else []
        parts += self.queue
        head = self.head
        device = next(head.parameters()).device
        feats = torch.cat([p.to(device=device, dtype=head.dtype) for p in parts])[None]  # (1, m, F)
        if self.cache is None:
            self.cache = HeadCache(head)
        ids = torch.from_numpy(tokens[start + 1: n + 1]).to(device)  # (m,) t_{j+1} of each pair j
        positions = torch.arange(start, n, device=device)  # (m,)
        mask = positions[None, :, None] >= torch.arange(n, device=device)[None, None, :]  # (1, m, n) causal
        out = head(self.embed(ids)[None], feats, positions[None], self.cache, positions, mask[:, None])
        self.root = out[0, -1:]  # (1, H)
        self.length, self.tokens, self.queue = n, tokens.copy(), []
        return True

    def _target_features(self, ids: np.ndarray) -> torch.Tensor:
        """(len(ids), F) the target's features of `ids` from one forward: what a backend that keeps no
        prompt features leaves to the drafter, once per request."""
        import torch

        model = self.target.model
        takes = inspect.signature(model.forward).parameters
        kwargs = {"logits_to_keep": 1} if "logits_to_keep" in takes else {}
        out = model(input_ids=torch.from_numpy(ids)[None].to(self.target.device), output_hidden_states=True,
                    **kwargs)
        layers = self.head.config.feature_layers
        states = out.hidden_states
        return (states[-1] if not layers else torch.cat([states[i] for i in layers], dim=-1))[0]

    # --- the draft tree ------------------------------------------------------------------------------

    @inference_mode
    def forest(self, context: DraftContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The head's top-k forest after `context` as (target token ids, parents, cumulative log q), without
        the distributions a proposal carries: for a drafter that merges it with others (`suffix-eagle`).
        Empty before the target's first features."""
        if context.budget < 1 or not self._read_context(context):
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        tokens, parents, scores, _, _ = self._grow(context, sampled=False)
        return self._target_ids(tokens), np.asarray(parents, np.int64), np.asarray(scores)

    def _draft(self, context: DraftContext, sampled: bool) -> DraftProposal:
        """The candidate forest (see the module docstring) with each node's draft distribution."""
        import torch

        tokens, parents, scores, rows, blocks = self._grow(context, sampled)
        if not tokens:
            return DraftProposal.empty()
        probs = self._full_rows(torch.cat(blocks))[torch.tensor(rows, device=blocks[0].device)]  # (N, V)
        draw = DrawMethod.SAMPLED if sampled else DrawMethod.TOPK if self.topk > 1 else DrawMethod.ARGMAX
        return DraftProposal(self._target_ids(tokens), np.asarray(parents), np.asarray(scores), probs, draw,
                             ScoreKind.LOG_PROB)

    def _target_ids(self, tokens: list[int]) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64)
        return ids if self._vocab_np is None else self._vocab_np[ids]

    def _grow(self, context: DraftContext, sampled: bool) -> tuple[list, list, list, list, list]:
        """Draft level by level: the nodes' draft-vocabulary tokens, parents and cumulative log q, each
        node's row in the stacked q blocks, and those blocks ((w, Vd) per level)."""

        budget = context.budget
        depth, width = min(self.depth, budget), min(self.width, budget)
        sampler = context.sampler if sampled else None
        limit = budget if sampled else None  # sampled: stop at the budget, so no builder prunes
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        rows: list[int] = []  # node -> row of the stacked q blocks
        blocks: list[torch.Tensor] = []  # (w, Vd) q of each level's expanded nodes
        frontier, outputs = [-1], self.root  # nodes whose children come next, and their predicted features
        slots: dict[int, int] = {}  # expanded node -> its column in the head's cache
        chain = -1  # the first-drawn (greedy: any) chain's deepest node
        for level in range(1, depth + 1):
            q = self._distributions(outputs, sampler)  # (w, Vd)
            picks = (sampler.draw_drafts(q, self.topk) if sampler is not None
                     else q.topk(min(self.topk, q.shape[-1]), dim=-1).indices.tolist())
            logq = q.clamp_min(1e-30).log()
            base_row, first = sum(len(b) for b in blocks), len(tokens)
            blocks.append(q)
            for j, parent in enumerate(frontier):
                base = scores[parent] if parent >= 0 else 0.0
                for index in picks[j][: None if limit is None else max(limit - len(tokens), 0)]:
                    tokens.append(index)
                    parents.append(parent)
                    scores.append(base + float(logq[j, index]))
                    rows.append(base_row + j)
            new = list(range(first, len(tokens)))
            if level == depth or not new or (limit is not None and len(tokens) >= limit):
                break
            ranked = sorted(new, key=lambda i: (-scores[i], i))
            if sampler is not None:  # the first-drawn chain first, so `chain` builders keep going deeper
                chain = next((i for i in new if parents[i] == chain), new[0])
                ranked = [chain, *(i for i in ranked if i != chain)]
            expand = ranked[:width]
            if sampler is None and out_of_reach(scores, budget, scores[expand[0]]):
                break
            outputs = self._expand(expand, [rows[i] - base_row for i in expand], outputs, tokens, parents,
                                   slots, level)
            frontier = expand
        return tokens, parents, scores, rows, blocks

    def _distributions(self, outputs: torch.Tensor, sampler) -> torch.Tensor:
        """(w, H) predicted features -> (w, Vd) draft distributions (processed like the target's when the
        request samples its drafts)."""
        import torch

        head = self.head
        if self._lm_head is None:  # EAGLE-3: its own norm and LM head over the draft vocabulary
            logits = head.lm_head(head.norm(outputs))  # (w, Vd)
        else:  # EAGLE: the target's LM head on the predicted feature
            logits = self._lm_head(outputs.to(self._lm_head.weight.dtype))  # (w, V)
        return sampler.probs(logits) if sampler is not None else torch.softmax(logits.float(), dim=-1)

    def _expand(self, expand: list[int], sources: list[int], outputs: torch.Tensor, tokens: list[int],
                parents: list[int], slots: dict[int, int], level: int) -> torch.Tensor:
        """Feed the nodes `expand` of depth `level` (draft-vocabulary indices in `tokens`) through the head,
        each with its parent's predicted feature (`outputs[sources]`); their predicted features (w, H).
        Their keys go after the columns already used; each sees the context, its ancestors and itself."""
        import torch

        device = outputs.device
        first = self.length + len(slots)
        for k, node in enumerate(expand):
            slots[node] = first + k
        end = first + len(expand)
        mask = torch.zeros(len(expand), end, dtype=torch.bool, device=device)  # (w, end)
        mask[:, : self.length] = True
        for k, node in enumerate(expand):
            while node >= 0:
                mask[k, slots[node]] = True
                node = parents[node]
        ids = torch.tensor([tokens[i] for i in expand], device=device)
        if self.vocab_ids is not None:
            ids = self.vocab_ids[ids]
        positions = torch.full((1, len(expand)), self.length + level - 1, device=device)  # depth d: n + d - 1
        columns = torch.arange(first, end, device=device)
        return self.head(self.embed(ids)[None], outputs[sources][None], positions, self.cache, columns,
                         mask[None, None])[0]

    def _full_rows(self, q: torch.Tensor) -> torch.Tensor:
        """(R, Vd) draft distributions over the target's vocabulary (R, V): zero outside the draft one."""
        import torch

        if self.vocab_ids is None:
            return q.float()
        full = torch.zeros(q.shape[0], self.target.vocab_size, dtype=torch.float32, device=q.device)
        full[:, self.vocab_ids] = q.float()
        return full


def out_of_reach(scores: list[float], budget: int, best_next: float) -> bool:
    """Whether no node below one scored `best_next` can rank among the `budget` best nodes drafted so far:
    a child's cumulative log q is at most its parent's, and `dynamic` keeps the `budget` best by score,
    the shallower first on ties. Drafting deeper would cost head calls for nodes `dynamic` drops (a
    `chain` builder gets a shorter chain, where its path was unlikely anyway)."""
    return len(scores) >= budget and best_next <= sorted(scores, reverse=True)[budget - 1]

