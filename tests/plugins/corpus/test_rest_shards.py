"""Sharded REST datastores: document-aligned splits, the manifest, proposals equal to one store's, append,
clear errors for missing or damaged shards, builds without Ray and with Ray (local, 2 CPUs)."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from specframe_corpus.build import build_datastore
from specframe_corpus.datastore import HEADER, TOKENS, Datastore, DatastoreError
from specframe_corpus.distributed import build_sharded_datastore, split_sources
from specframe_corpus.retrieval import Match
from specframe_corpus.shards import (
    MANIFEST,
    ShardedDatastore,
    ShardError,
    index_of,
    merge_matches,
    open_store,
    shard_name,
    shares,
)
from specframe_corpus.source_specs import parse_source
from specframe_corpus.sources import JsonlTexts, TokenDocuments
from specframe_rest.drafter import RestDrafter

import specframe
from specframe import DraftContext

VOCAB = 50
EXACT_K = 10**6  # more than any corpus here holds: every occurrence is used, by one store and by shards
OPTIONS = [{"k": EXACT_K}, {"k": EXACT_K, "c": 3, "m": 4}, {"k": EXACT_K, "live": 1, "by_length": True}]


def ids_target(vocab: int = VOCAB):
    return SimpleNamespace(name=f"ids-{vocab}", tokenizer=None, vocab_size=vocab)


def token_source(docs) -> list[TokenDocuments]:
    return [TokenDocuments("docs", "ids", documents=docs)]


def build_single(out: Path, docs, vocab: int = VOCAB) -> Path:
    build_datastore(out, token_source(docs), ids_target(vocab), progress=False)
    return out


def build_sharded(out: Path, docs, shards: int, vocab: int = VOCAB, **options) -> dict:
    return build_sharded_datastore(out, token_source(docs), ids_target(vocab), shards=shards, progress=False,
                                   **options)


def phrase_corpus(seed: int, documents: int = 60) -> list[list[int]]:
    """Documents stitched from a few shared phrases over 5 tokens: long matches, within and across
    documents, and the odd empty document."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, 5, rng.integers(2, 7)).tolist() for _ in range(12)]
    docs = []
    for _ in range(documents):
        doc = [t for i in rng.integers(0, len(phrases), rng.integers(0, 6)) for t in phrases[i]]
        docs.append(doc + rng.integers(0, 5, rng.integers(0, 4)).tolist())
    return docs


