"""Files specframe reads are untrusted input: none can run code, and none can crash the process.

- A pickle whose loading would create a marker file is planted under every name a reader opens (training
  state, feature and block caches, datastores, suffix caches, calibrations, acceptance counts, model and
  conversion directories): the reader refuses it with its own clear error, or, where the file is a cache,
  ignores it; the marker never appears.
- Headers and files of datastores, sharded datastores, suffix caches, calibrations and conversion markers
  are mutated by hypothesis (derandomized, fixed example counts, so the time in CI is known): every
  reader ends with its own error, or a result that holds up, never another exception or a signal. A few
  of the mutations go through the `specframe` command's entry point (one in its own process): an
  `error:` line and exit 2.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from specframe_corpus.build import build_datastore
from specframe_corpus.datastore import BUCKETS, HEADER, SUFFIXES, TOKENS, Datastore, DatastoreError
from specframe_corpus.distributed import build_sharded_datastore
from specframe_corpus.retrieval import SuffixIndex
from specframe_corpus.shards import MANIFEST, ShardedDatastore, index_of
from specframe_corpus.sources import TokenDocuments
from specframe_suffix.store import SuffixCacheError, read_cache

from specframe.decode.acceptance import AcceptanceModel
from specframe.plugging.calibration import read_cost
from specframe.terms.cost import MeasuredCost
from specframe.terms.errors import ConfigurationError, ModelLoadError, PromptError
from specframe.runtime.model_files import CONVERSION_MARKER, conversion_damage, write_marker
from specframe.testing import tiny_target
from specframe.support.tokenizer_identity import TokenizerIdentity

VOCAB = 50
DOCS = [[1, 2, 3, 4], [2, 3, 5], [7, 7, 7, 1, 2], [4, 4, 9, 30, 2, 3]]
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def fuzz(examples: int) -> settings:
    """A fixed number of derandomized examples: the same cases, and the same time, on every run."""
    return settings(FUZZ, max_examples=examples)


# ------------------------------------------------------------------------------------------------------
# Planted pickles


class Payload:
    """Unpickling this creates the file `marker` (as `os.system(...)` could have run anything)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def baits(marker: Path) -> dict[str, bytes]:
    """The payload in the three formats a reader might unpickle: plain pickle, `torch.save`'s zip and a
    numpy array of objects."""
    zipped, npy = io.BytesIO(), io.BytesIO()
    torch.save({"state": Payload(marker)}, zipped)
    np.save(npy, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    return {"pickle": pickle.dumps(Payload(marker)), "torch": zipped.getvalue(), "npy": npy.getvalue()}


def bait_for(name: str, marker: Path) -> bytes:
    kinds = baits(marker)
    if name.endswith(".npy"):
        return kinds["npy"]
    return kinds["torch"] if name.endswith((".pt", ".bin", ".safetensors")) else kinds["pickle"]


def test_the_baits_run_their_payload_when_unpickled(tmp_path):
    """The control: loaded the unsafe way, each bait creates the marker; the readers below never do."""
    marker = tmp_path / "ran"
    loads = {"pickle": pickle.loads, "torch": lambda b: torch.load(io.BytesIO(b), weights_only=False),
             "npy": lambda b: np.load(io.BytesIO(b), allow_pickle=True)}
    for kind, data in baits(marker).items():
        loads[kind](data)
        assert marker.exists(), kind
        marker.unlink()


def plant(directory: Path, name: str, marker: Path) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bait_for(name, marker))
    return path


def ids_target(vocab: int = VOCAB):
    return SimpleNamespace(name="ids", tokenizer=None, vocab_size=vocab)


def build_store(out: Path, docs=DOCS) -> Path:
    build_datastore(out, [TokenDocuments("docs", "ids", documents=docs)], ids_target(), progress=False)
    return out


def build_shards(out: Path) -> Path:
    build_sharded_datastore(out, [TokenDocuments("docs", "ids", documents=DOCS)], ids_target(), shards=2,
                            progress=False)
    return out


def s4c_trainer(run: Path):
    from specframe_s4c.features import FeatureCache
    from specframe_s4c.train import Trainer, TrainConfig

    target = tiny_target(seed=0)
    blocks = np.arange(4 * 8).reshape(4, 8) % target.vocab_size  # (4, 8)
    cache = FeatureCache(run / "features", blocks, hidden=target.config.hidden_size)
    config = TrainConfig(num_heads=1, block=8, batch=2, steps=2, warmup=1, draft_vocab=0)
    return Trainer(target, cache, run, config, log=lambda line: None)


