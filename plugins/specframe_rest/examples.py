"""Small datastores that make `rest` work on any target, for demos and conformance tests.

A target with a tokenizer gets a few standard-library modules; a tokenizer-less test model gets its own
greedy continuations of a few fixed prompts (so drafts are sometimes accepted, as with a real corpus).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from specframe_corpus.build import build_datastore
from specframe_corpus.datastore import HEADER
from specframe_corpus.sources import TextFiles, TokenDocuments

EXAMPLE_MODULES = ("textwrap.py", "string.py", "functools.py", "heapq.py", "bisect.py")


def example_datastore(target, workdir: Path) -> Path:
    """Build (once) and return a small datastore for `target` inside `workdir`."""
    out = Path(workdir) / f"rest-example-{target.vocab_size}-{'text' if target.tokenizer else 'ids'}"
    if not (out / HEADER).is_file():
        build_datastore(out, [example_source(target)], target, progress=False)
    return out


def example_source(target):
    if target.tokenizer is not None:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = [root / name for name in EXAMPLE_MODULES if (root / name).is_file()]
        return TextFiles("python-stdlib (5 modules)", "files", len(files), {}, files)
    return TokenDocuments("greedy continuations", "ids", documents=own_continuations(target))


@torch.inference_mode()
def own_continuations(target, prompts: int = 6, new_tokens: int = 64) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    vocab = target.vocab_size
    starts = torch.randint(0, vocab, (prompts, 4), generator=generator)  # (P, 4)
    out = target.model.generate(
        starts.to(target.device),
        attention_mask=torch.ones_like(starts).to(target.device),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return out.tolist()  # (P, 4 + new_tokens)
