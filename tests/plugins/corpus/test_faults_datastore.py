"""Faults around datastore builds and the model cache: concurrent builds of one store, builds and
conversions killed mid-way, the modes of what is published, and a damaged GGUF conversion cache.

The concurrency and kill tests run the real `specframe` CLI in subprocesses, with a tiny word-level
tokenizer and a one-layer Llama saved to disk, so each build takes a few seconds (mostly imports). Where a
test needs a build to stop at a known point, the subprocess runs `specframe.cli.main` with a pause or a
self-kill patched into `plugins/specframe_corpus/build.py` (as `tests/core/cli/test_cli_exit_codes.py` runs
main).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from specframe_corpus.build import build_datastore, lock_file, recover
from specframe_corpus.datastore import HEADER, Datastore, DatastoreBusyError
from specframe_corpus.sources import TokenDocuments

from specframe.runtime import load, model_files
from specframe.support.atomic_dirs import current_umask, exclusive
from specframe.terms.errors import ModelLoadError

SPECFRAME = Path(sys.executable).with_name("specframe")
WORDS = 63

# Runs the real CLI; GATE pauses the build inside its lock (in the first `write_source`) until RELEASE
# exists; KILL_AT_PUBLISH kills the process between the two renames of `publish` where the system has no
# atomic swap of directories (the swap is turned off).
WRAPPER = """
import os, signal, sys, time
from pathlib import Path
import specframe_corpus.build as build
import specframe.cli as cli
gate, mode = sys.argv[1], sys.argv[2]
if mode == "gate":
    original = build.write_source
    def write_source(*args, **kwargs):
        Path(gate, "inside").touch()
        while not Path(gate, "release").exists():
            time.sleep(0.02)
        return original(*args, **kwargs)
    build.write_source = write_source
elif mode == "kill-at-publish":
    build.exchange = lambda a, b: False
    rename = Path.rename
    def killing_rename(self, target):
        result = rename(self, target)
        if Path(target).name == "store":  # the previous store was just moved aside
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    Path.rename = killing_rename
sys.argv = ["specframe", *sys.argv[3:]]
cli.main()
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A one-layer Llama with a 64-word tokenizer ("[UNK]", "w0" ... "w62"), saved like a HF model."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny-model")
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(WORDS)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=WORDS + 1,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def corpus(path: Path, lines: int, seed: int, words_per_line: int = 20) -> Path:
    """A text file of random words (one document: a text file is one document)."""
    rng = random.Random(seed)
    text = "\n".join(
        " ".join(f"w{rng.randrange(WORDS)}" for _ in range(words_per_line)) for _ in range(lines)
    )
    path.write_text(text + "\n")
    return path


