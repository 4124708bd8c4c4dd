"""Distillation data: token blocks from the corpus the REST datastore reads (the Python standard library) and
from the teacher's own greedy answers to chat prompts (`specframe_hybrid.prompts`), and the held-out texts
quality is measured on (HumanEval prompts and Spec-Bench questions, which no training block contains)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from specframe import ConfigurationError
from specframe.kit.files import write_atomically
from specframe.kit.progress import bar as progress_bar
from specframe_hybrid.prompts import distillation_prompts

BLOCKS_FILE = "blocks.safetensors"


def training_blocks(target, run_dir: Path, *, block: int, code_tokens: int, chat_prompts: int,
                    chat_new_tokens: int, log=print) -> torch.Tensor:
    """(N, block) token ids: the chat transcripts (prompt and the teacher's answer) first, then standard
    library files, each document ended by EOS, joined and cut into blocks. Cached in
    `run_dir/blocks.safetensors` (a damaged cache, or one made with other settings, is made again); the
    answers are generated resumably (`run_dir/chat.answers.jsonl`)."""
    cached = run_dir / BLOCKS_FILE
    settings = {"block": block, "code_tokens": code_tokens, "chat_prompts": chat_prompts,
                "chat_new_tokens": chat_new_tokens, "model": target.name}
    blocks = cached_blocks(cached, settings, target.vocab_size)
    if blocks is not None:
        return blocks
    eos = min(target.eos_token_ids) if target.eos_token_ids else 0
    stream: list[int] = []
    for document in chat_transcripts(target, run_dir, chat_prompts, chat_new_tokens):
        stream += document + [eos]
    chat = len(stream)
    for document in code_documents(target.tokenizer, code_tokens):
        stream += document + [eos]
    usable = len(stream) // block * block
    if not usable:
        raise ConfigurationError(f"hybrid: {len(stream)} training tokens do not fill one block of {block}: "
                                 "raise --code-tokens or --chat-prompts")
    blocks = torch.tensor(stream[:usable], dtype=torch.long).view(-1, block)  # (N, block)
    log(f"hybrid: {blocks.numel()} training tokens in {len(blocks)} blocks of {block} "
        f"({chat} from {chat_prompts} chat answers, the rest standard library code)")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(cached, save({"blocks": blocks}, metadata={"settings": json.dumps(settings)}))
    return blocks


def cached_blocks(path: Path, settings: dict, vocab_size: int) -> torch.Tensor | None:
    """The blocks cached at `path` for `settings`, or None when there are none, or they are damaged or
    were made with other settings (safetensors and JSON: reading the cache runs no code)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            stored = json.loads((f.metadata() or {}).get("settings", "null"))
            blocks = f.get_tensor("blocks") if stored == settings else None
    except (SafetensorError, OSError, ValueError, RecursionError):
        return None
    if (blocks is None or blocks.dtype != torch.long or blocks.dim() != 2 or not len(blocks)
            or blocks.shape[1] != settings["block"] or blocks.min() < 0 or blocks.max() >= vocab_size):
        return None
    return blocks


def chat_transcripts(target, run_dir: Path, prompts: int, new_tokens: int) -> list[list[int]]:
    """The chat-templated prompt and the teacher's greedy answer, for `prompts` distillation prompts."""
    from specframe_corpus.answers import ModelAnswers, prompt_ids

    if prompts == 0:
        return []
    run_dir.mkdir(parents=True, exist_ok=True)
    prompt_file = run_dir / "prompts.jsonl"
    texts = distillation_prompts(prompts)
    prompt_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in texts))
    source = ModelAnswers.from_spec(f"model:{prompt_file}", max_new_tokens=new_tokens, batch_size=16)
    source.prepare(target, run_dir / "chat")
    answers = source.answers()
    return [prompt_ids(target.tokenizer, text) + answers[i] for i, text in enumerate(texts)]


def code_documents(tokenizer, tokens: int, seed: int = 0) -> list[list[int]]:
    """Standard library files in a fixed shuffled order, tokenized, until `tokens` ids are collected."""
    from specframe_corpus.source_specs import parse_source

    files = list(parse_source("python-stdlib").files)
    random.Random(seed).shuffle(files)  # many packages, not the first few alphabetically
    documents, total = [], 0
    with progress_bar(total=tokens, desc="tokenizing code", unit="tok") as bar:
        for file in files:
            if total >= tokens:
                break
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:4 * 1024]  # no file dominates
            documents.append(ids)
            total += len(ids)
            bar.update(len(ids))
    return documents


def held_out_texts(tokenizer, humaneval: int = 20, per_category: int = 5) -> dict[str, list[list[int]]]:
    """Held-out token sequences by suite, encoded as the benchmarks feed them: the first `humaneval` HumanEval
    prompts (raw code) and `per_category` Spec-Bench questions per category (first turn, chat template)."""
    from specframe.kit.prompts import encode_turn, load_suite

    return {suite: [encode_turn(tokenizer, prompt, 0, []) for prompt in load_suite(suite, limit)]
            for suite, limit in (("humaneval", humaneval), ("spec-bench", per_category))}
