"""`SpeculativeDecoder.stream` and the `RowSession` beneath it.

A stream's deltas concatenate to what `generate` returns (text and token ids), for speculative and plain
pipelines, at fixed and adaptive budgets, with stop strings; closing a stream early frees its row; rows
join a session between steps and a cancelled row leaves without disturbing the others. `TextDeltas`
holds back a character whose bytes are incomplete, checked on the real model's tokenizer with text of
many scripts and emoji.
"""

from __future__ import annotations

import pytest

from specframe import SpeculativeDecoder
from specframe.decode.session import RowSession, TextDeltas
from specframe.terms.sampling import SamplingParams
from specframe.testing.targets import reference_greedy, repetitive_prompt, tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=3)


def joined(deltas):
    return "".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids]


@pytest.mark.parametrize("drafter,budget", [("pld", 8), ("pld", "auto"), ("none", 1)])
def test_stream_adds_up_to_generate(target, drafter, budget):
    prompt = "abcabcabd abcabcabd abcab"
    decoder = SpeculativeDecoder.from_names(target, drafter, budget=budget)
    deltas = list(decoder.stream(prompt, max_new_tokens=40))
    result = decoder.generate(prompt, max_new_tokens=40)
    text, ids = joined(deltas)
    assert deltas[-1].done and all(not d.done for d in deltas[:-1])
    assert (text, ids) == (result.text, result.tokens) == (deltas[-1].result.text, deltas[-1].result.tokens)
    assert ids == reference_greedy(target, target.tokenizer(prompt)["input_ids"], 40)
    if drafter == "pld" and budget == 8:
        assert len(deltas) < len(ids)  # steps that accepted drafts emit several tokens at once


def test_stream_stops_at_a_stop_string(target):
    prompt = "abcabcabd abcabcabd abcab"
    decoder = SpeculativeDecoder.from_names(target, "pld", budget=4)
    full = decoder.generate(prompt, max_new_tokens=40).text
    stop = full[10:12]
    deltas = list(decoder.stream(prompt, max_new_tokens=40, stop=stop))
    assert deltas[-1].result.finish_reason == "stop"
    assert joined(deltas)[0] == decoder.generate(prompt, max_new_tokens=40, stop=stop).text


def test_closing_a_stream_frees_its_row(target, monkeypatch):
    cancelled = []
    cancel = RowSession.cancel
    monkeypatch.setattr(RowSession, "cancel", lambda self, key: cancelled.append(cancel(self, key))
                        or cancelled[-1])
    decoder = SpeculativeDecoder.from_names(target, "pld", budget=4)
    stream = decoder.stream("abcabcabd abcab", max_new_tokens=60)
    first = next(stream)
    stream.close()
    assert [r.finish_reason for r in cancelled] == ["cancelled"]
    assert cancelled[0].tokens[: len(first.token_ids)] == first.token_ids
    assert decoder.generate("abcabcabd abcab", max_new_tokens=20).tokens == \
        reference_greedy(target, target.tokenizer("abcabcabd abcab")["input_ids"], 20)


def test_rows_join_between_steps_and_a_cancelled_row_leaves(target):
    """Continuous batching as the server drives it: a second request joins after the first has taken
    steps, a third is cancelled midway; the others end with exactly their plain greedy tokens."""
    decoder = SpeculativeDecoder.from_names(target, "pld", budget=4)
    prompts = [repetitive_prompt(96, 30, seed=s) for s in range(3)]
    session = RowSession(decoder, 3)
    first = session.add(decoder.request(prompts[0], 24))
    cancelled = session.add(decoder.request(prompts[2], 24))
    results = {}
    for _ in range(3):
        results |= session.step()
    second = session.add(decoder.request(prompts[1], 16))
    partial = session.cancel(cancelled)
    assert partial.finish_reason == "cancelled" and partial.tokens
    assert partial.tokens == reference_greedy(target, prompts[2], 24)[: len(partial.tokens)]
    while session.active:
        results |= session.step()
    assert results[first].tokens == reference_greedy(target, prompts[0], 24)
    assert results[second].tokens == reference_greedy(target, prompts[1], 16)
    assert set(results) == {first, second}


def test_a_request_carries_its_own_sampling(target):
    decoder = SpeculativeDecoder.from_names(target, "pld", verifier="sample-match", budget=4)
    sampling = SamplingParams(temperature=1.0, seed=5)
    session = RowSession(decoder, 1)
    key = session.add(decoder.request("abcab", 12, sampling=sampling))
    ended = {}
    while session.active:
        ended |= session.step()
    again = SpeculativeDecoder.from_names(target, "pld", verifier="sample-match", budget=4, sampling=sampling)
    assert ended[key].tokens == again.generate("abcab", max_new_tokens=12).tokens


@pytest.mark.slow
def test_text_deltas_hold_back_split_characters(smollm2):
    """Byte-level BPE splits one character over several tokens: no delta ends in U+FFFD, and the deltas
    of every prefix add up to the text of the whole."""
    tokenizer = smollm2.tokenizer
    text = "naïve café ☕ — 数据 🙂🚀 ünïcödé\n\tend"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    deltas = TextDeltas(tokenizer)
    pieces = [deltas.push(ids[:n]) for n in range(1, len(ids) + 1)]
    pieces.append(deltas.flush(ids))
    assert not any(p.endswith("\ufffd") for p in pieces[:-1])
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert sum(1 for p in pieces if not p) > 0  # some tokens completed no character on their own
