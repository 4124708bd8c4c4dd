"""`specframe train s4c`: train S4C heads for a target on a corpus, resumably."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from specframe.kit.cli_options import device_option, dtype_option, model_option

def train_s4c(
    model: str = model_option(),
    device: str = device_option(),
    dtype: str = dtype_option(),
    data: list[str] = typer.Option(["python-stdlib"], help="corpus: python-stdlib[:N], a dir, .jsonl, text, "
                                   "or answers:NAME (the target's own chats or code: a `model:self` or "
                                   "`model-continue:python-stubs` datastore build)"),
    out: Path = typer.Option(Path("s4c-run"),
                             help="run directory: state.safetensors (resumable) and heads.safetensors"),
    steps: int = typer.Option(1000, min=1, help="optimizer steps (length of the cosine schedule)"),
    max_minutes: float = typer.Option(
        None, min=0, help="stop after this many minutes (state is saved; rerun to resume)"),
    heads: int = typer.Option(3, min=1, help="number of draft heads"),
    block: int = typer.Option(256, min=2, help="tokens per training sequence"),
    batch: int = typer.Option(4, min=1, help="sequences per step"),
    lr: float = typer.Option(3e-4),
    draft_vocab: int = typer.Option(16384, min=0,
                                    help="draft vocabulary size (most frequent corpus tokens); 0 = all"),
    max_tokens: int = typer.Option(None, min=1, help="use at most this many corpus tokens"),
    threads: int = typer.Option(None, min=1, help="torch CPU threads"),
    fresh: bool = typer.Option(False, help="ignore an existing training state in --out"),
    init: Path = typer.Option(None, help="start from these heads' weights (a heads.safetensors with as many "
                              "--heads, for this model or one of the same hidden size and vocabulary, e.g. "
                              "the Llama a hybrid was converted from); the draft vocabulary is chosen "
                              "from --data"),
    amp: bool = typer.Option(False, help="train in bfloat16 autocast (float32 weights): faster "
                             "steps on CPUs with native bfloat16 (AVX-512 BF16, AMX)"),
) -> None:
    """Train S4C draft heads; progress goes to stdout, state to OUT/state.safetensors every few steps."""
    import time

    import torch

    import specframe
    from specframe_s4c.train import Trainer

    start = time.time()
    config = checked_config(out, init, num_heads=heads, block=block, batch=batch, lr=lr, steps=steps,
                            draft_vocab=draft_vocab, amp=amp)
    if threads:
        torch.set_num_threads(threads)
    target = specframe.load_target(model, device=device, dtype=dtype)
    cache = feature_cache(target, data, out, config, max_tokens)
    trainer = Trainer(target, cache, out, config, log=log)
    if not fresh and trainer.resume():
        log(f"s4c: resumed {trainer.state_path} at step {trainer.step}")
    left = None if max_minutes is None else max(0.0, max_minutes - (time.time() - start) / 60)
    trainer.run(max_minutes=left)
    command = "specframe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    trainer.export(out / "heads.safetensors", command, data)
    log(f"s4c: wrote {out / 'heads.safetensors'} after {trainer.step} steps")


def checked_config(out: Path, init: Path | None, **settings):
    """The training settings as a `TrainConfig` (which refuses bad ones), with `--init` read and `--out`
    checked writable: all before the model loads."""
    from specframe.kit.files import check_writable_dir
    from specframe_s4c.heads import read_heads_file
    from specframe_s4c.train import TrainConfig

    config = TrainConfig(**settings, init=str(init or ""))
    if init is not None and not init.is_file():
        raise typer.BadParameter(f"no heads file at {init}", param_hint="--init")
    if init is not None:
        read_heads_file(init)  # a damaged or foreign file is refused
    check_writable_dir(out, "s4c training: --out", "pass an --out directory that can be written")
    return config


def feature_cache(target, data: list[str], out: Path, config, max_tokens: int | None):
    """The corpus `data` cut into blocks of `config.block` tokens, and the target's features of them,
    computed once into `out/features` (resumable)."""
    from specframe_s4c.data import token_blocks
    from specframe_s4c.features import FeatureCache

    eos = min(target.eos_token_ids) if target.eos_token_ids else None
    blocks = token_blocks(target.tokenizer, data, config.block, max_tokens=max_tokens, eos=eos)
    log(f"s4c: {blocks.size} tokens in {len(blocks)} blocks of {config.block} from {data}")
    cache = FeatureCache(out / "features", blocks, hidden=target.model.config.hidden_size)
    cache.fill(target, batch=config.batch, log=log)
    return cache


def log(line: str) -> None:
    """Print a progress line of the training at once (stdout may be a pipe)."""
    print(line, flush=True)