def cli_args(model_dir: Path, source: Path, out: Path, *extra: str) -> list[str]:
    return [
        "datastore",
        "build",
        "--source",
        str(source),
        "--out",
        str(out),
        "--model",
        str(model_dir),
        *extra,
    ]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def start_cli(args: list[str]) -> subprocess.Popen:
    """The real `specframe` executable."""
    return subprocess.Popen(
        [str(SPECFRAME), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )


def start_wrapped(gate: Path, mode: str, args: list[str]) -> subprocess.Popen:
    """`specframe.cli.main` with a pause or a kill patched in (see WRAPPER)."""
    gate.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", WRAPPER, str(gate), mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the build exited ({proc.returncode}) early: {proc.stderr.read()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.005)


def temp_dirs(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".building-" in p.name or ".old-" in p.name)


def documents(out: Path) -> int:
    """Documents of the store at `out`, after checking it opens and matches every recorded digest."""
    store = Datastore.open(out)
    store.verify()
    return int(store.header["n_documents"])


# --- concurrent builds -------------------------------------------------------------------------------


def test_a_second_build_during_a_build_is_refused_with_exit_2(model_dir, tmp_path):
    out, gate = tmp_path / "ds", tmp_path / "gate"
    first = start_wrapped(gate, "gate", cli_args(model_dir, corpus(tmp_path / "a.txt", 30, 1), out))
    wait_for(gate / "inside", first)  # the first build holds the lock, paused inside
    code, err = finish(start_cli(cli_args(model_dir, corpus(tmp_path / "b.txt", 30, 2), out, "--overwrite")))
    assert code == 2, err
    assert "error: datastore" in err and "is being built by another process" in err and "wait for" in err
    (gate / "release").touch()
    code, err = finish(first)
    assert code == 0, err
    header = json.loads((out / HEADER).read_text())
    assert header["sources"][0]["source"].endswith("a.txt") and documents(out) == 1
    assert temp_dirs(tmp_path) == [] and not lock_file(out).exists()


def test_two_plain_builds_at_once_one_wins_and_the_store_is_intact(model_dir, tmp_path):
    out = tmp_path / "ds"
    sources = [corpus(tmp_path / f"{i}.txt", 2000, i) for i in range(2)]
    procs = [start_cli(cli_args(model_dir, s, out)) for s in sources]
    results = [finish(p) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "being built by another process" in loser or "already exists" in loser
    winner = sources[next(i for i, (code, _) in enumerate(results) if code == 0)]
    assert json.loads((out / HEADER).read_text())["sources"][0]["source"] == str(winner)
    assert documents(out) == 1 and temp_dirs(tmp_path) == []


def test_two_appends_at_once_never_lose_one(model_dir, tmp_path):
    out = tmp_path / "ds"
    code, err = finish(start_cli(cli_args(model_dir, corpus(tmp_path / "base.txt", 50, 9), out)))
    assert code == 0, err
    sources = [corpus(tmp_path / f"{i}.txt", 2000, i) for i in range(2)]
    results = [finish(p) for p in [start_cli(cli_args(model_dir, s, out, "--append")) for s in sources]]
    succeeded = [code for code, _ in results].count(0)
    assert all(code in (0, 2) for code, _ in results) and succeeded >= 1, results
    for code, err in results:
        if code == 2:
            assert "being built by another process" in err
    assert documents(out) == 1 + succeeded  # each append that exited 0 is in the store


def test_in_process_build_is_refused_while_the_lock_is_held(tmp_path):
    out = tmp_path / "ds"
    busy = pytest.raises(DatastoreBusyError, match="being built by another process.*--append")
    with exclusive(lock_file(out), lambda: AssertionError("free lock")), busy:
        ids_build(out)
    ids_build(out)
    assert documents(out) == 1 and not lock_file(out).exists()


def test_a_build_where_nothing_can_be_written_says_so_not_that_it_is_busy(tmp_path):
    """A lock that cannot be created is not a lock held by another build (filelock reports both alike)."""
    from specframe.terms.errors import ConfigurationError

    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigurationError, match="cannot be a directory.*writable directory"):
        ids_build(tmp_path / "a-file" / "ds")
    if Path("/proc/self").is_dir():  # a directory no one can create files in, root included
        with pytest.raises(ConfigurationError, match="/proc is not writable"):
            ids_build(Path("/proc/ds"))


# --- killed builds -------------------------------------------------------------------------------------


def ids_target(vocab: int = 50):
    from types import SimpleNamespace

    return SimpleNamespace(name="ids", tokenizer=None, vocab_size=vocab)


def ids_build(out: Path, docs=((1, 2, 3),), **kwargs) -> dict:
    source = TokenDocuments("docs", "ids", documents=[list(d) for d in docs])
    return build_datastore(out, [source], ids_target(), progress=False, **kwargs)


def test_a_build_killed_inside_leaves_the_previous_store_and_the_next_build_cleans(
    model_dir, tmp_path, capsys
):
    out, gate = tmp_path / "ds", tmp_path / "gate"
    code, err = finish(start_cli(cli_args(model_dir, corpus(tmp_path / "a.txt", 30, 1), out)))
    assert code == 0, err
    before = (out / HEADER).read_text()
    proc = start_wrapped(
        gate, "gate", cli_args(model_dir, corpus(tmp_path / "b.txt", 30, 2), out, "--append")
    )
    wait_for(gate / "inside", proc)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    left = temp_dirs(tmp_path)
    assert len(left) == 1 and left[0].startswith(".ds.building-")  # what the issue saw: left forever
    assert (out / HEADER).read_text() == before and documents(out) == 1
    ids_build(tmp_path / "other")  # another store's build leaves this one's leftovers alone
    assert temp_dirs(tmp_path) == left
    ids_build(out, overwrite=True)
    err = capsys.readouterr().err
    assert temp_dirs(tmp_path) == [] and f"removed temporary directories of datastore '{out}'" in err
    assert str(tmp_path / left[0]) in err


def test_a_build_killed_between_the_publish_renames_gets_the_previous_store_back(model_dir, tmp_path, capsys):
    out = tmp_path / "ds"
    code, err = finish(start_cli(cli_args(model_dir, corpus(tmp_path / "a.txt", 30, 1), out)))
    assert code == 0, err
    before = (out / HEADER).read_text()
    proc = start_wrapped(
        tmp_path / "gate",
        "kill-at-publish",
        cli_args(model_dir, corpus(tmp_path / "b.txt", 30, 2), out, "--overwrite"),
    )
    code, _ = finish(proc)
    assert code == -signal.SIGKILL and not out.exists()  # killed with the old store moved aside
    assert any(name.startswith(".ds.old-") for name in temp_dirs(tmp_path))
    with pytest.raises(Exception, match="already exists"):
        ids_build(out)  # the next build first puts the previous store back, so it is not clobbered
    err = capsys.readouterr().err
    assert f"restored datastore '{out}'" in err and "removed temporary directories" in err
    assert (out / HEADER).read_text() == before and documents(out) == 1 and temp_dirs(tmp_path) == []


def test_random_kills_never_expose_a_half_written_store(model_dir, tmp_path):
    """SIGKILL a replacing build at random moments after it took the lock: the store at `out` is always
    the previous or the new one, whole (or, killed inside `publish`, put back by the next build), and
    the next build leaves no temporary directory."""
    out = tmp_path / "ds"
    new_source = corpus(tmp_path / "new.txt", 20000, 2)
    code, err = finish(start_cli(cli_args(model_dir, corpus(tmp_path / "old.txt", 50, 1), out)))
    assert code == 0, err
    rng = random.Random(15)
    for delay in [0.0] + [rng.uniform(0.0, 1.5) for _ in range(3)]:
        previous = (out / HEADER).read_text()
        proc = start_cli(cli_args(model_dir, new_source, out, "--overwrite"))
        wait_for(lock_file(out), proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        finish(proc)
        if not out.exists():  # killed between the renames of `publish`: the next build puts it back
            with exclusive(lock_file(out), lambda: AssertionError("busy")):
                recover(out)
        header = (out / HEADER).read_text()
        assert header == previous or json.loads(header)["sources"][0]["source"] == str(new_source)
        assert documents(out) == 1
        ids_build(out, overwrite=True)  # the next build: cleans up, and gives the next round a new store
        assert temp_dirs(tmp_path) == []


# --- modes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_new_datastores_follow_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        assert current_umask() == umask
        ids_build(tmp_path / "ds")
    finally:
        os.umask(previous)
    assert (tmp_path / "ds").stat().st_mode & 0o777 == 0o777 & ~umask
    assert (tmp_path / "ds" / HEADER).stat().st_mode & 0o777 == 0o666 & ~umask


# --- the GGUF conversion cache -------------------------------------------------------------------------


def tiny_safetensors(path: Path, values: int = 64) -> Path:
    save_file({"w": torch.arange(values, dtype=torch.float32), "b": torch.ones(3)}, str(path))
    return path


def test_safetensors_damage_finds_truncation_and_garbage(tmp_path):
    file = tiny_safetensors(tmp_path / "model.safetensors")
    assert model_files.safetensors_damage(file) is None
    size = file.stat().st_size
    with open(file, "r+b") as f:
        f.truncate(size - 4)
    expected = f"model.safetensors has {size - 4} bytes, its header says {size}"
    assert model_files.safetensors_damage(file) == expected
    with open(file, "r+b") as f:
        f.truncate(20)
    assert "truncated inside its header" in model_files.safetensors_damage(file)
    file.write_bytes((12).to_bytes(8, "little") + b"not json!!!!")
    assert model_files.safetensors_damage(file) == "model.safetensors has a corrupt header"


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    """SPECFRAME_HOME in tmp_path and a stand-in for the 20 s dequantization of the real GGUF (which
    writes a 0600 safetensors file, as the real one does); returns the list of conversions done."""
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    done = []

    def dequantize(alias, tmp, out):
        (tmp / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (tmp / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {}}))
        os.chmod(tiny_safetensors(tmp / "model.safetensors"), 0o600)
        done.append(alias)

    monkeypatch.setattr(load, "_dequantize", dequantize)
    return done


def test_a_damaged_conversion_cache_is_converted_again(fake_conversion, capsys):
    cached = load.model_cache_dir("smollm2-135m")
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    file = tiny_safetensors(cached / "model.safetensors")
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size // 2)  # what a full disk or a killed copy leaves
    assert load.resolve_model_dir("smollm2-135m") == cached and fake_conversion == ["smollm2-135m"]
    err = capsys.readouterr().err
    assert (
        f"cached conversion {cached} is damaged (model.safetensors has" in err
        and "converting it again" in err
    )
    assert model_files.conversion_damage(cached) is None
    assert (cached / model_files.CONVERSION_MARKER).is_file()
    load.resolve_model_dir("smollm2-135m")
    assert fake_conversion == ["smollm2-135m"]  # complete now: not converted again
    tokenizer = cached / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text()[:-5])
    assert model_files.conversion_damage(cached) == (
        f"tokenizer.json has {tokenizer.stat().st_size} bytes, expected {tokenizer.stat().st_size + 5}"
    )
    load.resolve_model_dir("smollm2-135m")
    assert len(fake_conversion) == 2 and model_files.conversion_damage(cached) is None


