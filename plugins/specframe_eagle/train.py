"""Training an EAGLE head for any target on text it reads (`specframe train eagle`), resumably.

Each step reads a batch of token blocks, runs the frozen target over them once (its hidden states are the
head's inputs and targets, its logits the token targets) and trains the head on every position at once:

- **step 0** (teacher forcing): the pair (f_i, t_{i+1}) predicts f_{i+1}, whose logits should give the
  target's distribution of t_{i+2};
- **steps 1..unroll-1** (EAGLE-3's training-time test): the pair (o_{i-1}, t_{i+1}), o the head's own
  output of the step before, predicts the same, attending to the real context up to i - s and to its own
  chain of drafted positions, exactly what drafting at depth s + 1 sees (`unrolled_mask`).

Losses: the token loss is the cross-entropy against the target's distribution over the draft vocabulary;
the EAGLE form adds EAGLE's feature regression (smooth L1 against f_{i+1}, the token loss weighted 0.1),
EAGLE-3 has none (its output is no target feature). Later unrolled steps weigh 0.8^s. The draft vocabulary
of EAGLE-3 is the data's most frequent tokens.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import specframe
from specframe.kit.files import io_failure
from specframe.kit.training import (
    STATE_FILE, check_bounds, run_steps, save_train_state,
    read_run_state,
    batch_rows, cosine_lr, optimizer_step,
)
from specframe_eagle.checkpoint import config_for, save_head
from specframe_eagle.head import EagleHead, StepKeys, start_from_target


@dataclass
class TrainConfig:
    form: str = "eagle3"  # "eagle" (EAGLE-1/2) or "eagle3"
    features: str = "low-mid-high"  # EAGLE-3: "low-mid-high" (layers 2, L // 2, L - 3) or "last"
    draft_vocab: int = 8192  # EAGLE-3's draft vocabulary (0: the whole vocabulary)
    unroll: int = 3  # training-time test steps (1: teacher forcing only)
    block: int = 256
    batch: int = 4
    steps: int = 1000
    lr: float = 3e-4
    warmup: int = 20
    amp: bool = False  # bfloat16 autocast of the head: faster steps on a CPU with native bfloat16 products
    init: str = ""  # a head to start from (its weights and draft vocabulary), e.g. an earlier stage's
    save_every: int = 50
    seed: int = 0

    def __post_init__(self):
        check_bounds("eagle training", self, {"draft_vocab": 0, "unroll": 1, "block": 3, "batch": 1,
                                              "steps": 1, "warmup": 0, "save_every": 1}, positive=("lr",))
        if self.form not in ("eagle", "eagle3") or self.features not in ("low-mid-high", "last"):
            raise specframe.ConfigurationError(
                "eagle training: form must be 'eagle' or 'eagle3' and features 'low-mid-high' or 'last', "
                f"got {self.form!r} and {self.features!r}")


def unrolled_mask(length: int, step: int, device=None) -> torch.Tensor:
    """(T, (step + 1) T) what unrolled step `step` at position i sees: the real context's keys up to
    i - step (block 0), and the chain of its own drafted positions, step k's key at i - step + k."""
    i = torch.arange(length, device=device)[:, None]
    c = torch.arange(length, device=device)[None, :]
    blocks = [c <= i - step] + [c == i - step + k for k in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


def frequent_tokens(blocks: np.ndarray, count: int, vocab: int) -> torch.Tensor:
    """The `count` most frequent token ids of `blocks`, sorted by id (ties: the lower id)."""
    counts = np.bincount(blocks.reshape(-1), minlength=vocab)
    order = np.lexsort((np.arange(vocab), -counts))[: min(count, vocab)]
    return torch.from_numpy(np.sort(order))


class Trainer:
    def __init__(self, target: specframe.Target, blocks: np.ndarray, out_dir: Path, config: TrainConfig,
                 log=print):
        self.target, self.blocks, self.config, self.log = target, blocks, config, log
        self.out_dir = Path(out_dir)
        vocab = int(target.model.get_input_embeddings().weight.shape[0])
        draft = config.draft_vocab if config.form == "eagle3" and config.draft_vocab else vocab
        last = () if config.features == "last" else None  # (): the final feature alone, no `fc`
        self.head = EagleHead(config_for(target, config.form, last, draft)).to(target.device)
        if config.form == "eagle3":
            ids = frequent_tokens(blocks, draft, vocab).to(target.device)
            self.head.d2t.copy_(ids - torch.arange(len(ids), device=target.device))
            self.head.t2d.zero_()
            self.head.t2d[ids] = True
        generator = torch.Generator().manual_seed(config.seed)
        start_from_target(self.head, target, generator)
        if config.init:
            self._start_from(config.init)
        self.head.train().requires_grad_(True)
        target.model.requires_grad_(False)
        self.vocab_ids = (None if config.form != "eagle3"
                          else torch.arange(len(self.head.d2t), device=target.device) + self.head.d2t)
        params = [p for p in self.head.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
        self.step = self.saved = 0
        self.order = np.random.default_rng(config.seed).permutation(len(blocks))
        self.history: list[dict] = []

    def _start_from(self, spec: str) -> None:
        """Take the weights and draft vocabulary of the head `spec` (`--init`), which must be of this form,
        features and draft vocabulary size."""
        from specframe_eagle.checkpoint import load_head

        loaded, path = load_head(self.target, spec)
        mine, theirs = self.head.config, loaded.config
        if (theirs.form, theirs.feature_layers, theirs.draft_vocab_size, theirs.layers) != (
                mine.form, mine.feature_layers, mine.draft_vocab_size, mine.layers):
            raise specframe.ConfigurationError(
                f"eagle training: --init {path} is a {theirs.form} head reading layers "
                f"{theirs.feature_layers} with {theirs.draft_vocab_size} draft tokens, but this run trains a "
                f"{mine.form} head reading {mine.feature_layers} with {mine.draft_vocab_size}: pass the same "
                "--form, --features and --draft-vocab as the run that wrote it")
        self.head.load_state_dict({name: t.float() if t.is_floating_point() else t
                                   for name, t in loaded.state_dict().items()})

    # --- one step ----------------------------------------------------------------------------------

    def targets(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From one frozen forward of the target over (B, T) ids: the head's input features (B, T, F), the
        final features (B, T, H) and the target's log-probabilities over the draft vocabulary (B, T, Vd)."""
        with torch.no_grad(), torch.autocast(ids.device.type, enabled=False):  # the target in its dtype
            out = self.target.model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
            states = out.hidden_states
            layers = self.head.config.feature_layers
            inputs = states[-1] if not layers else torch.cat([states[i] for i in layers], dim=-1)
            final = states[-1]
            lm = self.target.model.get_output_embeddings().weight
            rows = lm if self.vocab_ids is None else lm[self.vocab_ids]
            logp = torch.log_softmax((final @ rows.T).float(), dim=-1)  # (B, T, Vd)
        return inputs.float(), final.float(), logp

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        if self.config.form == "eagle3":
            return self.head.lm_head(self.head.norm(out))
        return out @ self.target.model.get_output_embeddings().weight.T  # the target's own, frozen

    def losses(self, ids: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
        """The batch's loss and, per unrolled step, its parts (token, feature, top-1 agreement)."""
        feats, final, logp = self.targets(ids)
        embeds = self.target.model.get_input_embeddings()(ids[:, 1:]).float()  # (B, T-1, H) e(t_{i+1})
        length = embeds.shape[1]
        positions = torch.arange(length, device=ids.device)[None]  # (1, T-1)
        want_logp, want_feat = logp[:, 1:], final[:, 1:]  # what position i predicts: row i + 1
        keys = StepKeys(self.head)
        inputs = feats[:, :-1]  # (B, T-1, F) f_i
        total, parts = 0.0, []
        for s in range(self.config.unroll):
            mask = unrolled_mask(length, s, ids.device)[None, None]
            out = self.head(embeds, inputs, positions, keys, None, mask)  # (B, T-1, H)
            valid = slice(s, None)  # positions with a whole chain of s drafted inputs
            logq = torch.log_softmax(self.logits(out[:, valid]).float(), dim=-1)
            p = want_logp[:, valid].exp()
            token = -(p * logq).sum(-1).mean()
            loss = token
            part = {"token": float(token.detach())}
            if self.config.form == "eagle":
                feature = torch.nn.functional.smooth_l1_loss(out[:, valid], want_feat[:, valid])
                loss = feature + 0.1 * token
                part["feature"] = float(feature.detach())
            part["top1"] = float((logq.argmax(-1) == want_logp[:, valid].argmax(-1)).float().mean())
            total = total + 0.8 ** s * loss
            parts.append(part)
            inputs = torch.cat([out[:, :1] * 0, out[:, :-1]], dim=1)  # o_{i-1}, shifted to position i
        return total, parts

    def lr_at(self, step: int) -> float:
        c = self.config
        return cosine_lr(step, c.lr, c.warmup, c.steps)

    def train_step(self) -> dict:
        rows = batch_rows(self.order, self.step, self.config.batch)
        ids = torch.from_numpy(self.blocks[rows]).to(self.target.device)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=self.config.amp):
            loss, parts = self.losses(ids)
        optimizer_step(self.optimizer, loss, self.head.parameters(), self.lr_at(self.step))
        self.step += 1
        return {"step": self.step, "loss": float(loss.detach()), "steps": parts}

    def run(self, max_minutes: float | None = None) -> None:
        run_steps(self, max_minutes, lambda record: "top1 by depth [" + " ".join(
            f"{p['top1']:.3f}" for p in record["steps"]) + "]")

    # --- state and export ----------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.out_dir / STATE_FILE

    def tensors(self) -> dict[str, torch.Tensor]:
        return {**self.head.state_dict(), "order": torch.from_numpy(np.asarray(self.order, np.int64))}

    def save(self) -> None:
        try:
            extra = {"config": asdict(self.config), "step": self.step, "history": self.history[-200:]}
            save_train_state(self.state_path, self.tensors(), self.optimizer, extra)
        except OSError as err:
            kept = (f"the state saved at step {self.saved} is kept: rerun with the same --out to resume"
                    if self.saved else "no training state was saved yet")
            raise specframe.ConfigurationError(f"eagle training: writing {self.state_path} failed: "
                                               + io_failure(err, kept)) from None
        self.saved = self.step

    def resume(self) -> bool:
        """Continue from the state in `out_dir`, if any (safetensors and JSON: loading it runs no code)."""
        state = read_run_state(self.out_dir, asdict(self.config), "eagle")
        if state is None:
            return False
        weights = state.weights(self.tensors())
        order = weights.pop("order").numpy()
        step = state.extra.get("step")
        if (not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= self.config.steps
                or len(order) != len(self.order)
                or not np.array_equal(np.sort(order), np.arange(len(order)))):
            raise state.error("holds a damaged step or data order, or was written for other data")
        state.load_optimizer(self.optimizer)
        self.head.load_state_dict(weights)
        self.step = self.saved = step
        self.order, self.history = order, list(state.extra.get("history") or [])
        return True

    def export(self, directory: Path, command: str, sources: list[str]) -> Path:
        """The head in its published layout (config.json + model.safetensors, fp16) with how it was made."""
        recent = self.history[-20:]
        summary = {"steps": self.step, "tokens_seen": self.step * self.config.batch * self.config.block,
                   "command": command, "data": sources, "config": asdict(self.config),
                   "final_top1_by_depth": [float(np.mean([r["steps"][k]["top1"] for r in recent]))
                                           for k in range(self.config.unroll)] if recent else []}
        save_head(self.head.eval(), directory, self.target, extra={"training": summary})
        (directory / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
        return directory
