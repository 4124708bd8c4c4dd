"""`model:PROMPTS.jsonl`: a self-built datastore from the target's own answers to a prompt file.

The REST paper leaves this as future work: where no large permissive corpus exists (chat), the target's
own greedy answers to representative prompts are the text it is most likely to repeat. Answers are
generated in batches (left-padded, greedy), appended to a cache file after every batch under a digest
of their prompt, and a rerun skips the prompts already answered, so a long generation can be interrupted
and resumed, and a prompt file can grow without answering again what it held.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from specframe.kit.files import check_encodable, json_lines, json_or_none
from specframe.kit.prompts import chat_ids
from specframe.kit.inference import inference_mode
from specframe.kit.progress import bar as progress_bar
from specframe_corpus.datastore import DatastoreError
from specframe_corpus.sources import Source, TokenDocuments

# Prompts answered per generate call: for SmolLM2-135M on a CPU, larger batches than this were no faster
# and took more memory, smaller ones slower; the answers are identical at any size.
ANSWER_BATCH = 32
PROMPT_FIELDS = ("prompt", "question", "instruction", "input", "text", "turns", "messages")


def check_generation(spec: str, max_new_tokens: int, batch_size: int) -> None:
    """Refuse answer lengths and batch sizes below 1, naming the command-line option."""
    for option, value in (("--answer-tokens", max_new_tokens), ("--batch-size", batch_size)):
        if value < 1:
            raise DatastoreError(f"datastore source '{spec}': {option} must be at least 1, not {value}")


@dataclass
class ModelAnswers(Source):
    path: Path = Path()
    max_new_tokens: int = 256
    batch_size: int = ANSWER_BATCH
    target: object = None
    cache: Path | None = None
    prompts: list[str] = field(default_factory=list)
    template: bool = True  # False: continue each prompt as raw text (`model-continue:`), as code is fed

    @classmethod
    def from_spec(cls, spec: str, max_new_tokens: int = 256, batch_size: int = ANSWER_BATCH) -> ModelAnswers:
        """`model:PROMPTS.jsonl` (answers in the chat template) or `model-continue:PROMPTS.jsonl` (raw)."""
        check_generation(spec, max_new_tokens, batch_size)
        template = not spec.startswith("model-continue:")
        path = Path(spec.removeprefix("model:").removeprefix("model-continue:")).expanduser()
        if not path.is_file():
            raise DatastoreError(f"datastore source '{spec}': prompt file '{path}' does not exist")
        prompts = read_prompts(path)
        if not prompts:
            raise DatastoreError(f"datastore source '{spec}': no prompts in '{path}'")
        meta = {"prompts": len(prompts), "max_new_tokens": max_new_tokens}
        kind = "model-answers" if template else "model-continuations"
        return cls(spec, kind, len(prompts), meta, path, max_new_tokens, batch_size, prompts=prompts,
                   template=template)

    def prepare(self, target, out: Path) -> None:
        """Bind the target and put the resumable cache beside the output directory."""
        if target.tokenizer is None:
            raise DatastoreError(f"datastore source '{self.spec}': model '{target.name}' has no tokenizer")
        self.target, self.cache = target, out.parent / f"{out.name}.answers.jsonl"
        self.meta["cache"] = str(self.cache)

    def answers(self) -> dict[int, list[int]]:
        """Prompt index -> the target's greedy answer ids, generating (and caching) those not yet answered."""
        return self._generate_missing()

    def batches(self) -> Iterator[tuple[list, int]]:
        answers = self.answers()
        yield from TokenDocuments(
            self.spec, self.kind, documents=[answers[i] for i in range(len(self.prompts)) if answers[i]]
        ).batches()

    def _settings(self) -> dict:
        raw = {} if self.template else {"template": False}  # chat answers keep the caches they always had
        return {"model": self.target.name, "max_new_tokens": self.max_new_tokens, **raw}

    def _generate_missing(self) -> dict[int, list[int]]:
        settings = self._settings()
        answers = self._read_cache(settings)
        todo = sorted(
            (i for i in range(len(self.prompts)) if i not in answers), key=lambda i: len(self.prompts[i])
        )  # similar lengths share a batch: less padding
        if not answers:
            self.cache.write_text(json.dumps({"settings": settings}) + "\n")
        with (
            open(self.cache, "a", encoding="utf-8") as f,
            progress_bar(
                total=len(self.prompts), initial=len(answers), desc="answering prompts", unit="prompt"
            ) as bar,
        ):
            for start in range(0, len(todo), self.batch_size):
                batch = todo[start : start + self.batch_size]
                for i, ids in zip(batch, self._answer([self.prompts[i] for i in batch])):
                    answers[i] = ids
                    f.write(json.dumps({"prompt": prompt_key(self.prompts[i]), "ids": ids}) + "\n")
                f.flush()
                bar.update(len(batch))
        self.meta["generated"] = len(todo)
        return answers

    def _read_cache(self, settings: dict) -> dict[int, list[int]]:
        if not self.cache.is_file():
            return {}
        lines = self.cache.read_text(encoding="utf-8", errors="replace").splitlines()
        first = json_or_none(lines[0]) if lines else None
        if not isinstance(first, dict) or first.get("settings") != settings:
            return {}  # another prompt file, model or length (or a damaged cache): start over
        records = []
        for line in filter(str.strip, lines[1:]):
            record = json_or_none(line)
            ids = record.get("ids") if isinstance(record, dict) else None
            if not (isinstance(ids, list) and all(type(t) is int for t in ids)):
                break  # a line cut by an interruption: keep what parsed before it
            records.append(record)
        by_key = {r.get("prompt"): r["ids"] for r in records}
        keys = map(prompt_key, self.prompts)
        return {i: [int(t) for t in by_key[k]] for i, k in enumerate(keys) if k in by_key}

    def _answer(self, prompts: list[str]) -> list[list[int]]:
        """Greedy answers (without the EOS token) for one batch of prompts."""
        encoded = [prompt_ids(self.target.tokenizer, p, self.template) for p in prompts]
        return generate_batch(self.target, encoded, self.max_new_tokens, do_sample=False)