def contexts(docs: list[list[int]], seed: int, count: int = 400) -> list[np.ndarray]:
    """Windows of the documents' concatenation (many span a document boundary) and random sequences."""
    text = np.array([t for doc in docs for t in doc])
    rng = np.random.default_rng(seed)
    ends = rng.integers(1, len(text) + 1, count)
    windows = [text[max(0, end - rng.integers(1, 17)) : end] for end in ends]
    return windows + [rng.integers(0, 5, rng.integers(1, 12)) for _ in range(count // 4)]


def proposals(path: Path, context: np.ndarray, **options):
    drafter = RestDrafter(ids_target(), datastore=str(path), **options)
    proposal = drafter.propose(DraftContext(context, 0, 16))
    return proposal, drafter.last_match_length


def assert_same_proposal(a, b, context) -> None:
    (p, p_len), (q, q_len) = a, b
    assert p_len == q_len, f"match length {p_len} != {q_len} for context {context.tolist()}"
    for field in ("tokens", "parents", "scores"):
        assert np.array_equal(getattr(p, field), getattr(q, field)), f"{field} differ for {context.tolist()}"
    assert (p.group is None) == (q.group is None) and (p.group is None or np.array_equal(p.group, q.group))


def hidden_entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def corpus():
    return phrase_corpus(seed=1)


@pytest.fixture(scope="module")
def stores(corpus, tmp_path_factory) -> dict[int, Path]:
    """One store over the corpus (key 1) and sharded stores of 2 and 3 shards over the same documents."""
    root = tmp_path_factory.mktemp("shards")
    paths = {1: build_single(root / "single", corpus)}
    for n in (2, 3):
        build_sharded(root / f"sharded-{n}", corpus, n)
        paths[n] = root / f"sharded-{n}"
    return paths


# Splitting the corpus


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_split_keeps_whole_documents_in_order_and_balances_sizes(corpus, n):
    parts = split_sources(token_source(corpus), n)
    assert len(parts) == n and all(len(part) == 1 for part in parts)
    pieces = [part[0].documents for part in parts]
    assert [doc for piece in pieces for doc in piece] == corpus and all(pieces)
    sizes = [sum(map(len, piece)) for piece in pieces]
    assert max(sizes) <= sum(sizes) / n + max(map(len, corpus)) + 1


def test_split_across_files_jsonl_and_documents(tmp_path):
    """Units of several sources are cut together; a JSONL part reads exactly its lines, numbered as in
    the whole file (blank lines and a last line without a newline included)."""
    files = tmp_path / "files"
    files.mkdir()
    for i in range(4):
        (files / f"{i}.txt").write_text(f"file {i} " * (i + 1))
    lines = [json.dumps({"text": f"line {i}"}) if i % 3 else "" for i in range(10)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines))
    jsonl = parse_source(str(tmp_path / "c.jsonl"))
    sources = [parse_source(str(files)), jsonl, *token_source([[1], [2, 3]])]
    parts = split_sources(sources, 4)
    seen: dict[str, list] = {}
    for part in parts:
        for source in part:
            seen.setdefault(source.spec, []).extend(doc for batch, _ in source.batches() for doc in batch)
    whole = {s.spec: [doc for batch, _ in s.batches() for doc in batch] for s in sources}
    assert {k: [np.asarray(d).tolist() for d in v] for k, v in seen.items()} == \
        {k: [np.asarray(d).tolist() for d in v] for k, v in whole.items()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": "b"}\n{oops\n')
    last = split_sources([JsonlTexts(str(bad), "jsonl", 3, {}, bad)], 3)[2][0]
    with pytest.raises(DatastoreError, match="line 3: not valid JSON"):
        list(last.batches())


def test_too_few_documents_and_unsplittable_sources_are_refused(tmp_path):
    with pytest.raises(DatastoreError, match="cannot split 2 .* into 3 shards.*--shards 2 or fewer"):
        split_sources(token_source([[1], [2]]), 3)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "hi"}\n')
    with pytest.raises(DatastoreError, match="cannot be split into shards.*without --shards"):
        split_sources([parse_source(f"model:{prompts}")], 2)


# The manifest and opening


def test_manifest_lists_ordinary_shards_that_add_up_to_one_store(stores):
    single = Datastore.open(stores[1])
    sharded = open_store(stores[3])
    assert isinstance(sharded, ShardedDatastore) and len(sharded.shards) == 3
    manifest = json.loads((stores[3] / MANIFEST).read_text())
    assert manifest["format_version"] == 1 and manifest["tokenizer"] == single.header["tokenizer"]
    assert [s["name"] for s in manifest["shards"]] == [shard_name(i) for i in range(3)]
    for key in ("n_tokens", "n_documents"):
        assert manifest[key] == single.header[key] == sum(s[key] for s in manifest["shards"])
    for entry in manifest["shards"]:
        shard = Datastore.open(stores[3] / entry["name"])  # each shard is an ordinary datastore
        assert (shard.header["n_tokens"], shard.header["n_documents"]) == (entry["n_tokens"],
                                                                             entry["n_documents"])
    joined = np.concatenate([np.asarray(s.tokens)[:-1] for s in sharded.shards] + [[VOCAB]])
    assert joined.tolist() == single.tokens.tolist()  # the same documents, in the same order
    assert hidden_entries(stores[3]) == [] and hidden_entries(stores[3].parent) == []


def test_drafter_and_info_open_a_sharded_store_like_a_single_one(stores):
    from specframe_corpus.cli import app
    from typer.testing import CliRunner

    drafter = RestDrafter(ids_target(), datastore=str(stores[2]))
    assert drafter.store.header["n_documents"] == Datastore.open(stores[1]).header["n_documents"]
    result = CliRunner().invoke(app, ["info", str(stores[2]), "--verify"])
    assert result.exit_code == 0, result.output
    assert "2 (sharded store)" in result.output and re.search(r"verified\s+yes", result.output)
    report = json.loads(CliRunner().invoke(app, ["info", str(stores[2]), "--json"]).output)
    assert report["n_tokens"] == Datastore.open(stores[1]).header["n_tokens"] and len(report["shards"]) == 2


# Retrieval: a sharded store proposes what one store over the same documents proposes


@pytest.mark.parametrize("options", OPTIONS, ids=["all", "c3-m4", "live-by-length"])
@pytest.mark.parametrize("n", [2, 3])
def test_sharded_proposals_equal_one_stores(corpus, stores, n, options):
    for context in contexts(corpus, seed=n):
        one, sharded = proposals(stores[1], context, **options), proposals(stores[n], context, **options)
        assert_same_proposal(sharded, one, context)


@st.composite
def corpora(draw):
    docs = draw(st.lists(st.lists(st.integers(0, 3), max_size=25), min_size=4, max_size=12))
    queries = draw(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=20))
    return docs, draw(st.integers(2, 4)), queries


