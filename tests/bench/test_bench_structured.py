"""The shipped structured-output suite: 30+ prompts whose schemas compile, in three categories, and a run
of it on a tiny model where every method's output is valid and identical to constrained plain decoding."""

from __future__ import annotations

import json

import pytest

import specframe
from specframe.bench.structured import (
    GuidanceProcessor, is_valid, load_structured_suite, run_method, split_methods,
)
from specframe.testing.targets import tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(seed=0)


def test_the_suite_holds_30_prompts_in_three_categories_whose_schemas_compile(tiny):
    prompts = load_structured_suite()
    assert len(prompts) >= 30 and len({p.qid for p in prompts}) == len(prompts)
    assert {p.category for p in prompts} == {"extraction", "function-call", "schema-answer"}
    for prompt in prompts:
        specframe.constraint_for(tiny, json_schema=prompt.schema)  # raises on a bad schema
    assert len(load_structured_suite(limit=2)) == 6


def test_validity_is_json_that_the_schema_accepts():
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}
    assert is_valid('{"a": 3}', schema)
    assert not is_valid('{"a": "3"}', schema) and not is_valid('{"a": 3', schema)


def test_method_specs_split_at_top_level_commas():
    assert split_methods("pld+chain@8, forced(then='pld(matches=4)')+trie@8") == \
        ["pld+chain@8", "forced(then='pld(matches=4)')+trie@8"]


def test_every_method_matches_constrained_plain_decoding_on_a_tiny_model(tiny):
    schema = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
              "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99}}}
    prompts = [p for p in load_structured_suite(limit=1)]
    prompts = [type(p)(p.qid, p.category, "ok n ok n {", schema) for p in prompts]
    constraints = {p.qid: specframe.constraint_for(tiny, json_schema=p.schema) for p in prompts}
    runs = [run_method(tiny, method, prompts, constraints, 24)
            for method in ("none+chain@1", "forced(then=pld)+chain@4", "transformers")]
    for run in runs:
        row = run.row(runs[0])
        assert row["valid"] == 1.0 and row["identical"] == 1.0, row
    assert all(json.loads(tiny.tokenizer.decode(t)) for t in runs[1].tokens.values())


def test_the_transformers_processor_masks_what_the_constraint_forbids(tiny):
    import torch

    processor = GuidanceProcessor(specframe.constraint_for(tiny, regex="ab"), prompt_length=1)
    scores = processor(torch.tensor([[5]]), torch.zeros(1, tiny.vocab_size))  # (1, V)
    assert torch.isfinite(scores).sum() == 1