def test_a_cache_from_before_the_marker_is_checked_by_parsing(tmp_path):
    cached = tmp_path / "m"
    cached.mkdir()
    (cached / "config.json").write_text("{}")
    tiny_safetensors(cached / "model.safetensors")
    assert model_files.conversion_damage(cached) is None
    (cached / "tokenizer.json").write_text('{"model": {"vocab": ')
    assert model_files.conversion_damage(cached).startswith("tokenizer.json is not valid JSON")
    assert model_files.conversion_damage(tmp_path / "missing") == "config.json is missing"


def test_a_killed_conversion_is_cleaned_up_and_the_cache_follows_the_umask(fake_conversion, capsys):
    home = load.model_cache_dir("smollm2-135m").parent
    stale = home / ".smollm2-135m-k1ll3d_x"  # what `tempfile.mkdtemp` left when the process was killed
    (stale / "sub").mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"\0" * 1000)
    unrelated = home / ".smollm2-135m.notes"
    unrelated.write_text("keep")
    previous = os.umask(0o022)
    try:
        cached = load.resolve_model_dir("smollm2-135m")
    finally:
        os.umask(previous)
    assert (
        not stale.exists()
        and unrelated.exists()
        and f"removed partial conversions of smollm2-135m left by an interrupted run: {stale}"
        in (capsys.readouterr().err)
    )
    assert sorted(p.name for p in home.iterdir()) == [".smollm2-135m.notes", "smollm2-135m"]  # no lock left
    assert cached.stat().st_mode & 0o777 == 0o755
    assert (cached / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_a_second_conversion_waits_for_the_first(fake_conversion, capsys):
    cached = load.model_cache_dir("smollm2-135m")
    cached.parent.mkdir(parents=True)
    held, release = threading.Event(), threading.Event()

    def other_process():
        with exclusive(cached.parent / ".smollm2-135m.lock", lambda: AssertionError("busy")):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=other_process)
    thread.start()
    held.wait(30)
    threading.Timer(0.5, release.set).start()
    assert load.resolve_model_dir("smollm2-135m") == cached
    thread.join()
    assert "waiting for another process converting smollm2-135m" in capsys.readouterr().err
    assert fake_conversion == ["smollm2-135m"]


