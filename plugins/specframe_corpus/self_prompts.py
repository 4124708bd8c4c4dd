"""`model:self`: a datastore from prompts the target writes itself, and its own greedy answers to them.

`model:PROMPTS.jsonl` needs representative prompts. A chat model can supply them: given only its chat
template up to the start of a user turn, it samples a plausible user request (the Magpie recipe, Xu et
al. 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing"). The
prompts are written to `<out>.prompts.jsonl` beside the datastore (resumable: a rerun samples only the
missing ones, with the same seeds), then answered greedily as `model:` sources are (see `answers.py`).
No text comes from a benchmark or a hub: the corpus is the target's own voice on its own questions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from specframe.kit.files import json_or_none
from specframe.kit.progress import bar as progress_bar
from specframe_corpus.answers import WrittenPrompts
from specframe_corpus.datastore import DatastoreError

MARK = "\u2063specframe-user-turn\u2063"  # a placeholder no chat template rewrites
SAMPLE_BATCH = 32  # prompts sampled per generate call (one shared prefix, no padding)


@dataclass
class SelfPrompts(WrittenPrompts):
    """`count` prompts sampled from the target's pre-query template, then the target's answers to them."""

    KIND: ClassVar[str] = "model-self"

    count: int = 2000
    max_prompt_tokens: int = 96

    def write_prompts(self, target, path: Path) -> list[str]:
        """Sample the prompts into `path`, or reuse those sampled there before (`write_self_prompts`)."""
        return write_self_prompts(target, path, self.count, self.max_prompt_tokens, self.seed)


def pre_query(tokenizer) -> str:
    """The chat template's text up to where a user's message would begin (system turn included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise DatastoreError("model:self needs a chat model: this tokenizer has no chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                         add_generation_prompt=True)
    if MARK not in text:
        raise DatastoreError("model:self: the chat template drops the user's message; cannot find its start")
    return text[: text.index(MARK)]


def write_self_prompts(target, path: Path, count: int, max_tokens: int = 96, seed: int = 0) -> list[str]:
    """Sample `count` distinct user prompts from `target` into `path` (JSONL, {"prompt": ...}).

    Batch b is sampled with seed `seed + b`, so an interrupted run resumes where it stopped and a
    finished file is reproduced exactly. Prompts that do not end within `max_tokens` (cut mid-sentence),
    that are empty, or that repeat an earlier one are dropped and more batches are drawn.
    """
    settings = {"model": target.name, "seed": seed, "max_prompt_tokens": max_tokens}
    prompts, batch = _read(path, settings)
    if len(prompts) >= count:
        return prompts[:count]
    tokenizer = target.tokenizer
    prefix = tokenizer(pre_query(tokenizer), add_special_tokens=False, return_tensors="pt")["input_ids"]
    eos = sorted(target.eos_token_ids)
    seen = set(prompts)
    with open(path, "a", encoding="utf-8") as f, \
            progress_bar(total=count, initial=len(prompts), desc="writing prompts", unit="prompt") as bar:
        if batch == 0:
            f.write(json.dumps({"settings": settings}) + "\n")
        while len(prompts) < count:
            if batch > 50 + 4 * count // SAMPLE_BATCH:
                raise DatastoreError(
                    f"model:self: only {len(prompts)} distinct prompts after {batch} batches")
            for text in _sample(target, prefix, eos, max_tokens, seed + batch):
                if text is not None and text not in seen and len(prompts) < count:
                    seen.add(text)
                    prompts.append(text)
                    bar.update(1)
                    f.write(json.dumps({"prompt": text, "batch": batch}) + "\n")
            batch += 1
            f.write(json.dumps({"batch_done": batch}) + "\n")
            f.flush()
    return prompts


@torch.inference_mode()
def _sample(target, prefix: torch.Tensor, eos: list[int], max_tokens: int, seed: int) -> list[str | None]:
    """One batch of sampled user turns (temperature 1); None for a turn that did not end."""
    torch.manual_seed(seed)
    ids = prefix.expand(SAMPLE_BATCH, -1).to(target.device)
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                top_p=1.0, top_k=0, max_new_tokens=max_tokens, eos_token_id=eos,
                                pad_token_id=eos[0])
    texts = []
    for row in out[:, ids.shape[1]:].tolist():
        end = next((j for j, t in enumerate(row) if t in eos), None)
        text = target.tokenizer.decode(row[:end]).strip() if end is not None else ""
        texts.append(text or None)
    return texts


def _read(path: Path, settings: dict) -> tuple[list[str], int]:
    """The prompts of finished batches in `path` and how many batches it holds; ([], 0) if none or stale.
    Lines after the last finished batch (an interrupted one) are cut off, so a resumed run appends cleanly."""
    if not path.is_file():
        return [], 0
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    prompts, pending, batches, keep = [], [], 0, 0
    for number, line in enumerate(lines):
        record = json_or_none(line)
        if not isinstance(record, dict):
            break  # a line cut by an interruption: what came before it stands
        if number == 0 and record.get("settings") != settings:
            break
        if "prompt" in record:
            pending.append(record["prompt"])
        elif "batch_done" in record:
            prompts, pending, batches, keep = prompts + pending, [], record["batch_done"], number + 1
    if batches == 0:
        path.unlink()
        return [], 0
    if keep < len(lines):
        path.write_text("".join(lines[:keep]), encoding="utf-8")
    return prompts, batches