def test_no_planted_pickle_runs_in_s4c_training_state_or_features(tmp_path):
    from specframe_s4c.features import FeatureCache

    from specframe.support.train_state import TrainStateError

    marker, run = tmp_path / "ran", tmp_path / "run"
    trainer = s4c_trainer(run)
    for name in ("state.pt", "state.safetensors"):
        plant(run, name, marker)
        with pytest.raises(TrainStateError, match="delete it .* to start afresh"):
            trainer.resume()
        (run / name).unlink()
    trainer.save()  # a state written by this specframe resumes
    assert trainer.resume() and not marker.exists()
    for name in ("ids.npy", "progress.json", "features.f16"):
        features = tmp_path / f"features-{name}"
        FeatureCache(features, np.zeros((2, 4), np.int64), hidden=8)
        plant(features, name, marker)
        with pytest.raises(ConfigurationError, match="feature cache .* is damaged"):
            FeatureCache(features, hidden=8)
    assert not marker.exists()


def test_no_planted_pickle_runs_in_hybrid_work_directories(tmp_path):
    from ssm_models import tiny_llama

    from specframe.support.train_state import TrainStateError
    from specframe_hybrid.convert import convert
    from specframe_hybrid.data import cached_blocks
    from specframe_hybrid.end_to_end import EndToEndTraining, train_end_to_end

    marker = tmp_path / "ran"
    llama = tiny_llama(seed=0, layers=2)
    blocks = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    for name in ("state.pt", "state.safetensors"):
        work = tmp_path / f"work-{name}"
        plant(work, name, marker)
        with pytest.raises(TrainStateError, match="delete it to train end to end afresh"):
            train_end_to_end(llama, convert(llama, [1]), [1], blocks, work, EndToEndTraining(steps=1),
                             log=lambda line: None)
    for name in ("blocks.pt", "blocks.safetensors"):  # a cache: ignored, made again
        path = plant(tmp_path / "run", name, marker)
        assert cached_blocks(path, {"block": 8}, 64) is None
    assert not marker.exists()


def test_no_planted_pickle_runs_in_datastores_caches_and_calibrations(tmp_path):
    marker = tmp_path / "ran"
    template = build_store(tmp_path / "template")
    for name in (HEADER, TOKENS, SUFFIXES, BUCKETS):
        store = tmp_path / f"store-{name}"
        shutil.copytree(template, store)
        plant(store, name, marker)
        with pytest.raises(DatastoreError, match="datastore"):
            Datastore.open(store)
    sharded = build_shards(tmp_path / "sharded")
    for name in (MANIFEST, f"shard-00000/{HEADER}", f"shard-00001/{TOKENS}"):
        copy_ = tmp_path / f"sharded-{name.replace('/', '-')}"
        shutil.copytree(sharded, copy_)
        plant(copy_, name, marker)
        with pytest.raises(DatastoreError, match="sharded datastore"):
            ShardedDatastore.open(copy_)
    with pytest.raises(SuffixCacheError, match="suffix cache"):
        read_cache(plant(tmp_path, "chat.json", marker))
    assert read_cost(plant(tmp_path, "costs/kv-0123.json", marker)) is None  # measured again instead
    with pytest.raises(ConfigurationError, match="acceptance file .* not one specframe wrote"):
        AcceptanceModel.load(plant(tmp_path, "acceptance.json", marker))
    assert not marker.exists()


def test_no_planted_pickle_runs_in_model_or_conversion_directories(tmp_path):
    from specframe.runtime.load import load_target

    marker = tmp_path / "ran"
    for name in ("config.json", "model.safetensors", CONVERSION_MARKER):
        converted = conversion_dir(tmp_path / f"conversion-{name}")
        plant(converted, name, marker)
        assert conversion_damage(converted) is not None  # converted again, never loaded
    model = tmp_path / "model"
    tiny = tiny_target(seed=0)
    tiny.model.config.save_pretrained(model)
    tiny.tokenizer.save_pretrained(model)
    plant(model, "pytorch_model.bin", marker)  # transformers loads .bin weights with weights_only=True
    with pytest.raises(ModelLoadError, match="pickled weights file .* refused"):
        load_target(str(model))
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------------
# Mutated headers and files

