"""Training S4C heads on features of the frozen target (the paper's loss), resumable, with progress.

For a token block x_0..x_{T-1} the target gives post-norm features F_i (F_i predicts x_{i+1}). At every
position t, head 1 reads [e(x_t), F_{t-1}] and head k reads [e(x_{t+k-1}), F^_{k-1}], the feature head
k - 1 predicted: exactly what the drafter feeds them at decode time. Head k is trained towards F_{t+k-1}:

    loss_k = 0.1 * CE(q_k, x_{t+k}) + 1.0 * CE(q_k, p_{t+k-1}) + 0.1 * SmoothL1(F^_k, F_{t+k-1})

where q_k is the head's draft distribution (over the draft vocabulary) and p the target's, restricted to
the draft vocabulary (tokens outside it cannot be drafted, so the token CE ignores them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import SafetensorError

import specframe
from specframe.kit.files import io_failure, write_atomically
from specframe.kit.training import (
    check_bounds,
    STATE_FILE, run_steps, save_train_state,
    read_run_state,
    batch_rows, cosine_lr, optimizer_step,
)
from specframe_s4c.features import FeatureCache
from specframe_s4c.heads import (
    S4CHeads, check_fingerprint, fingerprint, map_head_weights, read_heads_file, target_parts,
)

WEIGHTS = {"token": 0.1, "distribution": 1.0, "feature": 0.1}  # the paper's loss weights


@dataclass
class TrainConfig:
    num_heads: int = 3
    block: int = 256  # tokens per training sequence
    batch: int = 4  # sequences per step
    lr: float = 3e-4
    warmup: int = 20
    steps: int = 1000  # total optimizer steps (the cosine schedule's length)
    draft_vocab: int = 16384  # most frequent corpus tokens the heads may propose; 0 = whole vocabulary
    save_every: int = 20
    seed: int = 0
    init: str = ""  # a heads file to start from (its weights; the draft vocabulary is chosen from this data)
    amp: bool = False  # bfloat16 autocast: faster steps on a CPU with native bfloat16 products

    def __post_init__(self):
        check_bounds("s4c training", self, {"num_heads": 1, "block": 2, "batch": 1, "warmup": 0, "steps": 1,
                                            "draft_vocab": 0, "save_every": 1}, positive=("lr",))


def frequent_tokens(blocks: np.ndarray, vocab_size: int, size: int, always: set[int] = frozenset()
                    ) -> torch.Tensor:
    """The `size` most frequent ids of `blocks` (ties: smaller id), plus `always` (e.g. EOS), sorted."""
    if size <= 0 or size >= vocab_size:
        return torch.arange(vocab_size)
    counts = np.bincount(blocks.reshape(-1), minlength=vocab_size).astype(np.float64)
    counts[list(always)] = np.inf
    order = np.lexsort((np.arange(vocab_size), -counts))[:size]
    return torch.from_numpy(np.sort(order))


def head_losses(heads: S4CHeads, target: specframe.Target, ids: torch.Tensor, feats: torch.Tensor
                ) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """The summed loss over heads for one batch, and per-head parts plus top-1 agreement with the target.

    `ids` (B, T) and the target's features `feats` (B, T, H). The target distribution p is taken over the
    draft vocabulary and renormalized there (the tokens outside it cannot be drafted anyway).
    """
    embed, _, lm_head, _ = target_parts(target)
    k_heads = len(heads)
    b, t, h = feats.shape
    n = t - k_heads - 1  # positions t = 1..n have every head's targets inside the block
    vocab = heads.vocab_ids  # (Vd,)
    w = lm_head.weight[vocab].detach()  # (Vd, H)
    remap = torch.full((lm_head.weight.shape[0],), -100, dtype=torch.long)
    remap[vocab] = torch.arange(len(vocab))  # full id -> draft id, -100 (ignored) outside the draft vocab
    with torch.no_grad():
        p_all = torch.softmax(feats @ w.T, -1)  # (B, T, Vd)
    feature = feats[:, 0:n].reshape(-1, h)  # (B*n, H) F_{t-1}
    total = feats.new_zeros(())
    report = []
    for k in range(1, k_heads + 1):
        tok_in = ids[:, k:k + n].reshape(-1)  # (B*n,) x_{t+k-1}
        feature = heads(k - 1, embed(tok_in).detach(), feature)  # (B*n, H) F^_k
        want_feat = feats[:, k:k + n].reshape(-1, h)  # (B*n, H) F_{t+k-1}
        want_p = p_all[:, k:k + n].reshape(-1, len(vocab))  # (B*n, Vd)
        want_tok = remap[ids[:, k + 1:k + 1 + n].reshape(-1)]  # (B*n,) x_{t+k} in draft ids
        logq = torch.log_softmax(feature @ w.T, -1)  # (B*n, Vd)
        parts = {
            "token": F.nll_loss(logq, want_tok, ignore_index=-100),
            "distribution": -(want_p * logq).sum(-1).mean(),
            "feature": F.smooth_l1_loss(feature, want_feat),
        }
        total = total + sum(WEIGHTS[name] * value for name, value in parts.items())
        agree = (logq.argmax(-1) == want_p.argmax(-1)).float().mean()
        report.append({name: v.item() for name, v in parts.items()} | {"top1": agree.item()})
    return total, report


def valid_history(history, num_heads: int) -> bool:
    """Whether `history` is a list of step records as `Trainer.train_step` makes them."""
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    return isinstance(history, list) and all(
        isinstance(r, dict) and number(r.get("loss")) and isinstance(r.get("heads"), list)
        and len(r["heads"]) == num_heads
        and all(isinstance(h, dict) and number(h.get("top1")) for h in r["heads"]) for r in history)


class Trainer:
    """Owns heads, optimizer and the data cursor; `run` trains until `steps` or a time limit, resumably."""

    def __init__(self, target: specframe.Target, cache: FeatureCache, out_dir: Path, config: TrainConfig,
                 log=print):
        self.target, self.cache, self.out_dir = target, cache, Path(out_dir)
        self.config, self.log = config, log
        blocks = cache.ids
        target.model.requires_grad_(False)
        torch.manual_seed(config.seed)
        eos = target.eos_token_ids
        vocab = frequent_tokens(blocks, target.vocab_size, config.draft_vocab, always=set(eos))
        self.heads = S4CHeads(target, config.num_heads, vocab_ids=vocab).train()
        if config.init:
            self.start_from(config.init)
        self.optimizer = torch.optim.AdamW(self.heads.parameters(), lr=config.lr, weight_decay=0.0)
        self.step = self.saved = 0  # `saved`: the step of the state last saved
        self.order = np.random.default_rng(config.seed).permutation(len(blocks))
        self.history: list[dict] = []

    def start_from(self, path: str) -> None:
        """Take the head weights of the heads file `path` (with as many heads). A head predicts a feature and
        the target's own LM head scores it, so the weights carry over to a draft vocabulary chosen from other
        data, and to another target of the same hidden size and vocabulary (a model converted from the
        heads' target, such as a hybrid distilled from it): there they are a warm start, mapped by name."""
        meta, tensors = read_heads_file(path)
        mine = fingerprint(self.target)
        if any(meta.get(k) != v for k, v in mine.items()):
            sizes = ("hidden_size", "vocab_size")
            if any(meta.get(k) != mine[k] for k in sizes):
                check_fingerprint(self.target, meta, Path(path))  # raises, naming what differs
            self.log(f"s4c training: --init {path} was trained for '{meta.get('model', '?')}' "
                     f"({meta.get('architecture')}), not '{self.target.name}' ({mine['architecture']}); "
                     f"same hidden size {mine['hidden_size']} and vocabulary {mine['vocab_size']}, so it is "
                     f"a warm start mapped onto this target's layer names")
        count = int(meta.get("num_heads", "0"))
        if count != len(self.heads):
            raise specframe.ConfigurationError(
                f"s4c training: --init {path} holds {count} heads, not {len(self.heads)}; "
                f"pass --heads {count}")
        own = {k: v for k, v in self.heads.state_dict().items() if k != "vocab_ids"}
        source = {k: v.float() for k, v in tensors.items() if k != "vocab_ids"}
        weights = map_head_weights(source, own, Path(path))
        self.heads.load_state_dict(weights | {"vocab_ids": self.heads.vocab_ids})

    @property
    def state_path(self) -> Path:
        return self.out_dir / STATE_FILE

    def resume(self) -> bool:
        """Load the training state from `out_dir` when present (safetensors and JSON: loading it runs no
        code). True if a run was resumed."""
        state = read_run_state(self.out_dir, asdict(self.config), "s4c")
        if state is None:
            return False
        stored_order = state.tensors.get("order")
        if stored_order is not None and stored_order.shape != (len(self.order),):
            raise specframe.ConfigurationError(
                f"s4c training: {self.state_path} was written for other data ({stored_order.numel()} blocks, "
                f"not {len(self.order)}); use a new --out directory or the same --data/--block/--max-tokens")
        weights = state.weights(self.tensors())
        order = weights.pop("order").numpy()
        step, history = state.extra.get("step"), state.extra.get("history")
        if (not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= self.config.steps
                or not np.array_equal(np.sort(order), np.arange(len(order)))
                or not valid_history(history, self.config.num_heads)):
            raise state.error("holds a damaged step, history or data order")
        state.load_optimizer(self.optimizer)
        self.heads.load_state_dict(weights)
        self.step, self.order, self.history = step, order, history
        self.saved = step
        return True

    def tensors(self) -> dict[str, torch.Tensor]:
        """What the training state stores as tensors: the heads' weights and the data order."""
        return {**self.heads.state_dict(), "order": torch.from_numpy(np.asarray(self.order, np.int64))}

    def save(self) -> None:
        with self.writing(self.state_path):
            save_train_state(self.state_path, self.tensors(), self.optimizer,
                             {"config": asdict(self.config), "step": self.step, "history": self.history})
        self.saved = self.step

    @contextmanager
    def writing(self, path: Path) -> Iterator[None]:
        """Report a failed write of `path` (a full or read-only disk) as an error that says what was kept:
        the state is replaced whole or not at all, so the last one saved still resumes."""
        try:
            yield
        except (OSError, SafetensorError) as err:
            kept = (f"the state saved at step {self.saved} in {self.state_path} is kept: rerun with the same "
                    "--out to resume from it" if self.saved else "no training state was saved yet")
            raise specframe.ConfigurationError(
                f"s4c training: writing {path} failed: " + io_failure(err, kept)) from None

    def lr_at(self, step: int) -> float:
        c = self.config
        return cosine_lr(step, c.lr, c.warmup, c.steps)

    def train_step(self) -> dict:
        rows = batch_rows(self.order, self.step, self.config.batch)
        ids, feats = self.cache.batch(rows)  # (B, T), (B, T, H)
        with torch.autocast(feats.device.type, dtype=torch.bfloat16, enabled=self.config.amp):
            loss, parts = head_losses(self.heads, self.target, ids, feats)
        optimizer_step(self.optimizer, loss, self.heads.parameters(), self.lr_at(self.step))
        self.step += 1
        return {"step": self.step, "loss": loss.item(), "heads": parts}

    def run(self, max_minutes: float | None = None) -> None:
        run_steps(self, max_minutes,
                  lambda record: "top1 [" + " ".join(f"{h['top1']:.3f}" for h in record["heads"]) + "]")

    def export(self, path: Path, command: str, sources: list[str]) -> None:
        """fp16 safetensors with the reproduction recipe in its metadata, plus a JSON summary beside it."""
        recent = self.history[-20:]
        summary = {"steps": self.step, "tokens_seen": self.step * self.config.batch * self.config.block,
                   "command": command, "data": sources, "config": asdict(self.config),
                   "final_top1_per_head": [float(np.mean([r["heads"][k]["top1"] for r in recent]))
                                           for k in range(len(self.heads))] if recent else []}
        with self.writing(path):
            extra = {"command": command, "data": json.dumps(sources), "steps": str(self.step),
                     "train_config": json.dumps(asdict(self.config))}
            self.heads.save(path, extra=extra)
            write_atomically(path.with_suffix(".json"), json.dumps(summary, indent=2) + "\n")
