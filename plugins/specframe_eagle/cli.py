"""`specframe train eagle`: train an EAGLE head for a target on text it reads, resumably."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from specframe.kit.cli_options import device_option, dtype_option, model_option


DATA_HELP = ("what the target reads, as `specframe datastore build --source` takes it: a directory, a .jsonl "
             "of texts or chats, a text file, python-stdlib, or the target's own answers "
             "(model:PROMPTS.jsonl, model:self), or answers:NAME, those of an earlier datastore build NAME")
OUT_HELP = ("run directory (default $SPECFRAME_HOME/eagle/MODEL, whose head `eagle` and its presets use "
            "by default): state.safetensors (resumable) and head/, the head in its published layout "
            "(config.json, model.safetensors)")
FORM_HELP = ("eagle3 (three layers' features, a reduced draft vocabulary, trained with its own drafts) or "
             "eagle (EAGLE-1/2: the last feature, the target's LM head)")
FEATURES_HELP = ("eagle3: low-mid-high (the target's layers 2, L/2, L-3: decode with --backend "
                 "\"kv(hidden_layers=...)\") or last (its final feature, any backend)")


def train_eagle(
    model: str = model_option(),
    device: str = device_option(),
    dtype: str = dtype_option(),
    data: list[str] = typer.Option(["python-stdlib"], help=DATA_HELP),
    out: Path = typer.Option(None, help=OUT_HELP),
    form: str = typer.Option("eagle3", help=FORM_HELP),
    features: str = typer.Option("low-mid-high", help=FEATURES_HELP),
    draft_vocab: int = typer.Option(8192, min=0, help="eagle3: draft vocabulary (the data's most frequent "
                                    "tokens); 0 = all"),
    unroll: int = typer.Option(3, min=1, help="steps of the training-time test (drafting on its own "
                               "outputs)"),
    steps: int = typer.Option(1000, min=1, help="optimizer steps (length of the cosine schedule)"),
    max_minutes: float = typer.Option(None, min=0, help="stop after this many minutes (state is saved; "
                                      "rerun to resume)"),
    block: int = typer.Option(256, min=3, help="tokens per training sequence"),
    batch: int = typer.Option(4, min=1, help="sequences per step"),
    lr: float = typer.Option(3e-4),
    max_tokens: int = typer.Option(None, min=1, help="use at most this many data tokens"),
    threads: int = typer.Option(None, min=1, help="torch CPU threads"),
    amp: bool = typer.Option(False, help="train the head in bfloat16 autocast (float32 weights): faster "
                             "on CPUs with native bfloat16 products (the target reads the data in --dtype)"),
    fresh: bool = typer.Option(False, help="ignore an existing training state in --out"),
    init: str = typer.Option(None, help="start from this head's weights and draft vocabulary (an earlier "
                             "run's OUT/head, of the same --form, --features and --draft-vocab)"),
) -> None:
    """Train an EAGLE head; progress goes to stdout, state to OUT/state.safetensors every few steps."""
    import time

    import torch

    import specframe
    from specframe.kit.files import check_writable_dir
    from specframe_eagle.data import token_blocks
    from specframe_eagle.train import TrainConfig, Trainer

    start = time.time()
    config = TrainConfig(form=form, features=features, draft_vocab=draft_vocab, unroll=unroll, block=block,
                         batch=batch, steps=steps, lr=lr, amp=amp,
                         init=init or "")
    if out is not None:  # checked before the slow load; the default one after it (it names the model)
        check_writable_dir(out, "eagle training: --out", "pass an --out directory that can be written")
    if threads:
        torch.set_num_threads(threads)
    target = specframe.load_target(model, device=device, dtype=dtype)
    out = out or default_run_dir(target)
    blocks = token_blocks(target, data, block, out, max_tokens, log=log)
    log(f"eagle: {blocks.size:,} tokens in {len(blocks)} blocks of {block} from {data}")
    trainer = Trainer(target, blocks, out, config, log=log)
    if not fresh and trainer.resume():
        log(f"eagle: resumed {trainer.state_path} at step {trainer.step}")
    left = None if max_minutes is None else max(0.0, max_minutes - (time.time() - start) / 60)
    trainer.run(max_minutes=left)
    command = "specframe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    head = trainer.export(out / "head", command, data)
    layers = trainer.head.config.feature_layers
    backend = f' --backend "kv(hidden_layers={layers})"' if layers else ""
    log(f"eagle: wrote {head} after {trainer.step} steps; decode with --drafter \"eagle(heads='{head}')\" "
        f"--tree dynamic{backend}")


def default_run_dir(target) -> Path:
    """`$SPECFRAME_HOME/eagle/MODEL`, whose head `eagle` uses by default for that model, checked writable."""
    from specframe.kit.files import check_writable_dir
    from specframe_eagle.drafter import trained_head_dir

    out = trained_head_dir(target.name)
    check_writable_dir(out, "eagle training: the default run directory", "pass an --out that can be written")
    return out


def log(line: str) -> None:
    """Print a progress line at once (stdout may be a pipe)."""
    print(line, flush=True)
