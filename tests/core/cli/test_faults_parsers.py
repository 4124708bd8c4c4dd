"""Error paths and parsers: bad input and a full disk end in a specframe error that names the file, line
or field and says what to do (the CLI prints it as `error: ...` and exits 2), never in a traceback.

A JSONL datastore source that is not UTF-8; a datastore build and a first-use model conversion on a full
disk (the write calls are patched to fail with ENOSPC, or with safetensors' own error); option strings
that nest too deeply for Python's parser, repeat an option or chain a second option list; bench suite
files checked field by field; `specframe cache clear` deleting only files that start like a suffix cache.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors import SafetensorError

from specframe.runtime import load
from specframe.support.prompt_suites import load_suite
from specframe.terms.errors import ConfigurationError, ModelLoadError, PromptError
from specframe.plugging.specs import ComponentSpec
from specframe.testing import tiny_target

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
# What safetensors raises when its file write hits a full disk (its Rust error, formatted).
SAFETENSORS_ENOSPC = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                     'message: "No space left on device" })')


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """Run the real CLI entry point in this process: (exit code, stderr)."""
    from specframe.cli import main

    monkeypatch.setattr(sys, "argv", ["specframe", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


# --- option strings --------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, needle", [
    ("pld(max_ngram=2, max_ngram=3)", "option 'max_ngram' given more than once"),
    ("draft-model(model=/a, layers=1, model=/b)", "option 'model' given more than once"),
    ("pld(max_ngram=0)(num_tokens=3)", "has more than one option list"),
    ("draft-model(model=/models/x)(layers=2)", "has more than one option list"),
    ("pld(max_ngram=" + "-" * 100_000 + "1)", "nest too deeply"),
    ("pld(max_ngram=" + "+".join(["1"] * 100_000) + ")", "nest too deeply"),
])
def test_option_strings_that_would_lose_an_option_or_crash_the_parser_are_refused(spec, needle):
    with pytest.raises(ConfigurationError, match=needle) as err:
        ComponentSpec.parse(spec)
    assert len(str(err.value)) < 400  # a long spec is cut in the message


def test_options_still_parse_when_given_once():
    assert ComponentSpec.parse("pld(max_ngram=2, matches=3)").options == {"max_ngram": 2, "matches": 3}
    spec = ComponentSpec.parse("draft-model(model='/a)(b=c', layers=2)")  # a quoted value may hold `)(`
    assert spec.options == {"model": "/a)(b=c", "layers": 2}


def test_a_deeply_nested_option_exits_2_with_an_error_line(tmp_path, monkeypatch, capsys):
    deep = "pld(max_ngram=" + "-" * 100_000 + "1)"
    code, err = cli(monkeypatch, capsys, "generate", "hi", "--drafter", deep, "--model", str(tmp_path))
    assert code == 2 and err.startswith("error: cannot parse options of 'pld(max_ngram=---"), err[-2000:]


# --- bench suite files -----------------------------------------------------------------------------------

GOOD = {"question_id": 1, "category": "qa", "turns": ["Name three colors."]}
SECOND = {**GOOD, "question_id": 2}


@pytest.mark.parametrize("row, needle", [
    ({**SECOND, "turns": "abc"}, "field 'turns' must be a non-empty list of strings"),
    ({**SECOND, "turns": []}, "field 'turns' must be a non-empty list"),
    ({**SECOND, "turns": ["a", 3]}, "field 'turns', item 1 of question 2, must be a string, got 3"),
    ({**SECOND, "turns": ["a", " "]}, "field 'turns', item 1 of question 2, is empty"),
    ({**SECOND, "question_id": None}, "'question_id' must be an integer or a non-empty string, got null"),
    ({**SECOND, "question_id": True}, "field 'question_id' must be"),
    ({**SECOND, "question_id": [2]}, "field 'question_id' must be"),
    ({**SECOND, "category": 5}, "field 'category' must be a non-empty string, got 5"),
    ({"category": "qa", "turns": ["x"]}, "field 'question_id' is missing"),
    ({"question_id": 2}, "field 'turns' is missing"),
    (["not", "an", "object"], "expected a JSON object"),
])
def test_suite_lines_are_checked_field_by_field(tmp_path, row, needle):
    """Nothing is converted: a string of turns is not split into characters, a null id is not "None"."""
    path = tmp_path / "suite.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(PromptError, match=rf"{path}, line 3: ") as err:
        load_suite(str(path))
    assert needle in str(err.value)


@pytest.mark.parametrize("other_id", [1, "1"])
def test_a_question_id_used_twice_is_refused(tmp_path, other_id):
    """Results are keyed by id: a second question with the first one's id would never run."""
    path = tmp_path / "suite.jsonl"
    other = {"question_id": other_id, "category": "qa", "turns": ["Name three animals."]}
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(other) + "\n")
    with pytest.raises(PromptError, match=rf"{path}, line 2: question_id 1 is already used on line 1"):
        load_suite(str(path))


