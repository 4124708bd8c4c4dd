"""The `rest` drafter: lossless end to end, proposals, options, and the datastore CLI."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from conftest import plain_greedy, tiny_llama
from specframe_corpus.datastore import DatastoreError
from specframe_rest.drafter import RestDrafter
from specframe_rest.examples import own_continuations

import specframe
from specframe import ConfigurationError, DraftContext, SpeculativeDecoder


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(seed=3)
    return target, own_continuations(target)


@pytest.fixture(scope="module")
def tiny_store(tiny, tmp_path_factory):
    from specframe_corpus.build import build_datastore
    from specframe_corpus.sources import TokenDocuments

    out = tmp_path_factory.mktemp("rest") / "own"
    build_datastore(out, [TokenDocuments("own", "ids", documents=tiny[1])], tiny[0], progress=False)
    return out


@pytest.fixture(scope="module")
def tiny_cases(tiny):
    """Prompts (unseen, and starting like corpus documents) with their plain greedy continuations."""
    target, corpus = tiny
    prompts = ([5, 9, 17, 2], corpus[0][:6], corpus[1][:3] + [40, 41])
    return [(p, plain_greedy(target, p, 32)) for p in prompts]


@pytest.mark.parametrize(
    "drafter,tree,budget",
    [
        ("rest(datastore=DS)", "trie", 8),
        ("rest(datastore=DS, c=2)", "chain", 8),
        ("rest(datastore=DS, live=1, k=3, m=4, by_length=True)", "trie", 16),
        ("rest(live=1)", "trie", 6),
    ],
)
def test_greedy_output_equals_plain_greedy_on_a_tiny_llama(
    tiny, tiny_store, tiny_cases, drafter, tree, budget
):
    spec = drafter.replace("DS", repr(str(tiny_store)))
    decoder = SpeculativeDecoder.from_names(tiny[0], spec, tree, "greedy", budget=budget)
    accepted = 0
    for prompt, expected in tiny_cases:
        result = decoder.generate(prompt, max_new_tokens=32)
        assert result.tokens == expected
        assert max(result.metrics.tree_sizes) <= min(budget, 2 if "c=2" in spec else budget)
        accepted += result.metrics.accepted_draft_tokens
    assert accepted > 0  # the drafts are real: the corpus holds the model's own continuations


def test_example_datastore_serves_any_target(tiny, tmp_path):
    target = tiny[0]
    options = RestDrafter.example_options(target, str(tmp_path))
    assert RestDrafter(target, **options).store.header["n_documents"] == 6


def test_proposal_size_and_no_match(tiny, tiny_store):
    target, corpus = tiny
    drafter = RestDrafter(target, datastore=str(tiny_store))
    tokens = np.array(corpus[0][:8])
    proposal = drafter.propose(DraftContext(tokens, len(tokens), budget=5))
    assert len(proposal) == 5 and np.all(proposal.parents < np.arange(5))
    assert drafter.last_match_length >= 8  # the whole context occurs in the corpus
    assert (
        len(
            RestDrafter(target, datastore=str(tiny_store), c=3).propose(
                DraftContext(tokens, len(tokens), budget=5)
            )
        )
        == 3
    )
    unseen = [t for t in range(target.vocab_size) if all(t not in doc for doc in corpus)]
    if unseen:
        empty = drafter.propose(DraftContext(np.array([unseen[0]]), 1, budget=5))
        assert len(empty) == 0 and drafter.last_match_length == 0


def test_options_and_datastore_resolution(tiny, tiny_store, monkeypatch, tmp_path):
    target = tiny[0]
    monkeypatch.delenv("SPECFRAME_DATASTORE", raising=False)
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))  # no default python-site store there
    with pytest.raises(ConfigurationError, match="rest needs a datastore"):
        RestDrafter(target)
    with pytest.raises(ConfigurationError, match="need c, k, m"):
        RestDrafter(target, datastore=str(tiny_store), m=0)
    with pytest.raises(DatastoreError, match="no datastore at"):
        RestDrafter(target, datastore=str(tmp_path / "missing"))
    monkeypatch.setenv("SPECFRAME_DATASTORE", str(tiny_store))
    assert RestDrafter(target).store.path == tiny_store
    monkeypatch.delenv("SPECFRAME_DATASTORE")
    (tmp_path / "datastores").mkdir()
    (tmp_path / "datastores" / "mine").symlink_to(tiny_store)
    assert RestDrafter(target, datastore="mine").store.header["n_documents"] == 6
    (tmp_path / "datastores" / "python-site").symlink_to(tiny_store)
    assert RestDrafter(target).store.path == tmp_path / "datastores" / "python-site"  # the default store


def test_datastore_of_another_vocabulary_is_refused(tiny_store):
    other = tiny_llama(seed=1, vocab=128)
    with pytest.raises(
        DatastoreError,
        match=r"built with tokenizer tiny-llama-3.*vocab 96.*target uses "
        r"tokenizer tiny-llama-1.*vocab 128",
    ):
        SpeculativeDecoder.from_names(other, f"rest(datastore={str(tiny_store)!r})", "trie", "greedy")


@pytest.fixture(scope="module")
def stdlib_store(smollm2, tmp_path_factory):
    from specframe_corpus.build import build_datastore
    from specframe_corpus.source_specs import parse_source

    root = Path(sysconfig.get_paths()["stdlib"])
    (src := tmp_path_factory.mktemp("src")).joinpath("a.py").write_text((root / "textwrap.py").read_text())
    src.joinpath("b.py").write_text((root / "functools.py").read_text())
    out = tmp_path_factory.mktemp("rest") / "stdlib"
    build_datastore(out, [parse_source(str(src))], smollm2, progress=False)
    return out


@pytest.mark.slow
def test_real_model_rest_equals_plain_greedy(smollm2, stdlib_store):
    prompt = "import functools\n\n\ndef cached(func):\n    "
    plain = specframe.generate(prompt, target=smollm2, drafter="none", max_new_tokens=32)
    result = specframe.generate(
        prompt,
        target=smollm2,
        drafter=f"rest(datastore={str(stdlib_store)!r})",
        tree="trie",
        budget=8,
        max_new_tokens=32,
    )
    assert result.tokens == plain.tokens
    assert result.metrics.steps < 32  # some drafts were accepted


@pytest.mark.slow
def test_cli_build_info_and_model_answers(smollm2, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specframe.cli import build_app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("def add(a, b):\n    return a + b\n" * 3)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["Say hi.", "Count to three."]) + "\n")
    runner, app = CliRunner(), build_app()
    args = ["datastore", "build", "--source", "./src", "--out", "./ds", "--glob", "*.py"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "built ./ds" in result.output
    answers = [
        "datastore",
        "build",
        "--source",
        f"model:{prompts}",
        "--out",
        "./ds",
        "--answer-tokens",
        "6",
        "--batch-size",
        "2",
    ]
    result = runner.invoke(app, answers + ["--append"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["datastore", "info", "./ds", "--json", "--verify"])
    info = json.loads(result.output)
    assert info["n_documents"] == 1 + 2 and [s["kind"] for s in info["sources"]] == [
        "directory",
        "model-answers",
    ]
    assert info["sources"][1]["generated"] == 2 and info["bytes_per_token"] > 0
    lines = (tmp_path / "ds.answers.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["settings"]["max_new_tokens"] == 6
    # the answers are cached beside the store: rebuilding generates nothing
    result = runner.invoke(app, answers + ["--overwrite"])
    assert result.exit_code == 0, result.output
    info = json.loads(runner.invoke(app, ["datastore", "info", "./ds", "--json"]).output)
    assert info["sources"][0]["generated"] == 0 and info["n_documents"] == 2


@pytest.mark.slow
def test_model_self_writes_its_own_prompts_and_resumes(smollm2, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specframe.cli import build_app
    from specframe_corpus import self_prompts

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(self_prompts, "SAMPLE_BATCH", 4)
    runner, app = CliRunner(), build_app()
    build = ["datastore", "build", "--source", "model:self", "--self-prompts", "3", "--out", "./chat",
             "--answer-tokens", "5", "--batch-size", "3"]
    result = runner.invoke(app, build)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (tmp_path / "chat.prompts.jsonl").read_text().splitlines()]
    prompts = [line["prompt"] for line in lines if "prompt" in line]
    assert lines[0]["settings"]["model"] == "smollm2-135m" and len(prompts) == len(set(prompts)) == 3
    assert all(p.strip() and "<|im" not in p for p in prompts)  # user turns, without template tokens
    info = json.loads(runner.invoke(app, ["datastore", "info", "./chat", "--json"]).output)
    assert info["n_documents"] == 3 and info["sources"][0]["kind"] == "model-self"
    # an interrupted write leaves a cut line: the rebuild keeps the finished batches and samples nothing
    with open(tmp_path / "chat.prompts.jsonl", "a") as f:
        f.write('{"prompt": "cut')
    result = runner.invoke(app, build + ["--overwrite"])
    assert result.exit_code == 0, result.output
    again = [json.loads(line) for line in (tmp_path / "chat.prompts.jsonl").read_text().splitlines()]
    assert [line["prompt"] for line in again if "prompt" in line] == prompts
    info = json.loads(runner.invoke(app, ["datastore", "info", "./chat", "--json"]).output)
    assert info["sources"][0]["generated"] == 0 and info["n_documents"] == 3


def test_model_self_needs_a_chat_template():
    from specframe_corpus.datastore import DatastoreError
    from specframe_corpus.self_prompts import pre_query

    class Plain:
        chat_template = None

    with pytest.raises(DatastoreError, match="needs a chat model"):
        pre_query(Plain())


def test_model_self_refuses_a_count_below_one():
    from specframe_corpus.datastore import DatastoreError
    from specframe_corpus.source_specs import parse_source

    assert parse_source("model:self", self_prompts=3).count == 3
    with pytest.raises(DatastoreError, match="--self-prompts must be at least 1, not 0"):
        parse_source("model:self", self_prompts=0)


@pytest.mark.parametrize("spec", ["model:self", "model:PROMPTS"])
@pytest.mark.parametrize(("option", "values"), [("--batch-size", {"batch_size": 0}),
                                                 ("--answer-tokens", {"max_new_tokens": -1})])
def test_model_sources_refuse_generation_options_below_one(spec, option, values, tmp_path):
    from specframe_corpus.datastore import DatastoreError
    from specframe_corpus.source_specs import parse_source

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Say hi."}) + "\n")
    spec = spec.replace("PROMPTS", str(prompts))
    with pytest.raises(DatastoreError, match=f"{option} must be at least 1"):
        parse_source(spec, **values)
