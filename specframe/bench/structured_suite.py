"""The prompts of a structured-output run and their JSON schemas: the suite shipped with the package
(`specframe/support/data/structured.jsonl`, written for this project: facts extracted from a passage,
function-call arguments, schema-bound answers), a JSONL file whose rows carry a `schema`, or any suite's
first turns under one `--json-schema FILE`; every schema checked by llguidance before a model loads, and
whether an output is valid under its schema. The run itself is `specframe.bench.structured`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specframe.terms.constraint import ConstraintError

SUITE = "structured"


@dataclass(frozen=True)
class StructuredPrompt:
    qid: str
    category: str
    prompt: str
    schema: dict
    chat: bool = False  # wrapped in the tokenizer's chat template (a chat suite's turns under --json-schema)


def load_structured_suite(limit: int | None = None) -> list[StructuredPrompt]:
    """The shipped suite's prompts, at most `limit` per category (in file order)."""
    text = resources.files("specframe.support").joinpath("data", "structured.jsonl").read_text("utf-8")
    prompts, taken = [], {}
    for line in text.splitlines():
        row = json.loads(line)
        if limit is not None and taken.get(row["category"], 0) >= limit:
            continue
        taken[row["category"]] = taken.get(row["category"], 0) + 1
        prompts.append(StructuredPrompt(row["question_id"], row["category"], row["turns"][0], row["schema"]))
    return prompts


def suite_schemas(suite: str) -> dict[str, dict] | None:
    """The schema of every question of the JSONL file `suite` by id, or None where no row carries one (a
    suite name, or a file of plain prompts). A file where only some rows carry one is refused."""
    if suite == SUITE or not Path(suite).is_file():
        return None
    schemas, missing = {}, []
    for line in Path(suite).read_text("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # `load_suite` reports it
        if not isinstance(row, dict) or "question_id" not in row:
            continue
        if "schema" in row:
            schemas[str(row["question_id"])] = row["schema"]
        else:
            missing.append(row["question_id"])
    if schemas and missing:
        raise ConstraintError(f"suite {suite}: {len(missing)} question(s) carry no \"schema\" (first: "
                              f"{missing[0]}) where others do: give every row a schema, or none and pass "
                              "--json-schema FILE")
    return schemas or None


def is_structured(suite: str, json_schema: dict | None) -> bool:
    """Whether `specframe bench` runs the structured run: on `--suite structured`, a suite whose rows carry
    schemas, or any suite under `--json-schema`."""
    return suite == SUITE or json_schema is not None or suite_schemas(suite) is not None


def structured_prompts(suite: str, limit: int | None, json_schema: dict | None) -> list[StructuredPrompt]:
    """The prompts of a structured run, every schema checked by llguidance (no model needed): the shipped
    suite's, a JSONL file's rows with their schemas, or any suite's first turns under `json_schema`."""
    from specframe.runtime.structured import check_source
    from specframe.support.prompt_suites import load_suite

    schemas = load_structured_suite(limit) if suite == SUITE else suite_schemas(suite)
    if schemas is not None and json_schema is not None:
        raise ConstraintError(f"suite '{suite}' gives each prompt its own schema: leave --json-schema "
                              "out, or pass a suite of plain prompts with it")
    if suite == SUITE:
        prompts = schemas
    else:
        prompts = [StructuredPrompt(p.qid, p.category, p.turns[0],
                                    json_schema if schemas is None else schemas[str(p.qid)], p.chat)
                   for p in load_suite(suite, limit)]
    for prompt in prompts:
        try:
            check_source(json_schema=prompt.schema)
        except ConstraintError as err:
            raise ConstraintError(f"question {prompt.qid}: {err}; fix its schema") from None
    return prompts


def is_valid(text: str, schema: dict) -> bool:
    """Whether `text` is JSON that `schema` accepts."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True




def read_schema(path: Path | None) -> dict | None:
    """The JSON schema in the file `--json-schema` names (None for none), checked by llguidance."""
    from specframe.runtime.structured import check_source
    from specframe.support.untrusted import parse_json

    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ConstraintError(f"--json-schema {path}: cannot read it ({err.strerror or err})") from None
    schema = parse_json(data, f"--json-schema {path}", "pass a JSON schema file", ConstraintError)
    check_source(json_schema=schema)
    return schema