@settings(max_examples=25, deadline=None)
@given(corpora())
def test_sharded_proposals_equal_one_stores_on_random_corpora(case):
    docs, n, queries = case
    if sum(1 for d in docs if d) < n:
        return  # every shard needs a document
    with tempfile.TemporaryDirectory() as tmp:
        single = build_single(Path(tmp) / "single", docs)
        try:
            build_sharded(Path(tmp) / "sharded", docs, n)
        except DatastoreError as err:
            assert "hold no documents" in str(err)  # a shard of only empty documents
            return
        text = [t for d in docs for t in d]
        windows = [text[max(0, e - 6) : e] for e in range(1, len(text) + 1)]
        for context in map(np.array, queries + [w for w in windows if w]):
            assert_same_proposal(proposals(Path(tmp) / "sharded", context, k=EXACT_K),
                                 proposals(single, context, k=EXACT_K), context)


def test_matches_stop_at_document_boundaries_in_one_store_and_in_shards(tmp_path):
    """Neither kind continues a match into the next document, so splitting between them changes nothing:
    [2, 3, 4, 5] matches only [4, 5] (then 6), and [1, 2, 3] ends its document, so it proposes nothing."""
    docs = [[1, 2, 3], [4, 5, 6]]
    single = build_single(tmp_path / "single", docs)
    build_sharded(tmp_path / "sharded", docs, 2)
    for path in (single, tmp_path / "sharded"):
        index = index_of(open_store(path))
        match = index.longest_match(np.array([2, 3, 4, 5]), 16, 8)
        assert match.length == 2 and index.continuations(match.starts, 3).tolist() == [[6, -1, -1]]
        assert index.longest_match(np.array([1, 2, 3]), 16, 8).length == 0
        assert len(proposals(path, np.array([1, 2, 3]))[0]) == 0


def test_with_a_small_k_matches_agree_and_samples_are_real_occurrences(corpus, stores):
    """With k = 4: a match occurring at most k times gives the same continuations from both kinds; past k
    both sample at most k occurrences of the same longest match, each really following its suffix."""
    single, sharded = index_of(open_store(stores[1])), index_of(open_store(stores[3]))
    tokens = np.concatenate([np.asarray(ix.tokens) for ix in sharded.indexes])  # at global positions
    rare = sampled = 0
    for context in contexts(corpus, seed=7, count=200):
        one, many = single.longest_match(context, 16, 4), sharded.longest_match(context, 16, 4)
        assert one.length == many.length and len(many.starts) <= 4
        suffix = context[len(context) - many.length :].tolist()
        assert all(tokens[start - many.length : start].tolist() == suffix for start in many.starts)
        if one.count <= 4:
            rows = sorted(map(tuple, single.continuations(one.starts, 5).tolist()))
            assert sorted(map(tuple, sharded.continuations(many.starts, 5).tolist())) == rows
            rare += 1
        sampled += one.count > 4
    assert rare > 50 and sampled > 50  # the corpus exercises both cases