DTYPES = ["O", "i4,i4", "V2", "U1", "<f8", "uint8", "int16", ">u2", "uint64", "float16", "S3", "M8",
          "object", "int32", "int64", "uint16", "uint32", ""]
ODD_VALUES = st.one_of(
    st.sampled_from(DTYPES),
    st.sampled_from([0, 1, -1, 2, 2**31, 2**32 - 1, 2**32, 2**63, 2**64, -2**63, 10**30]),
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=6),
    st.sampled_from(["../shard-00000", "/etc", "shard-00001", "sha256:" + "0" * 64, "tokens.bin", "x\0y"]),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.sampled_from(["name", "fingerprint", "vocab_size", "sha256", "bytes", "x"]),
                    st.one_of(st.integers(-2, 60), st.text(max_size=3)), max_size=3),
)


def paths_of(value, prefix=()) -> list[tuple]:
    """Every path into a JSON document (keys and list indexes), the document itself first."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):
            found += paths_of(item, (*prefix, i))
    return found


def mutate_json(doc, data) -> str:
    """`doc` with one value replaced, or one key removed or added, as hypothesis chooses; as JSON text."""
    doc = copy.deepcopy(doc)
    path = data.draw(st.sampled_from(paths_of(doc)[1:]), label="path")
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    action = data.draw(st.sampled_from(["replace", "remove", "add"]), label="action")
    if action == "remove" and isinstance(parent, dict):
        del parent[path[-1]]
    elif action == "add" and isinstance(parent, dict):
        key = data.draw(st.sampled_from(["extra", "n_tokens", "../x", "__metadata__"]), label="key")
        parent[key] = data.draw(ODD_VALUES, label="value")
    else:
        parent[path[-1]] = data.draw(ODD_VALUES, label="value")
    return json.dumps(doc)


def mutate_bytes(raw: bytes, data) -> bytes:
    """`raw` truncated, extended, or with a few bytes overwritten, as hypothesis chooses."""
    action = data.draw(st.sampled_from(["truncate", "extend", "overwrite"]), label="bytes")
    if action == "truncate":
        return raw[:data.draw(st.integers(0, max(0, len(raw) - 1)))]
    if action == "extend":
        return raw + data.draw(st.binary(min_size=1, max_size=16))
    at = data.draw(st.integers(0, max(0, len(raw) - 1)))
    patch = data.draw(st.binary(min_size=1, max_size=8))
    return raw[:at] + patch + raw[at + len(patch):]


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    return SimpleNamespace(store=build_store(root / "store"), sharded=build_shards(root / "sharded"),
                           conversion=conversion_dir(root / "conversion"))


def conversion_dir(path: Path) -> Path:
    """A complete-looking conversion: config.json, one safetensors file, and the marker written last."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.zeros(3, 2), "b": torch.ones(2)}, str(path / "model.safetensors"))
    write_marker(path)
    return path


def exercised(store) -> None:
    """Use a store that opened: a longest-match query and its continuations must not fail."""
    index = index_of(store) if isinstance(store, ShardedDatastore) else SuffixIndex.of(store)
    match = index.longest_match(np.array([7, 7, 1, 2], np.int64), 4, 4)
    if len(match.starts):
        index.continuations(match.starts, 3)
    store.describe()


@fuzz(150)
@given(data=st.data())
def test_mutated_datastore_headers_end_in_a_datastore_error(templates, data):
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "ds"
        shutil.copytree(templates.store, store)
        header = json.loads((store / HEADER).read_text())
        (store / HEADER).write_text(mutate_json(header, data))
        try:
            opened = Datastore.open(store, expect=TokenizerIdentity(**header["tokenizer"]))
        except DatastoreError:
            return
        exercised(opened)


@fuzz(100)
@given(name=st.sampled_from([TOKENS, SUFFIXES, BUCKETS, HEADER]), data=st.data())
def test_mutated_datastore_files_end_in_a_datastore_error(templates, name, data):
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "ds"
        shutil.copytree(templates.store, store)
        (store / name).write_bytes(mutate_bytes((store / name).read_bytes(), data))
        try:
            opened = Datastore.open(store)
        except DatastoreError:
            return
        exercised(opened)


