"""Stop strings found from the end of the output agree with decoding the whole output."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import specframe
from specframe.terms.errors import ConfigurationError
from specframe.terms.stopping import StopStrings
from specframe.testing import tiny_target


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from specframe.runtime.load import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m"))


def whole_text_hit(tokenizer, stops, new, emitted):
    """The reference: decode everything so far after each emitted token."""
    for i in range(len(emitted)):
        if any(s in tokenizer.decode(list(new) + list(emitted[: i + 1])) for s in stops):
            return i
    return None


# Token ids of SmolLM2's vocabulary: ASCII words, byte pieces of multi-byte characters (ids above 40,000
# hold many), and the special tokens at the start.
token_ids = st.integers(min_value=0, max_value=49151)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(new=st.lists(token_ids, min_size=0, max_size=120), emitted=st.lists(token_ids, min_size=1, max_size=6),
       start=st.integers(min_value=0, max_value=10_000), length=st.integers(min_value=1, max_value=12),
       data=st.data())
def test_the_tail_finds_what_the_whole_text_finds(tokenizer, new, emitted, start, length, data):
    whole = tokenizer.decode(new + emitted)
    before = tokenizer.decode(new)
    # A stop string cut from the text, most often across the step's tokens, sometimes one absent.
    pick = data.draw(st.sampled_from(["from-emitted", "anywhere", "absent"]))
    if pick == "absent":
        stop = "\x00never\x00"
    else:
        lo = max(0, len(before) - length + 1) if pick == "from-emitted" else 0
        begin = lo + start % max(1, len(whole) - lo)
        stop = whole[begin:begin + length]
    assume(stop and stop not in before)  # the loop stops at the first hit, so the past holds none
    stops = StopStrings(tokenizer, [stop])
    assert stops.first_hit(new, emitted) == whole_text_hit(tokenizer, [stop], new, emitted)


def test_a_long_output_is_not_decoded_whole(tokenizer, monkeypatch):
    """The decoded text stays about the window's size however long the output grows."""
    seen = []
    real = tokenizer.decode
    monkeypatch.setattr(tokenizer, "decode", lambda ids, **kw: seen.append(len(ids)) or real(ids, **kw))
    stops = StopStrings(tokenizer, ["</answer>"])
    new = tokenizer("word " * 3000)["input_ids"]
    assert stops.first_hit(new, tokenizer(" </answer>")["input_ids"]) is not None
    assert max(seen) <= stops.window + 4


def test_stop_strings_need_a_tokenizer():
    decoder = specframe.SpeculativeDecoder.from_names(tiny_target(seed=0, tokenizer=False), "pld", budget=4)
    with pytest.raises(ConfigurationError, match="has no tokenizer"):
        decoder.generate([1, 2, 3], max_new_tokens=4, stop=["x"])