@dataclass
class WrittenPrompts(Source):
    """The target's answers to `count` prompts written first to `<out>.prompts.jsonl` beside the datastore
    (`model:self`, `model-continue:python-stubs`). A subclass names its `KIND`, whether its prompts are
    answered in the chat template (`TEMPLATE`), and how the prompts are written (`write_prompts`)."""

    KIND: ClassVar[str] = ""
    TEMPLATE: ClassVar[bool] = True

    count: int = 1000
    seed: int = 0
    max_new_tokens: int = 256
    batch_size: int = ANSWER_BATCH
    answers: ModelAnswers | None = None

    @classmethod
    def from_spec(cls, spec: str, count: int, max_new_tokens: int = 256,
                  batch_size: int = ANSWER_BATCH) -> WrittenPrompts:
        """The source for `spec` with `count` prompts (`--self-prompts`), refused below 1."""
        if count < 1:
            raise DatastoreError(f"datastore source '{spec}': --self-prompts must be at least 1, not {count}")
        check_generation(spec, max_new_tokens, batch_size)
        meta = {"prompts": count, "max_new_tokens": max_new_tokens, "seed": 0}
        return cls(spec, cls.KIND, count, meta, count, max_new_tokens=max_new_tokens, batch_size=batch_size)

    def write_prompts(self, target, path: Path) -> list[str]:
        """Write (or reuse) the prompt file at `path`; return its prompts."""
        raise NotImplementedError

    def prepare(self, target, out: Path) -> None:
        """Write the prompt file beside `out`, then bind the answers source to it."""
        path = out.parent / f"{out.name}.prompts.jsonl"
        prompts = self.write_prompts(target, path)
        self.answers = ModelAnswers(self.spec, self.kind, len(prompts), {}, path, self.max_new_tokens,
                                    self.batch_size, prompts=prompts, template=self.TEMPLATE)
        self.answers.prepare(target, out)
        self.meta["prompt_file"] = str(path)

    def batches(self) -> Iterator[tuple[list, int]]:
        yield from self.answers.batches()

    def describe(self) -> dict:
        generated = {} if self.answers is None else {"generated": self.answers.meta.get("generated", 0)}
        return {**super().describe(), **generated}


