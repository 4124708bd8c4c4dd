"""`model-continue:` datastore sources: the target's raw continuations of prompts, and of library stubs."""

from __future__ import annotations

import json

import pytest
from specframe_corpus.datastore import DatastoreError
from specframe_corpus.source_specs import parse_source

LIBRARY = '''
def documented(a, b=1):
    """Add b to a.

    Returns the sum.
    """
    return a + b


def undocumented(x):
    return x


class Box:
    @property
    def size(self):
        """How much the box holds."""
        return 3
'''


def test_stubs_are_signatures_with_docstrings_dedented(tmp_path):
    from specframe_corpus.code_stubs import python_stubs

    (tmp_path / "lib.py").write_text(LIBRARY)
    (tmp_path / "broken.py").write_text("def nope(:\n")  # does not parse: skipped, not fatal
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_lib.py").write_text('def test_x():\n    """A test."""\n')  # tests: left out
    stubs = python_stubs(10, root=tmp_path)
    assert sorted(stubs) == [
        'def documented(a, b=1):\n    """Add b to a.\n\n    Returns the sum.\n    """\n',
        'def size(self):\n    """How much the box holds."""\n',
    ]
    assert python_stubs(10, root=tmp_path) == stubs  # a fixed order
    assert len(python_stubs(1, root=tmp_path)) == 1


def test_continue_specs_name_their_sources(tmp_path):
    from specframe_corpus.answers import ModelAnswers
    from specframe_corpus.code_stubs import PythonStubs

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):\n"}) + "\n")
    raw = parse_source(f"model-continue:{prompts}")
    assert isinstance(raw, ModelAnswers) and not raw.template and raw.prompts == ["def f(x):\n"]
    assert parse_source(f"model:{prompts}").template
    stubs = parse_source("model-continue:python-stubs", self_prompts=5)
    assert isinstance(stubs, PythonStubs) and stubs.count == 5
    with pytest.raises(DatastoreError, match="--self-prompts must be at least 1, not 0"):
        parse_source("model-continue:python-stubs", self_prompts=0)


def test_raw_continuations_skip_the_chat_template_and_keep_their_own_cache(tmp_path, monkeypatch):
    from specframe_corpus import answers

    class Chat:  # a chat tokenizer: the template would wrap a prompt in 9s
        chat_template = "yes"

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) - 96 for c in text]}

        def apply_chat_template(self, messages, **kwargs):
            return {"input_ids": [9] + self(messages[0]["content"])["input_ids"] + [9]}

    class Target:
        name, tokenizer = "letters", Chat()

    seen = []
    monkeypatch.setattr(answers, "generate_batch", lambda target, encoded, n, **kw: seen.extend(encoded) or
                        [[7]] * len(encoded))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "ab"}) + "\n")
    for spec, expected in ((f"model-continue:{prompts}", [1, 2]), (f"model:{prompts}", [9, 1, 2, 9])):
        source = parse_source(spec)
        source.prepare(Target(), tmp_path / spec.split(":")[0])
        assert source.answers() == {0: [7]} and seen.pop() == expected
    header = json.loads((tmp_path / "model-continue.answers.jsonl").read_text().splitlines()[0])
    assert header["settings"]["template"] is False
    chat_header = json.loads((tmp_path / "model.answers.jsonl").read_text().splitlines()[0])
    assert "template" not in chat_header["settings"]