@fuzz(100)
@given(name=st.sampled_from([MANIFEST, f"shard-00000/{HEADER}", f"shard-00001/{HEADER}"]), data=st.data())
def test_mutated_sharded_manifests_and_shard_headers_end_in_a_datastore_error(templates, name, data):
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "ds"
        shutil.copytree(templates.sharded, store)
        (store / name).write_text(mutate_json(json.loads((store / name).read_text()), data))
        try:
            opened = ShardedDatastore.open(store)
        except DatastoreError:
            return
        exercised(opened)


DEEP = "[" * 100_000 + "]" * 100_000  # deeper than any recursive parser goes


def test_deeply_nested_json_is_a_clear_error_or_ignored(templates, tmp_path):
    store = tmp_path / "ds"
    shutil.copytree(templates.store, store)
    for name in (HEADER, "chat.json", "kv.json", "acceptance.json"):
        (store / name).write_text(DEEP)
    with pytest.raises(DatastoreError, match="not valid JSON"):
        Datastore.open(store)
    with pytest.raises(SuffixCacheError, match="not valid JSON"):
        read_cache(store / "chat.json")
    assert read_cost(store / "kv.json") is None
    with pytest.raises(ConfigurationError, match="not one specframe wrote"):
        AcceptanceModel.load(store / "acceptance.json")
    converted = tmp_path / "conversion"
    shutil.copytree(templates.conversion, converted)
    (converted / CONVERSION_MARKER).write_text(DEEP)
    assert conversion_damage(converted) == f"{CONVERSION_MARKER} is unreadable"


@pytest.mark.parametrize("files", [{"config.json": float("inf")}, {"config.json": "12"},
                                   {"../config.json": 10}, {"model.safetensors": -1}, ["config.json"]])
def test_conversion_markers_recording_impossible_files_mean_damage(templates, tmp_path, files):
    converted = tmp_path / "conversion"
    shutil.copytree(templates.conversion, converted)
    (converted / CONVERSION_MARKER).write_text(json.dumps({"files": files}))
    assert CONVERSION_MARKER in conversion_damage(converted)


SUFFIX_CACHE = {"format": 1, "tokenizer": {"name": "ids", "fingerprint": "raw-ids", "vocab_size": VOCAB},
                "responses": [[1, 2, 3], [4, 5], []]}


@fuzz(80)
@given(data=st.data(), raw=st.booleans())
def test_mutated_suffix_caches_end_in_a_suffix_cache_error(data, raw):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chat.json"
        text = mutate_json(SUFFIX_CACHE, data).encode()
        path.write_bytes(mutate_bytes(json.dumps(SUFFIX_CACHE).encode(), data) if raw else text)
        try:
            stored = read_cache(path)
        except SuffixCacheError:
            return
        vocab = stored.identity.vocab_size
        assert all(0 <= t < vocab and type(t) is int for response in stored.responses for t in response)


CALIBRATION = {"key": {"format": 1, "model": "tiny"}, "sizes": [0, 1, 2, 4],
               "flat_s": [0.01, 0.011, 0.012, 0.02], "chain_s": [0.01, 0.011, 0.012, 0.019], "context": 257,
               "flat_slope": [1e-6] * 4, "chain_slope": [1e-6] * 4}