def test_good_suites_still_load(tmp_path):
    path = tmp_path / "suite.jsonl"
    rows = [GOOD, {"question_id": "q-2", "turns": ["a", "b"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = load_suite(str(path))
    assert [(p.qid, p.category, p.turns) for p in prompts] == [("1", "qa", ("Name three colors.",)),
                                                               ("q-2", "all", ("a", "b"))]
    assert len(load_suite("mt-bench")) == 80 and len(load_suite("spec-bench")) == 480


# --- datastore sources and builds --------------------------------------------------------------------------


def ids_target(vocab: int = 50):
    return SimpleNamespace(name="ids", tokenizer=None, vocab_size=vocab)


def test_a_jsonl_source_that_is_not_utf8_names_its_line(tmp_path):
    from specframe_corpus.datastore import DatastoreError
    from specframe_corpus.distributed import split_sources
    from specframe_corpus.source_specs import parse_source

    path = tmp_path / "docs.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DatastoreError, match=r"docs.jsonl', line 2: not UTF-8 text .*convert it"):
        list(parse_source(str(path)).batches())
    parts = split_sources([parse_source(str(path))], 2)  # shards read byte ranges of the file
    with pytest.raises(DatastoreError, match=r"docs.jsonl', line 2: not UTF-8 text"):
        [list(source.batches()) for part in parts for source in part]


def test_a_datastore_build_on_a_full_disk_is_an_error_and_keeps_the_old_store(tmp_path, monkeypatch):
    from specframe_corpus import build as build_module
    from specframe_corpus.build import build_datastore
    from specframe_corpus.datastore import DatastoreError
    from specframe_corpus.sources import TokenDocuments

    def build():
        source = TokenDocuments("docs", "ids", documents=[[1, 2, 3], [4, 5]])
        return build_datastore(tmp_path / "ds", [source], ids_target(), progress=False, overwrite=True)

    before = build()
    real_open = open

    def full_disk_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "w" in mode:
            def write(data):
                raise ENOSPC
            handle.write = write
        return handle

    monkeypatch.setattr(build_module, "open", full_disk_open, raising=False)  # the tokens file's writes
    with pytest.raises(DatastoreError, match=r"building datastore '.*ds' failed: No space left on device; "
                                             r"free some space on that disk, or build it into another --out"):
        build()
    assert json.loads((tmp_path / "ds" / "datastore.json").read_text())["built_at"] == before["built_at"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


# --- first-use model conversion ----------------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["safetensors", "marker"])
def test_a_model_conversion_on_a_full_disk_is_an_error(tmp_path, monkeypatch, failure):
    import transformers.modeling_utils

    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(load, "_dequantize", lambda source, tmp, out: tiny_target(
        seed=1, vocab_size=64, hidden_size=16).model.save_pretrained(tmp))
    if failure == "safetensors":
        def save_file(*args, **kwargs):
            raise SAFETENSORS_ENOSPC
        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save_file)
    else:
        def write_marker(directory):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "marker.json"))
        monkeypatch.setattr(load, "write_marker", write_marker)
    gguf = tmp_path / "Model.Q4.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    with pytest.raises(ModelLoadError, match=r"converting '.*Model.Q4.gguf' into .* failed: .*No space left "
                                             r"on device.*; free some space on that disk, or point "
                                             r"SPECFRAME_HOME at a disk"):
        load.resolve_model_dir(str(gguf))
    assert not [p for p in (tmp_path / "home" / "models").iterdir() if p.is_dir()]  # nothing half-written


