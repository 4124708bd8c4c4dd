"""Structured output through `SpeculativeDecoder`: greedy decoding under a constraint emits exactly what
constrained plain greedy decoding emits (the argmax of the masked logits, computed here with the model's
own forward, no specframe backend), for several drafters, trees and budgets, alone and in a batch; the
`forced` drafter drafts what the constraint forces; bad constraints are refused before any work.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import specframe
from specframe import ConstraintError, SpeculativeDecoder
from specframe.testing.constrained import TokenAutomaton
from specframe.testing.targets import reference_logits, tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["id", "tags"],
          "properties": {"id": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}}}}
PROMPT = '{"id": 12, "tags": ["ab", "cd"]}\n{"id": 13, "tags": ["ab", "cd"]}\n'
NEW = 48


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(seed=0)  # the character-level tokenizer, no EOS


def plain_constrained_greedy(target, prompt_ids, constraint, n) -> list[int]:
    """The argmax of the masked logits, one full forward per token: the ground truth."""
    state, out = constraint.start(), []
    while len(out) < n:
        allowed = np.zeros(target.vocab_size, bool)
        allowed[: constraint.vocab_size] = state.allowed()
        if not allowed.any():
            break
        logits = reference_logits(target, [*prompt_ids, *out])[-1].numpy().copy()  # (V,)
        logits[~allowed] = -np.inf
        out.append(int(logits.argmax()))
        state = state.advance(out[-1])
    return out


@pytest.mark.parametrize("drafter,tree,budget", [
    ("none", "chain", 1), ("pld", "chain", 6), ("pld(matches=4)", "trie", 8), ("forced", "chain", 4),
    ("forced(then=pld)", "chain", 6), ("forced(then='pld(matches=4)')", "trie", 8),
])
def test_constrained_greedy_equals_constrained_plain_greedy(tiny, drafter, tree, budget):
    constraint = specframe.constraint_for(tiny, json_schema=SCHEMA)
    ids = tiny.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    expected = plain_constrained_greedy(tiny, ids, constraint, NEW)
    decoder = SpeculativeDecoder.from_names(tiny, drafter, tree, "greedy", "kv", budget=budget)
    result = decoder.generate(ids, max_new_tokens=NEW, constraint=constraint)
    assert result.tokens == expected, f"{drafter}+{tree}@{budget}: {result.text!r}"
    assert result.text.startswith('{"id": ')


def test_forced_tokens_are_drafted_and_accepted(tiny):
    constraint = specframe.constraint_for(tiny, json_schema=SCHEMA)
    plain = SpeculativeDecoder.from_names(tiny, "none", budget=4).generate(PROMPT, NEW,
                                                                          constraint=constraint)
    forced = SpeculativeDecoder.from_names(tiny, "forced", budget=4).generate(PROMPT, NEW,
                                                                             constraint=constraint)
    assert forced.tokens == plain.tokens
    # '{"id": ' opens the object: its forced tokens go in one step
    assert forced.metrics.accepted_draft_tokens >= 5
    assert forced.metrics.steps < plain.metrics.steps


def test_each_row_of_a_batch_holds_its_own_constraint(tiny):
    constraint = specframe.constraint_for(tiny, regex=r"[a-c]+(-[0-9])*")
    decoder = SpeculativeDecoder.from_names(tiny, "pld", budget=4)
    prompts = [PROMPT, "abc-1-2 abc-1-2 abc-", PROMPT]
    constraints = [constraint, None, constraint]
    alone = [decoder.generate(p, 20, constraint=c).tokens for p, c in zip(prompts, constraints)]
    batch = decoder.generate_batch(prompts, 20, constraint=constraints)
    assert [r.tokens for r in batch] == alone
    assert all(set(r.text) <= set("abc-0123456789") for r in (batch[0], batch[2]))


def test_a_complete_constraint_ends_a_target_without_eos(tiny):
    constraint = specframe.constraint_for(tiny, regex="yes|no")
    decoder = SpeculativeDecoder.from_names(tiny, "forced", budget=4)
    result = decoder.generate(PROMPT, 20, constraint=constraint)
    assert result.text in ("yes", "no") and result.finish_reason == "constraint"


def test_the_automaton_constrains_every_token(tiny):
    target = tiny_target(seed=1, vocab_size=8)
    automaton = TokenAutomaton.modular()
    result = SpeculativeDecoder.from_names(target, "pld", budget=4).generate(
        [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], 30, constraint=automaton)
    state = automaton.start()
    for token in result.tokens:
        state = state.advance(token)  # raises on a forbidden token


@pytest.mark.parametrize("kind,text,message", [
    ("json_schema", "{", "not valid JSON"),
    ("json_schema", {"type": "string", "minLength": 5, "maxLength": 2}, "Unsatisfiable"),
    ("json_schema", [1, 2], "JSON object"),
    ("regex", "(a", "unclosed group"),
    ("regex", r"[^\s\S]", "cannot be satisfied"),
    ("grammar", "start: foo", "unknown name"),
])
def test_bad_constraints_are_refused_before_any_work(tiny, kind, text, message):
    with pytest.raises(ConstraintError, match=message):
        specframe.constraint_for(tiny, **{kind: text})


def test_a_constraint_needs_exactly_one_source_and_a_tokenizer(tiny):
    with pytest.raises(ConstraintError, match="exactly one"):
        specframe.constraint_for(tiny, regex="a", grammar="start: /a/")
    with pytest.raises(ConstraintError, match="no tokenizer"):
        specframe.constraint_for(tiny_target(vocab_size=8), regex="a")


def test_the_decoder_refuses_what_cannot_honour_a_constraint(tiny):
    decoder = SpeculativeDecoder.from_names(tiny, "pld", budget=4)
    with pytest.raises(ConstraintError, match="specframe Constraint"):
        decoder.generate(PROMPT, 4, constraint="[a-z]+")
    big = TokenAutomaton(np.ones((1, 200), bool), np.zeros((1, 200), int))
    with pytest.raises(ConstraintError, match="vocabulary of 200"):
        decoder.generate(PROMPT, 4, constraint=big)
    kv = specframe.get_registry().get("backend", "kv")
    blind = type("Blind", (kv,), {"name": "blind", "capabilities": dataclasses.replace(
        kv.capabilities, honours_constraints=False)})
    refusing = SpeculativeDecoder.from_names(tiny, "pld", backend=blind, budget=4)
    with pytest.raises(ConstraintError, match="backend 'blind' declares that it cannot honour"):
        refusing.generate(PROMPT, 4, constraint=TokenAutomaton.modular(96))
    with pytest.raises(specframe.ConfigurationError, match="2 constraints for 3 prompts"):
        decoder.generate_batch([PROMPT] * 3, 4, constraint=[None, None])


SMOL_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "year", "languages"],
               "properties": {"name": {"type": "string", "maxLength": 20}, "year": {"type": "integer"},
                              "languages": {"type": "array", "maxItems": 3,
                                            "items": {"type": "string", "maxLength": 12}}}}
SMOL_PROMPT = ("Python was created by Guido van Rossum and first released in 1991. It was influenced by ABC "
               "and Modula-3.\nAs JSON with name, year and languages it influenced or was influenced by:\n")


@pytest.fixture(scope="module")
def smol_plain(smollm2):
    """SmolLM2's constrained plain greedy answer (drafter none) and its constraint."""
    constraint = specframe.constraint_for(smollm2, json_schema=SMOL_SCHEMA)
    decoder = SpeculativeDecoder.from_names(smollm2, "none", budget=1)
    return decoder.generate(SMOL_PROMPT, 64, constraint=constraint), constraint


@pytest.mark.slow
@pytest.mark.parametrize("drafter,tree", [("pld", "chain"), ("forced(then=pld)", "chain"),
                                          ("forced(then='pld(matches=4)')", "trie")])
def test_smollm2_json_greedy_equals_constrained_plain_greedy(smollm2, smol_plain, drafter, tree):
    plain, constraint = smol_plain
    decoder = SpeculativeDecoder.from_names(smollm2, drafter, tree, budget=8)
    fast = decoder.generate(SMOL_PROMPT, 64, constraint=constraint)
    assert fast.tokens == plain.tokens, f"{drafter}+{tree}: {fast.text!r} != {plain.text!r}"
    assert fast.finish_reason == "eos"
    assert set(json.loads(fast.text)) == {"name", "year", "languages"}