def test_a_conversion_that_never_frees_the_lock_gives_up_with_a_message(fake_conversion, monkeypatch):
    monkeypatch.setattr(load, "CONVERT_WAIT_S", 0.2)
    cached = load.model_cache_dir("smollm2-135m")
    cached.parent.mkdir(parents=True)
    gives_up = pytest.raises(
        ModelLoadError, match="another process has been converting it.*stop it, or delete"
    )
    with exclusive(cached.parent / ".smollm2-135m.lock", lambda: AssertionError("busy")), gives_up:
        load.resolve_model_dir("smollm2-135m")
    assert fake_conversion == []


# A conversion in a subprocess, with the slow dequantization replaced by a stand-in that writes the same
# kinds of files with pauses between them, so a SIGKILL can land anywhere inside it.
SLOW_CONVERSION = """
import json, sys, time
from pathlib import Path
import torch
from safetensors.torch import save_file
from specframe.runtime import load

def dequantize(alias, tmp, out):
    (tmp / "config.json").write_text(json.dumps({"model_type": "llama"}))
    time.sleep(0.2)
    save_file({"w": torch.arange(200_000, dtype=torch.float32)}, str(tmp / "model.safetensors"))
    time.sleep(0.2)
    (tmp / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {}}))
    time.sleep(0.2)

load._dequantize = dequantize
Path(sys.argv[1]).touch()  # started
load.resolve_model_dir("smollm2-135m")
"""


def test_random_kills_of_a_conversion_never_expose_a_half_written_cache(tmp_path, monkeypatch, capsys):
    """SIGKILL a conversion at random moments: the cache is absent or complete, never half written, and
    the next conversion removes what the killed one left and completes."""
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    cached = load.model_cache_dir("smollm2-135m")
    rng = random.Random(7)
    for round_ in range(4):
        started = tmp_path / f"started-{round_}"
        proc = subprocess.Popen([sys.executable, "-c", SLOW_CONVERSION, str(started)], env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(started, proc)
        time.sleep(rng.uniform(0.0, 0.8))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert not cached.exists() or model_files.conversion_damage(cached) is None  # absent, or whole
        if cached.exists():
            shutil.rmtree(cached)  # so the next round converts (and can be killed) again
    monkeypatch.setattr(load, "_dequantize", lambda alias, tmp, out: _stand_in(tmp))
    assert load.resolve_model_dir("smollm2-135m") == cached
    assert model_files.conversion_damage(cached) is None
    assert sorted(p.name for p in cached.parent.iterdir()) == ["smollm2-135m"]  # nothing left behind


def _stand_in(tmp: Path) -> None:
    (tmp / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {}}))
    tiny_safetensors(tmp / "model.safetensors")