def test_merge_uses_every_start_up_to_k_then_shares_k_by_counts():
    a, b, c = Match(3, 2, np.array([5, 9])), Match(3, 1, np.array([4])), Match(2, 7, np.array([1, 2]))
    merged = merge_matches([a, b, c], np.array([0, 100, 200]), k=8)
    assert merged.length == 3 and merged.count == 3 and merged.starts.tolist() == [5, 9, 104]
    ending = Match(3, 10, np.array([5]))  # 10 occurrences, 9 of them at a document's end
    assert merge_matches([ending, b], np.array([0, 100]), k=2).starts.tolist() == [5, 104]
    many = Match(3, 300, np.arange(10, 20))
    merged = merge_matches([many, b], np.array([0, 100]), k=4)
    assert merged.starts.tolist() == [10, 12, 15, 17]  # shares(4, [300, 1]) = [4, 0], spread over 10
    assert shares(10, np.array([1, 1, 1])) == [4, 3, 3] and shares(5, np.array([0, 9])) == [0, 5]
    assert merge_matches([Match(0, 0, np.zeros(0, np.int64))] * 2, np.array([0, 9]), 4).length == 0


# Append


def test_append_adds_shards_without_rebuilding_the_others(corpus, stores, tmp_path):
    out = tmp_path / "grown"
    build_sharded(out, corpus[:40], 2)
    before = {n: os.stat(out / n / TOKENS).st_mtime_ns for n in (shard_name(0), shard_name(1))}
    manifest = build_sharded(out, corpus[40:], 1, append=True)
    assert [s["name"] for s in manifest["shards"]] == [shard_name(i) for i in range(3)]
    assert [b["appended"] for b in manifest["builds"]] == [False, True]
    assert {n: os.stat(out / n / TOKENS).st_mtime_ns for n in before} == before
    assert json.loads((out / MANIFEST).read_text()) == manifest
    for context in contexts(corpus, seed=11, count=100):
        assert_same_proposal(proposals(out, context, k=EXACT_K), proposals(stores[1], context, k=EXACT_K),
                             context)
    assert hidden_entries(out) == [] and hidden_entries(tmp_path) == []


def test_failed_append_leaves_the_store_as_it_was(corpus, tmp_path):
    out = tmp_path / "store"
    build_sharded(out, corpus[:30], 2)
    manifest = (out / MANIFEST).read_bytes()
    with pytest.raises(DatastoreError, match="token id 99 is out of range"):
        build_sharded(out, [[1, 2], [99]], 2, append=True)
    assert (out / MANIFEST).read_bytes() == manifest and sorted(os.listdir(out)) == [
        MANIFEST, shard_name(0), shard_name(1)]
    (out / shard_name(2)).mkdir()  # as a killed append would leave it: removed by the next one
    build_sharded(out, [[1, 2]], 1, append=True)
    assert ShardedDatastore.open(out).manifest["n_documents"] == json.loads(manifest)["n_documents"] + 1


def test_append_is_refused_for_a_single_store_or_another_tokenizer(corpus, tmp_path):
    build_single(tmp_path / "single", corpus)
    with pytest.raises(ShardError, match="not a sharded datastore.*without --shards"):
        build_sharded(tmp_path / "single", corpus, 1, append=True)
    build_sharded(tmp_path / "sharded", corpus, 2)
    with pytest.raises(DatastoreError, match="built with tokenizer"):
        build_sharded(tmp_path / "sharded", corpus, 1, vocab=60, append=True)