@inference_mode  # torch loads on the first call: `specframe --help` reads ANSWER_BATCH
def generate_batch(target, encoded: list[list[int]], max_new_tokens: int, **sampling) -> list[list[int]]:
    """The target's continuations of a batch of token-id prompts of any lengths, each cut before its first
    end-of-sequence token. The prompts are left-padded and the padding masked, so each continues as it
    would alone; `sampling` goes to transformers' `generate` (`do_sample`, `temperature`, ...)."""
    import torch

    tokenizer, eos = target.tokenizer, target.eos_token_ids
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    width = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), width), pad, dtype=torch.long)  # (B, L) left-padded
    mask = torch.zeros_like(ids)
    for row, e in enumerate(encoded):
        ids[row, width - len(e) :] = torch.tensor(e)
        mask[row, width - len(e) :] = 1
    out = target.model.generate(ids.to(target.device), attention_mask=mask.to(target.device),
                                max_new_tokens=max_new_tokens, pad_token_id=pad, **sampling)
    result = []
    for row in out[:, width:].tolist():  # (B, T) new tokens
        cut = next((j for j, t in enumerate(row) if t in eos), len(row))
        result.append(row[:cut])
    return result


def prompt_key(prompt: str) -> str:
    """What an answer is cached under: its prompt's digest, so editing or extending the prompt file
    keeps the answers of the prompts it still holds."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:24]


def prompt_ids(tokenizer, prompt: str, template: bool = True) -> list[int]:
    """A prompt's ids as the target reads it: in its chat template (if it has one and `template`), or raw."""
    if template and getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, [{"role": "user", "content": prompt}],
                        "or build from raw prompts (no chat template)")
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def built_answers(name: str, tokenizer) -> Iterator[list[int]]:
    """The prompt (in the chat template, or raw for a `model-continue:` build) and greedy answer ids of
    every answered prompt of the datastore build `name` (its `NAME.prompts.jsonl` and `NAME.answers.jsonl`
    in the datastore home), in prompt order: the target's own text, for training draft heads on it. A line
    cut by an interrupted build is skipped, as the build itself skips it."""
    from specframe_corpus.stores import datastore_home

    prompts, answers = (datastore_home() / f"{name}.{part}.jsonl" for part in ("prompts", "answers"))
    if not (prompts.is_file() and answers.is_file()):
        raise DatastoreError(
            f"no prompts and answers of a datastore build '{name}' in {datastore_home()}; make them with "
            f"`specframe datastore build --source model:self --out {name}` (chats) or `--source "
            f"model-continue:python-stubs` (code)")
    cached, template = {}, True
    for line in answers.read_text(encoding="utf-8", errors="replace").splitlines():
        record = json_or_none(line)
        if not isinstance(record, dict):
            continue
        if "ids" in record:
            cached[record["prompt"]] = record["ids"]
        elif "settings" in record:  # `model-continue:` builds continue their prompts raw, as code is fed
            template = record["settings"].get("template", True)
    for line in prompts.read_text(encoding="utf-8", errors="replace").splitlines():
        record = json_or_none(line)
        prompt = record.get("prompt") if isinstance(record, dict) else None
        answer = cached.get(prompt_key(prompt)) if isinstance(prompt, str) else None
        if answer:
            yield prompt_ids(tokenizer, prompt, template) + list(answer)


def read_prompts(path: Path) -> list[str]:
    """The first user turn of every line of a JSONL prompt file."""
    prompts = []
    fix = "write one JSON object or string per line"
    for number, record in json_lines(path, fix, DatastoreError, where=f"prompt file '{path}'"):
        prompt = (
            record
            if isinstance(record, str)
            else next(
                (
                    _first_text(record[k])
                    for k in PROMPT_FIELDS
                    if isinstance(record, dict) and k in record
                ),
                None,
            )
        )
        if not prompt:
            raise DatastoreError(
                f"prompt file '{path}', line {number}: no prompt in any of {', '.join(PROMPT_FIELDS)}"
            )
        prompts.append(check_encodable(prompt, f"prompt file '{path}', line {number}",
                                       "fix or remove that escape", DatastoreError))
    return prompts


def _first_text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        first = value[0]
        return first if isinstance(first, str) else first.get("content") if isinstance(first, dict) else None
    return None