@fuzz(80)
@given(data=st.data(), raw=st.booleans())
def test_mutated_calibrations_are_measured_again(data, raw):
    """A damaged calibration is read as none (`cached_cost` measures again), never as an error or as
    nonsense costs."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kv-0123.json"
        text = mutate_json(CALIBRATION, data).encode()
        path.write_bytes(mutate_bytes(json.dumps(CALIBRATION).encode(), data) if raw else text)
        cost = read_cost(path)
        if cost is not None:
            assert isinstance(cost, MeasuredCost) and np.all(np.diff(cost.sizes) > 0)
            assert np.isfinite(cost.step_seconds(3)) and cost.step_seconds(3) >= 0


@fuzz(80)
@given(data=st.data(), target=st.sampled_from([CONVERSION_MARKER, "model.safetensors"]))
def test_mutated_conversion_markers_and_weights_are_found_damaged(templates, data, target):
    """A damaged conversion is converted again: `conversion_damage` names what is wrong, never raises."""
    with tempfile.TemporaryDirectory() as tmp:
        converted = Path(tmp) / "conversion"
        shutil.copytree(templates.conversion, converted)
        file = converted / target
        if target == CONVERSION_MARKER and data.draw(st.booleans(), label="json"):
            file.write_text(mutate_json(json.loads(file.read_text()), data))
        else:
            file.write_bytes(mutate_bytes(file.read_bytes(), data))
        damage = conversion_damage(converted)
        assert damage is None or isinstance(damage, str)


# ------------------------------------------------------------------------------------------------------
# Through the command line: an `error:` line and exit 2, never a signal or a traceback


def specframe(*args: str) -> subprocess.CompletedProcess:
    """The `specframe` command in its own process: a crash there is a signal, not a failed test."""
    return subprocess.run([sys.executable, "-c", "from specframe.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=300)


def specframe_here(monkeypatch, capsys, *args: str) -> SimpleNamespace:
    """The `specframe` command's entry point run in this process (fast): its exit code and stderr."""
    from specframe.cli import main

    monkeypatch.setattr(sys, "argv", ["specframe", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return SimpleNamespace(returncode=exit_.value.code, stderr=capsys.readouterr().err)


def edited_store(root: Path, template: Path, **fields) -> Path:
    store = root / "ds"
    shutil.copytree(template, store)
    header = json.loads((store / HEADER).read_text())
    (store / HEADER).write_text(json.dumps({**header, **fields}))
    return store


def crafted_dtype_store(root: Path, template: Path, dtype: str) -> Path:
    """A store whose header names `dtype` for its tokens, with tokens.bin resized to match, so that a
    reader trusting the header maps it (as "O": the token ids read as Python object pointers)."""
    store = edited_store(root, template, token_dtype=dtype)
    tokens = np.fromfile(store / TOKENS, np.uint16).astype(np.int64)  # (n,)
    size = len(tokens) * np.dtype(dtype).itemsize
    (store / TOKENS).write_bytes((tokens.tobytes() * 8)[:size])
    return store


def foreign_shard_store(root: Path, template: Path) -> Path:
    store = root / "sharded"
    shutil.copytree(template, store)
    manifest = json.loads((store / MANIFEST).read_text())
    manifest["shards"][0]["name"] = "../elsewhere"
    (store / MANIFEST).write_text(json.dumps(manifest))
    return store


def assert_error_line(result, *words: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert all(word in result.stderr for word in words), result.stderr


@pytest.mark.parametrize("dtype", ["O", "i4,i4", "V2", "U1", "float64", "int8"])
def test_datastore_info_on_a_crafted_dtype_is_an_error_line(templates, tmp_path, monkeypatch, capsys, dtype):
    """Unchecked, `"O"` maps tokens.bin as Python object pointers (SIGSEGV); the others escape as
    TypeError or SystemError tracebacks, or map the tokens as another type."""
    store = crafted_dtype_store(tmp_path, templates.store, dtype)
    assert_error_line(specframe_here(monkeypatch, capsys, "datastore", "info", str(store)), "token_dtype")


def test_datastore_and_cache_info_on_damaged_files_are_error_lines(templates, tmp_path, monkeypatch, capsys):
    store = foreign_shard_store(tmp_path, templates.sharded)
    assert_error_line(specframe_here(monkeypatch, capsys, "datastore", "info", str(store)), "shards[0].name")
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    assert_error_line(specframe_here(monkeypatch, capsys, "cache", "info", str(deep)), "not valid JSON")


def test_the_command_exits_2_without_a_signal_in_its_own_process(templates, tmp_path):
    """The store whose dtype, unchecked, would crash the interpreter, in a separate process, where a
    segmentation fault shows as a signal (exit -11) rather than killing the test session (one process:
    the command loads every plugin, about 8 s of CPU)."""
    crafted = crafted_dtype_store(tmp_path, templates.store, "O")
    assert_error_line(specframe("datastore", "info", str(crafted)), "token_dtype")


# ------------------------------------------------------------------------------------------------------
# One reader for untrusted JSON: a 5000-digit integer or deep nesting is each reader's own error


HUGE_INT = '{"format": ' + "7" * 5000 + "}"  # Python refuses to convert more than 4300 digits
DEEP_BUT_PARSED = "[" * 200 + "]" * 200  # within the parser's recursion, past what specframe accepts


def _suite(path: Path):
    from specframe.support.prompt_suites import load_suite

    return load_suite(str(path))


def _jsonl_source(path: Path):
    from specframe_corpus.sources import JsonlTexts

    return list(JsonlTexts("src", "jsonl", path=path).batches())


def _prompt_file(path: Path):
    from specframe_corpus.answers import read_prompts

    return read_prompts(path)


def _bench_settings(path: Path):
    from specframe.bench.runner import read_settings

    return read_settings(path)


def _in_store(template: Path, name: str):
    def read(path: Path, text: str):
        store = path.parent / "store"
        shutil.copytree(template, store)
        (store / name).write_text(text)
        return (ShardedDatastore if name == MANIFEST else Datastore).open(store)
    return read


JSON_READERS = {  # name: (read(path, text), the error it must end in)
    "datastore header": (lambda templates: _in_store(templates.store, HEADER), DatastoreError),
    "sharded manifest": (lambda templates: _in_store(templates.sharded, MANIFEST), DatastoreError),
    "suffix cache": (lambda templates: lambda path, text: read_cache(path), SuffixCacheError),
    "suite": (lambda templates: lambda path, text: _suite(path), PromptError),
    "jsonl source": (lambda templates: lambda path, text: _jsonl_source(path), DatastoreError),
    "prompt file": (lambda templates: lambda path, text: _prompt_file(path), DatastoreError),
    "bench settings": (lambda templates: lambda path, text: _bench_settings(path), ConfigurationError),
}


@pytest.mark.parametrize("text", [HUGE_INT, DEEP, DEEP_BUT_PARSED],
                         ids=["5000 digits", "100000 deep", "200 deep"])
@pytest.mark.parametrize("reader", JSON_READERS)
def test_huge_integers_and_deep_nesting_are_each_readers_own_error(templates, tmp_path, reader, text):
    make, error = JSON_READERS[reader]
    path = tmp_path / "file.jsonl"
    path.write_text(text)
    with pytest.raises(error, match="not valid JSON") as raised:
        make(templates)(path, text)
    assert "Exceeds the limit" not in str(raised.value) and "set_int_max_str_digits" not in str(raised.value)


@pytest.mark.parametrize("text", [HUGE_INT, DEEP, DEEP_BUT_PARSED])
def test_benchmark_records_that_do_not_parse_are_skipped_as_cut_lines(tmp_path, text):
    from specframe.bench.runner import read_records

    path = tmp_path / "records.jsonl"
    path.write_text(text + "\n")
    assert read_records(path) == []


def test_the_untrusted_json_reader_names_why():
    from specframe.support.untrusted import json_or_none, json_problem

    assert json_problem('{"a": [1, 2]}') == ({"a": [1, 2]},)
    assert json_problem(HUGE_INT) == "a number of more than 4300 digits"
    assert json_problem(DEEP) == json_problem(DEEP_BUT_PARSED) == "nested more than 64 levels deep"
    assert json_problem(b"\xff") .startswith("not UTF-8 text")
    assert json_or_none("[1") is None and json_or_none("[1]") == [1]


# ------------------------------------------------------------------------------------------------------
# Lone surrogates: printed escaped, refused before a tokenizer


LONE = "\\ud800"  # as JSON writes it: decodes to a lone surrogate, which no encoder writes


def test_a_lone_surrogate_in_cache_and_datastore_info_is_printed_escaped(templates, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specframe.cli import build_app

    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    caches = tmp_path / "home" / "suffix-caches"
    caches.mkdir(parents=True)
    odd = json.dumps(SUFFIX_CACHE).replace('"name": "ids"', f'"name": "ids{LONE}"')
    (caches / "odd.json").write_text(odd)
    (caches / "plain.json").write_text(json.dumps(SUFFIX_CACHE))
    runner, app = CliRunner(), build_app()
    listed = runner.invoke(app, ["cache", "info"])
    assert listed.exit_code == 0, listed.output
    assert f"tokenizer ids{LONE}" in listed.output and "plain: 3 responses" in listed.output
    store = edited_store(tmp_path, templates.store,
                         tokenizer={**json.loads((templates.store / HEADER).read_text())["tokenizer"],
                                    "name": "ids\ud800"})
    shown = runner.invoke(app, ["datastore", "info", str(store)])
    assert shown.exit_code == 0, shown.output
    assert f"ids{LONE}" in shown.output


def test_a_lone_surrogate_in_a_suite_turn_or_a_datastore_source_is_refused_by_line(tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text('{"question_id": 1, "turns": ["fine"]}\n'
                     f'{{"question_id": 2, "turns": ["a{LONE}b"]}}\n')
    with pytest.raises(PromptError, match=r"line 2: field 'turns', item 0 .* lone surrogate \\ud800"):
        _suite(suite)
    source = tmp_path / "source.jsonl"
    source.write_text(f'{{"text": "fine"}}\n{{"text": "a{LONE}b"}}\n')
    with pytest.raises(DatastoreError, match=r"line 2 holds a lone surrogate \\ud800 at character 1"):
        _jsonl_source(source)


# ------------------------------------------------------------------------------------------------------
# Stores claiming more than their files hold, and suffix arrays wrong past the sample checked at open


BIG_DOCS = [list(np.random.default_rng(i).integers(0, VOCAB, 700)) for i in range(8)]  # > 4097 positions


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("big") / "store", BIG_DOCS)


def sampled(n: int) -> set[int]:
    """The suffix-array indexes `Datastore._check` samples (and their successors)."""
    sample = np.random.default_rng(0).integers(0, n - 1, size=4096)
    return {*sample.tolist(), *(sample + 1).tolist()}


def copy_with_suffixes(big_store: Path, tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A copy of `big_store` and its suffix array, to edit and write back to `copy / SUFFIXES`."""
    store = tmp_path / "ds"
    shutil.copytree(big_store, store)
    return store, np.fromfile(store / SUFFIXES, np.int32)  # (n,)


def test_a_sparse_file_claiming_gigabytes_is_refused_at_open(templates, tmp_path):
    sep = 1 << 26  # buckets.bin of 512 MiB, almost all of it a hole
    header = json.loads((templates.store / HEADER).read_text())
    tokens = np.fromfile(templates.store / TOKENS, np.uint16).astype(np.uint32)  # (n,)
    tokens[tokens == VOCAB] = sep
    store = edited_store(tmp_path, templates.store, separator=sep, token_dtype="uint32",
                         tokenizer={**header["tokenizer"], "vocab_size": sep},
                         files={**header["files"], TOKENS: {"sha256": "x"}, BUCKETS: {"sha256": "x"}})
    tokens.tofile(store / TOKENS)
    with open(store / BUCKETS, "r+b") as f:
        f.truncate((sep + 2) * 8)
    if (store / BUCKETS).stat().st_blocks * 512 * 16 >= (sep + 2) * 8:
        pytest.skip("this file system does not keep sparse files")
    with pytest.raises(DatastoreError, match="buckets.bin.*on disk \\(a sparse file\\)"):
        Datastore.open(store)


def test_a_suffix_entry_out_of_range_past_the_sample_is_refused_at_open(big_store, tmp_path):
    store, suffixes = copy_with_suffixes(big_store, tmp_path)
    unsampled = next(i for i in range(len(suffixes)) if i not in sampled(len(suffixes)))
    suffixes[unsampled] = len(suffixes) + 5
    suffixes.tofile(store / SUFFIXES)
    with pytest.raises(DatastoreError, match="positions outside the corpus"):
        Datastore.open(store)


def test_a_suffix_entry_at_the_corpus_end_past_the_sample_is_a_retrieval_error(big_store, tmp_path):
    store, suffixes = copy_with_suffixes(big_store, tmp_path)
    buckets = np.fromfile(store / BUCKETS, np.int64)  # (VOCAB + 2,)
    checked = sampled(len(suffixes))
    token, i = next((t, i) for t in range(VOCAB) for i in range(buckets[t], buckets[t + 1])
                    if i not in checked)
    suffixes[i] = 0  # the corpus's final separator, among the matches of `token`
    suffixes.tofile(store / SUFFIXES)
    index = SuffixIndex.of(Datastore.open(store))
    with pytest.raises(DatastoreError, match="suffixes.bin puts the end of the corpus"):
        index.longest_match(np.array([token], np.int64), 1, 10_000)