# Builds that fail or would clobber


def test_failed_build_publishes_nothing(corpus, tmp_path):
    with pytest.raises(DatastoreError, match="token id 99 is out of range"):
        build_sharded(tmp_path / "store", corpus + [[99]], 3)
    assert not (tmp_path / "store").exists() and hidden_entries(tmp_path) == []


def test_existing_output_is_not_clobbered_unless_overwritten(corpus, tmp_path):
    out = tmp_path / "store"
    build_sharded(out, corpus, 2)
    with pytest.raises(DatastoreError, match="already exists.*--append.*--overwrite"):
        build_sharded(out, corpus, 3)
    build_sharded(out, corpus[:12], 3, overwrite=True)
    assert len(ShardedDatastore.open(out).shards) == 3 and hidden_entries(tmp_path) == []


# Missing or damaged shards and manifests


def remove_shard(path: Path) -> None:
    import shutil

    shutil.rmtree(path / shard_name(1))


def truncate_shard(path: Path) -> None:
    tokens = path / shard_name(1) / TOKENS
    tokens.write_bytes(tokens.read_bytes()[:-2])


def replace_shard(path: Path) -> None:
    build_single(path / shard_name(1), [[1, 2, 3]] * 30, vocab=VOCAB)


def foreign_shard(path: Path) -> None:
    build_single(path / shard_name(1), [[1, 2, 3]], vocab=60)


@pytest.mark.parametrize(
    "damage,problem",
    [
        (remove_shard, f"{HEADER} is missing"),
        (truncate_shard, f"{TOKENS} has .* bytes, expected"),
        (replace_shard, "rebuilt or replaced after the manifest was written"),
        (foreign_shard, "built with tokenizer ids-60"),
    ],
    ids=["missing", "truncated", "replaced", "other-tokenizer"],
)
def test_a_missing_or_damaged_shard_is_named_with_the_fix(corpus, tmp_path, damage, problem):
    out = tmp_path / "store"
    build_sharded(out, corpus, 3)
    if damage in (replace_shard, foreign_shard):
        remove_shard(out)
    damage(out)
    shard = re.escape(str(out / shard_name(1)))
    with pytest.raises(ShardError, match=f"shard '{shard}' is unusable: .*{problem}") as err:
        RestDrafter(ids_target(), datastore=str(out))
    assert f"--shards N --overwrite --out {out}" in str(err.value) and "--out DIR" not in str(err.value)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: "{not json", "manifest.json: not valid JSON"),
        (lambda m: {**m, "format_version": 2}, "manifest version 2; this specframe reads versions 1 to 1"),
        (lambda m: {**m, "n_tokens": m["n_tokens"] + 1}, "do not add up to its totals"),
        (lambda m: {**m, "shards": [{**m["shards"][0], "n_documents": "x"}]}, r"\"shards\[0\].n_documents\""),
    ],
    ids=["json", "version", "totals", "field"],
)
def test_a_damaged_manifest_is_refused(corpus, tmp_path, edit, message):
    out = tmp_path / "store"
    build_sharded(out, corpus, 2)
    edited = edit(json.loads((out / MANIFEST).read_text()))
    (out / MANIFEST).write_text(edited if isinstance(edited, str) else json.dumps(edited))
    with pytest.raises(ShardError, match=message):
        ShardedDatastore.open(out)


def test_a_target_with_another_tokenizer_is_refused(stores):
    with pytest.raises(DatastoreError, match="built with tokenizer ids-50 .* but the target uses .* ids-64"):
        RestDrafter(ids_target(64), datastore=str(stores[2]))


# The command line