# --- specframe cache clear ---------------------------------------------------------------------------------


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    from specframe_suffix.store import cache_home

    home = cache_home()
    home.mkdir(parents=True)
    return home


def test_cache_clear_deletes_caches_only(cache_home, tmp_path):
    from typer.testing import CliRunner

    from specframe.cli import build_app
    from specframe.support.tokenizer_identity import TokenizerIdentity
    from specframe_suffix.store import SuffixCacheError, append_responses, is_cache_file

    append_responses(cache_home / "chat.json", TokenizerIdentity("t", "raw-ids", 10), [[1, 2]], 8, "chat")
    header = (cache_home / "chat.json").read_text().split('"responses":[')[0] + '"responses":['
    (cache_home / "cut.json").write_text(header + "[1, 2")  # a damaged cache: its header whole
    (cache_home / "notes.json").write_text('{"important": true}')
    mine = tmp_path / "important.json"
    mine.write_text('{"important": true}')
    assert is_cache_file(cache_home / "chat.json") and not is_cache_file(mine)
    runner, app = CliRunner(), build_app()
    refused = runner.invoke(app, ["cache", "clear", str(mine)])
    assert isinstance(refused.exception, SuffixCacheError), refused.output
    assert "is not a suffix cache" in str(refused.exception) and mine.is_file()
    assert isinstance(runner.invoke(app, ["cache", "clear", "notes"]).exception, SuffixCacheError)
    cleared = runner.invoke(app, ["cache", "clear", "--all"])
    assert cleared.exit_code == 0, cleared.output
    assert "deleted 2 cache files" in cleared.output
    assert "left alone, not suffix caches: notes.json" in cleared.output
    assert sorted(p.name for p in cache_home.iterdir()) == ["notes.json"]


@pytest.mark.parametrize("text", [
    '{"format": 1, "tokenizer": "mine", "notes": "keep me"}',  # a user's file starting like a cache
    '{"format":1,"tokenizer":{"name":"t","fingerprint":"raw-ids","vocab_size":10},"my_data":[1]}',
    '{"format":1,"tokenizer":{"name":"t","vocab_size":10,"fingerprint":"raw-ids"},"responses":[]}',
])
def test_cache_clear_leaves_files_that_only_start_like_a_cache(cache_home, text):
    from typer.testing import CliRunner

    from specframe.cli import build_app
    from specframe_suffix.store import is_cache_file

    (cache_home / "mine.json").write_text(text)
    (cache_home / "mine.txt").write_text(text)
    assert not is_cache_file(cache_home / "mine.json") and not is_cache_file(cache_home / "mine.txt")
    cleared = CliRunner().invoke(build_app(), ["cache", "clear", "--all"])
    assert cleared.exit_code == 0 and "left alone, not suffix caches: mine.json" in cleared.output
    assert (cache_home / "mine.json").read_text() == text


def test_cache_clear_of_a_file_that_is_no_cache_exits_2(cache_home, tmp_path, monkeypatch, capsys):
    mine = tmp_path / "important.json"
    mine.write_text('{"important": true}')
    code, err = cli(monkeypatch, capsys, "cache", "clear", str(mine))
    assert code == 2 and err.startswith(f"error: {mine} is not a suffix cache"), err
    assert mine.read_text() == '{"important": true}'
