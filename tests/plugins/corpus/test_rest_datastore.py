"""REST datastore: layout, append, sources, and clear errors on bad input (nothing half-written)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from specframe_corpus.build import build_datastore
from specframe_corpus.datastore import HEADER, SUFFIXES, TOKENS, Datastore, DatastoreError, TokenizerIdentity
from specframe_corpus.source_specs import parse_source
from specframe_corpus.sources import TokenDocuments

DOCS = [[1, 2, 3, 4], [2, 3, 5], [7, 7, 7, 1, 2]]


def ids_target(vocab: int = 50, name: str = "ids"):
    return SimpleNamespace(name=name, tokenizer=None, vocab_size=vocab)


def build(out: Path, docs=DOCS, vocab: int = 50, **kwargs) -> dict:
    return build_datastore(
        out, [TokenDocuments("docs", "ids", documents=docs)], ids_target(vocab), progress=False, **kwargs
    )


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_layout_header_and_separators(tmp_path):
    header = build(tmp_path / "ds")
    store = Datastore.open(tmp_path / "ds", expect=TokenizerIdentity.of(ids_target()))
    sep = 50
    assert store.tokens.tolist() == [sep, 1, 2, 3, 4, sep, 2, 3, 5, sep, 7, 7, 7, 1, 2, sep]
    assert header["n_tokens"] == 12 and header["n_documents"] == 3 and header["token_dtype"] == "uint16"
    assert header["format_version"] == 1 and header["tokenizer"]["vocab_size"] == 50
    reversed_tokens = store.tokens[::-1].tolist()
    suffixes = [reversed_tokens[r:] for r in store.suffixes.tolist()]
    assert suffixes == sorted(suffixes)  # a true suffix array of the reversed corpus
    store.verify()
    assert leftovers(tmp_path) == []


def test_large_vocabulary_keeps_ids_above_65535(tmp_path):
    build(tmp_path / "ds", docs=[[70_000, 65_536, 1]], vocab=70_001)
    store = Datastore.open(tmp_path / "ds")
    assert store.tokens.dtype == np.uint32 and store.tokens[1:4].tolist() == [70_000, 65_536, 1]


def test_append_equals_building_everything_at_once(tmp_path):
    build(tmp_path / "a", docs=DOCS[:2])
    header = build(tmp_path / "a", docs=DOCS[2:], append=True)
    build(tmp_path / "b", docs=DOCS)
    a, b = Datastore.open(tmp_path / "a"), Datastore.open(tmp_path / "b")
    assert a.tokens.tolist() == b.tokens.tolist() and a.suffixes.tolist() == b.suffixes.tolist()
    assert header["n_documents"] == 3 and len(header["sources"]) == 2 and header["build"]["appended"]
    assert leftovers(tmp_path) == []


def test_existing_output_is_not_clobbered(tmp_path):
    build(tmp_path / "ds")
    with pytest.raises(DatastoreError, match="already exists.*--append"):
        build(tmp_path / "ds")
    build(tmp_path / "ds", docs=[[9, 9]], overwrite=True)
    assert Datastore.open(tmp_path / "ds").header["n_documents"] == 1


def test_append_with_another_vocabulary_is_refused(tmp_path):
    build(tmp_path / "ds")
    with pytest.raises(DatastoreError, match="built with tokenizer"):
        build(tmp_path / "ds", vocab=60, append=True)


@pytest.mark.parametrize("docs", [[], [[]], [[], []]], ids=["no-documents", "one-empty", "two-empty"])
def test_empty_corpus_fails_and_leaves_nothing(tmp_path, docs):
    with pytest.raises(DatastoreError, match="hold no documents"):
        build(tmp_path / "ds", docs=docs)
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path) == []


def test_ids_out_of_range_fail_and_leave_nothing(tmp_path):
    with pytest.raises(DatastoreError, match="token id 50 is out of range.*vocabulary of 50"):
        build(tmp_path / "ds", docs=[[1, 2], [3, 50]])
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path) == []


def test_other_tokenizer_is_named_at_load(tmp_path):
    build(tmp_path / "ds")
    with pytest.raises(
        DatastoreError,
        match=r"built with tokenizer ids .*vocab 50.*target uses tokenizer "
        r"other .*vocab 64.*datastore build",
    ):
        Datastore.open(tmp_path / "ds", expect=TokenizerIdentity.of(ids_target(64, "other")))


def test_missing_and_foreign_directories(tmp_path):
    with pytest.raises(DatastoreError, match="no datastore at .*datastore.json is missing"):
        Datastore.open(tmp_path / "nothing")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / HEADER).write_text(json.dumps({"hello": 1}))
    with pytest.raises(DatastoreError, match="not a specframe REST datastore"):
        Datastore.open(tmp_path / "foreign")


def edit_header(path: Path, **changes) -> None:
    header = json.loads((path / HEADER).read_text())
    header.update(changes)
    (path / HEADER).write_text(json.dumps(header))


def test_newer_format_and_corrupt_header(tmp_path):
    build(tmp_path / "ds")
    edit_header(tmp_path / "ds", format_version=99)
    with pytest.raises(
        DatastoreError, match="format version 99, newer than the version 1.*upgrade specframe"
    ):
        Datastore.open(tmp_path / "ds")
    (tmp_path / "ds" / HEADER).write_text('{"format": "specframe-rest')
    with pytest.raises(DatastoreError, match="not valid JSON"):
        Datastore.open(tmp_path / "ds")


@pytest.mark.parametrize("field,value", [("n_positions", "abc"), ("n_tokens", -1), ("separator", True),
                                         ("token_dtype", "no-such-dtype"), ("files", [])])
def test_header_fields_of_the_wrong_type_are_named(tmp_path, field, value):
    build(tmp_path / "ds")
    edit_header(tmp_path / "ds", **{field: value})
    with pytest.raises(DatastoreError, match=f'field "{field}" is .*expected .*the store is corrupt'):
        Datastore.open(tmp_path / "ds")


@pytest.mark.parametrize("name", [TOKENS, SUFFIXES])
def test_truncated_files(tmp_path, name):
    build(tmp_path / "ds")
    file = tmp_path / "ds" / name
    file.write_bytes(file.read_bytes()[:-2])
    with pytest.raises(DatastoreError, match=f"{name} has .* bytes, expected .*truncated or corrupt"):
        Datastore.open(tmp_path / "ds")


def overwrite_tokens(path: Path, position: int, value: int) -> None:
    tokens = np.fromfile(path / TOKENS, dtype=np.uint16)
    tokens[position] = value
    tokens.tofile(path / TOKENS)


def test_corrupt_tokens_and_suffixes(tmp_path):
    build(tmp_path / "ds")
    overwrite_tokens(tmp_path / "ds", 2, 60_000)
    with pytest.raises(DatastoreError, match="token id 60000 is out of range"):
        Datastore.open(tmp_path / "ds")
    overwrite_tokens(tmp_path / "ds", 2, 50)  # a separator where a token was: a document too many
    with pytest.raises(DatastoreError, match="4 documents in tokens.bin but the header says 3"):
        Datastore.open(tmp_path / "ds")
    overwrite_tokens(tmp_path / "ds", 2, 2)
    Datastore.open(tmp_path / "ds")
    suffixes = np.fromfile(tmp_path / "ds" / SUFFIXES, dtype=np.int32)
    suffixes[[0, -1]] = suffixes[[-1, 0]]
    suffixes.tofile(tmp_path / "ds" / SUFFIXES)
    with pytest.raises(DatastoreError, match="not sorted"):
        Datastore.open(tmp_path / "ds")
    with pytest.raises(DatastoreError, match="does not match its recorded digest"):
        _verify_only(tmp_path / "ds")  # the digest check catches what the structural checks cannot


def _verify_only(path: Path) -> None:
    """`verify()` on a store whose structural checks would already fail, to test the digest alone."""
    header = json.loads((path / HEADER).read_text())
    store = Datastore(path, header, None, None, None)
    store.verify()


def test_text_sources(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("def f():\n    return 1\n")
    (tmp_path / "code" / "b.txt").write_text("plain text")
    (tmp_path / "code" / "blob.py").write_bytes(b"\x00\x01binary")
    source = parse_source(str(tmp_path / "code"), glob="*.py")
    assert [[d for d in docs] for docs, _ in source.batches()] == [["def f():\n    return 1\n"]]
    assert source.meta["skipped_files"] == 1
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"text": "one"},
                {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
                {"turns": ["a", "b"]},
            ]
        )
        + "\n"
    )
    docs = [d for batch, _ in parse_source(str(jsonl)).batches() for d in batch]
    assert docs == ["one", "hi", "yo", "a", "b"]
    jsonl.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DatastoreError, match="line 1: no text in .*keys: body.*--field"):
        list(parse_source(str(jsonl)).batches())
    assert [d for b, _ in parse_source(str(jsonl), field_name="body").batches() for d in b] == ["x"]
    with pytest.raises(DatastoreError, match="neither a directory"):
        parse_source(str(tmp_path / "missing"))
    stdlib = parse_source("python-stdlib")
    assert stdlib.total > 100 and all("site-packages" not in str(f) for f in stdlib.files)