@pytest.mark.slow
def test_cli_builds_appends_and_describes_a_sharded_store(smollm2, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specframe.cli import build_app

    monkeypatch.chdir(tmp_path)
    for name, count in (("src", 4), ("more", 1)):
        (tmp_path / name).mkdir()
        for i in range(count):
            (tmp_path / name / f"m{i}.py").write_text(f"def add_{i}(a, b):\n    return a + b + {i}\n" * 3)
    runner, app = CliRunner(), build_app()
    build = ["datastore", "build", "--glob", "*.py", "--out", "./ds"]
    result = runner.invoke(app, build + ["--source", "./src", "--shards", "2"])
    assert result.exit_code == 0 and "2 shards (2 new, in-process)" in result.output, result.output
    result = runner.invoke(app, build + ["--source", "./more", "--append"])  # one new shard
    assert result.exit_code == 0 and "3 shards (1 new, in-process)" in result.output, result.output
    info = json.loads(runner.invoke(app, ["datastore", "info", "./ds", "--json"]).output)
    assert info["n_documents"] == 5 and [s["n_documents"] for s in info["shards"]] == [2, 2, 1]
    result = runner.invoke(app, build[:-1] + ["./other", "--source", "./src", "--ray", "local"])
    assert result.exit_code != 0 and "--ray builds shards: add --shards N" in result.output
    context = np.array(smollm2.tokenizer("def add_4(a, b):\n    return a")["input_ids"])
    assert len(RestDrafter(smollm2, datastore="./ds").propose(DraftContext(context, 0, 8))) > 0


# Ray is optional


def test_builds_and_opens_without_ray_installed(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    build_sharded(tmp_path / "store", corpus, 2)
    assert len(open_store(tmp_path / "store").shards) == 2
    with pytest.raises(DatastoreError, match=r"--ray needs Ray.*specframe\[ray\]"):
        build_sharded(tmp_path / "other", corpus, 2, ray="local")


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance with 2 CPUs for this module's Ray tests (the builds reuse it)."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def test_ray_build_equals_the_in_process_build(corpus, stores, tmp_path, local_ray):
    manifest = build_sharded(tmp_path / "ray", corpus, 3, ray="local")
    assert manifest["builds"][0]["executor"] == "ray local"
    assert all(s["peak_memory_bytes"] > 0 for s in manifest["builds"][0]["shards"])
    by_ray, in_process = open_store(tmp_path / "ray"), open_store(stores[3])
    for a, b in zip(by_ray.shards, in_process.shards, strict=True):
        assert a.tokens.tolist() == b.tokens.tolist() and a.suffixes.tolist() == b.suffixes.tolist()


def test_a_failing_ray_task_raises_its_own_error_and_publishes_nothing(corpus, tmp_path, local_ray,
                                                                      monkeypatch):
    monkeypatch.setattr(local_ray, "cancel", forbidden_cancel)  # see `FakeRay`
    with pytest.raises(DatastoreError, match="token id 99 is out of range"):
        build_sharded(tmp_path / "ray", corpus + [[99]], 2, ray="local")
    assert not (tmp_path / "ray").exists() and hidden_entries(tmp_path) == []


def forbidden_cancel(*args, **kwargs):
    raise AssertionError("cancelling a Ray task as it finishes can abort Ray's driver: never cancel")


class FakeRay:
    """Just enough of Ray to watch `build_on_ray` schedule: a running session with `cpus` CPUs whose
    tasks finish oldest first, the job numbered `fails` raising a shard's error. Records how many tasks
    were in flight at most and which jobs were submitted; cancelling fails the test."""

    class exceptions:  # Ray's own name
        class RayError(Exception):
            pass

    def __init__(self, cpus: int, fails: int):
        self.cpus, self.fails = cpus, fails
        self.in_flight: list[int] = []
        self.submitted: list[int] = []
        self.most_in_flight = 0
        self.cancel = forbidden_cancel

    def is_initialized(self) -> bool:
        return True

    def cluster_resources(self) -> dict:
        return {"CPU": float(self.cpus)}

    def put(self, value):
        return value

    def remote(self, **options):
        def wrap(function):
            return SimpleNamespace(remote=self._submit)
        return wrap

    def _submit(self, out, sources, target) -> int:
        job = int(Path(out).name)
        self.in_flight.append(job)
        self.submitted.append(job)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))
        return job

    def wait(self, refs, num_returns=1, timeout=None):
        done = [r for r in self.in_flight if r in refs][:num_returns]
        return done, [r for r in refs if r not in done]

    def get(self, ref: int) -> dict:
        self.in_flight.remove(ref)
        if ref == self.fails:
            error = self.exceptions.RayError("the task failed")
            error.cause = DatastoreError(f"shard {ref}: token id 99 is out of range")
            raise error
        return {"name": f"shard-{ref}", "n_tokens": 1}


def test_ray_builds_keep_a_cpu_s_worth_of_tasks_in_flight_and_stop_at_a_failure(monkeypatch):
    """At most one task per CPU is in flight; after a failure no new task starts, the running ones
    finish, the failed shard's own error is raised, and nothing is cancelled."""
    import specframe_corpus.distributed as distributed
    from tqdm import tqdm

    fake = FakeRay(cpus=2, fails=1)
    monkeypatch.setattr(distributed, "import_ray", lambda *args: fake)
    jobs = [(Path(str(i)), []) for i in range(6)]
    with tqdm(disable=True) as bar, pytest.raises(DatastoreError, match="shard 1: token id 99"):
        distributed.build_on_ray(jobs, None, "local", None, bar)
    assert fake.most_in_flight == 2
    assert fake.submitted == [0, 1, 2]  # job 2 replaced job 0; job 1's failure stopped the submitting
    assert fake.in_flight == []  # job 2 finished before the error was raised
    fake = FakeRay(cpus=2, fails=-1)
    monkeypatch.setattr(distributed, "import_ray", lambda *args: fake)
    with tqdm(disable=True) as bar:
        results = distributed.build_on_ray(jobs, None, "local", None, bar)
    assert [r["name"] for r in results] == [f"shard-{i}" for i in range(6)] and fake.most_in_flight == 2


@pytest.mark.parametrize("ray,cpus,needle", [("local", 0, "--ray-cpus must be a whole number of CPUs >= 1"),
                                             ("local", -2, "--ray-cpus must be"),
                                             (None, 2, "add --ray local"),
                                             ("10.0.0.1:6379", 2, "add --ray local")])
def test_impossible_ray_cpus_are_refused_before_ray_starts(tmp_path, monkeypatch, ray, cpus, needle):
    """`--ray local --ray-cpus 0` would wait forever for a CPU: refused up front, as is a CPU count for a
    Ray that is not started here; Ray is never imported."""
    import specframe_corpus.distributed as distributed

    def no_ray(*args):
        raise AssertionError("ray was imported")

    monkeypatch.setattr(distributed, "import_ray", no_ray)
    with pytest.raises(specframe.SpecframeError, match=needle):
        build_sharded(tmp_path / "ds", phrase_corpus(0, 8), 2, ray=ray, ray_cpus=cpus)
    assert not (tmp_path / "ds").exists()


def test_a_ray_session_refuses_no_cpus():
    from specframe.kit.ray import ray_session

    with pytest.raises(specframe.ConfigurationError, match="--ray-cpus must be"):
        with ray_session(FakeRay(cpus=2, fails=-1), "local", 0):
            pass


def test_ray_cpus_0_on_the_command_line_is_an_error_before_the_model_loads(monkeypatch, capsys, tmp_path):
    from specframe.cli import main

    monkeypatch.setattr(sys, "argv", ["specframe", "datastore", "build", "--model", str(tmp_path / "none"),
                                      "--source", str(tmp_path), "--out", str(tmp_path / "ds"), "--shards",
                                      "2", "--ray", "local", "--ray-cpus", "0"])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "error: ray: --ray-cpus must be a whole number of CPUs >= 1" in err, err
