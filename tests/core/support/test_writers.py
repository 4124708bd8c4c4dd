"""Writers of shared files: locked, merging, checked before the work, never losing the work's result.

Suffix caches, acceptance counts, calibrations, benchmark directories and datastores: a second process
writing the same file adds to it instead of replacing it, a killed write leaves nothing the next writer
does not remove, files follow the umask, and a datastore being replaced is never missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_llama

from specframe import ConfigurationError, SpeculativeDecoder
from specframe.support.atomic_dirs import exclusive, write_atomically
from specframe.terms.errors import SpecframeWarning

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py
TESTS = Path(__file__).parents[2]  # where conftest.py lives


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(seed=1)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "suffix-caches"


def responses(path: Path) -> list[list[int]]:
    return json.loads(path.read_text())["responses"]


# --- suffix caches ---------------------------------------------------------------------------------------

# A second process: opens the cache, says so, waits for GO, then remembers its responses one by one.
RACER = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from conftest import tiny_llama
from specframe_suffix.drafter import SuffixDrafter
cache, ready, go = sys.argv[2:5]
drafter = SuffixDrafter(tiny_llama(seed=1), cache=cache)
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.01)
for i in range(10):
    drafter.remember([], [50, 60, i])
"""


def test_two_processes_sharing_a_cache_keep_both_processes_responses(tiny, tmp_path):
    from specframe_suffix.drafter import SuffixDrafter

    cache, ready, go = tmp_path / "shared.json", tmp_path / "ready", tmp_path / "go"
    other = subprocess.Popen([sys.executable, "-c", RACER, str(TESTS), str(cache), str(ready), str(go)],
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True)
    mine = SuffixDrafter(tiny, cache=str(cache))  # both open the cache before either saves
    while not ready.exists():
        assert other.poll() is None, other.stderr.read()
        time.sleep(0.01)
    go.touch()
    for i in range(10):
        mine.remember([], [10, 20, i])
    assert other.wait(timeout=120) == 0, other.stderr.read()
    stored = responses(cache)
    assert sorted(stored) == sorted([[10, 20, i] for i in range(10)] + [[50, 60, i] for i in range(10)])
    assert [r for r in stored if r[0] == 10] == [[10, 20, i] for i in range(10)]  # each in its order


def test_a_cache_keeps_its_newest_responses_when_merged(tiny, tmp_path):
    from specframe_suffix.drafter import SuffixDrafter

    cache = tmp_path / "c.json"
    first, second = (SuffixDrafter(tiny, cache=str(cache), max_cached=3) for _ in range(2))
    first.remember([], [1, 2])
    second.remember([], [3, 4])
    first.remember([], [5, 6])
    second.remember([], [7, 8])
    assert responses(cache) == [[3, 4], [5, 6], [7, 8]]


def test_the_next_save_removes_temporaries_of_killed_saves(tiny, home, capsys):
    from specframe_suffix.drafter import SuffixDrafter

    home.mkdir(parents=True)
    left = [home / "chat.json.k1ll3d_a.tmp", home / "chat.json.abc.tmp"]
    for path in left:
        path.write_text('{"format": 1, "tokenizer"')  # what a killed save leaves
    other = home / "code.json.x1.tmp"  # another cache's, maybe being written: not this writer's
    other.write_text("")
    SuffixDrafter(tiny, cache="chat").remember([], [1, 2, 3])
    assert not any(p.exists() for p in left) and other.exists()
    assert "removed temporary files of suffix cache" in capsys.readouterr().err
    assert sorted(p.name for p in home.iterdir()) == ["chat.json", "code.json.x1.tmp"]  # no lock file left


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_caches_and_atomic_files_follow_the_umask(tiny, tmp_path, umask):
    from specframe_suffix.drafter import SuffixDrafter

    previous = os.umask(umask)
    try:
        SuffixDrafter(tiny, cache=str(tmp_path / "c.json")).remember([], [1, 2])
        write_atomically(tmp_path / "plain.txt", "x")
    finally:
        os.umask(previous)
    for name in ("c.json", "plain.txt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_a_cache_that_cannot_be_written_is_refused_before_any_work(tiny, tmp_path):
    from specframe_suffix.drafter import SuffixDrafter

    (tmp_path / "file").write_text("")  # a file where the cache's directory should be (root ignores modes)
    with pytest.raises(ConfigurationError, match="suffix cache directory .* cannot be a directory"):
        SuffixDrafter(tiny, cache=str(tmp_path / "file" / "c.json"))


def test_a_failed_save_keeps_the_result_and_saves_with_the_next_request(tiny, tmp_path, monkeypatch):
    import specframe_suffix.store as store

    cache = tmp_path / "c.json"
    decoder = SpeculativeDecoder.from_names(tiny, f"suffix(cache={str(cache)!r})", "trie", "greedy", budget=4)
    write = store.write_atomically

    def full_disk(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "write_atomically", full_disk)
    with pytest.warns(SpecframeWarning, match=r"could not save 1 response.*No space left on device"):
        first = decoder.generate([5, 6, 7, 8], max_new_tokens=6)
    assert len(first.tokens) == 6 and not cache.exists()
    monkeypatch.setattr(store, "write_atomically", write)
    second = decoder.generate([9, 10, 11], max_new_tokens=5)
    assert responses(cache) == [first.tokens, second.tokens]


# --- acceptance counts -----------------------------------------------------------------------------------


def test_acceptance_counts_of_two_writers_add_up(tmp_path):
    from specframe.decode.acceptance import AcceptanceModel

    path = tmp_path / "acc.json"
    a, b = AcceptanceModel.load(path), AcceptanceModel.load(path)
    a.coarse[:, 1] += (1, 2)
    b.coarse[:, 2] += (3, 4)
    a.save(path)
    b.save(path)
    b.coarse[:, 2] += (1, 1)  # learned after its first save: only this is added the second time
    b.save(path)
    assert np.array_equal(AcceptanceModel.load(path).coarse[:, 1:3], [[1, 4], [2, 5]])


# --- calibrations ----------------------------------------------------------------------------------------


def test_a_calibration_write_cleans_temporaries_and_waits_for_the_lock(tmp_path):
    from specframe.plugging.calibration import read_cost, write_cost
    from specframe.support.atomic_dirs import file_lock
    from specframe.terms.cost import MeasuredCost

    path = tmp_path / "kv-abc.json"
    (tmp_path / "kv-abc.json.dead1.tmp").write_text("{")  # a killed write's
    cost = MeasuredCost((0, 1), (0.01, 0.02), (0.01, 0.02), 10)
    assert_waits_for(file_lock(path), lambda: write_cost(path, {"k": 1}, cost), path.exists)
    assert read_cost(path) is not None and sorted(p.name for p in tmp_path.iterdir()) == ["kv-abc.json"]


# --- benchmark directories -------------------------------------------------------------------------------


def assert_waits_for(lock: Path, write, written) -> None:
    """`write()` run in a thread waits while the test holds `lock`, then completes."""
    with exclusive(lock, lambda: AssertionError("lock busy")):
        worker = threading.Thread(target=write)
        worker.start()
        time.sleep(0.3)
        assert worker.is_alive() and not written(), "wrote without waiting for the lock"
    worker.join(timeout=30)
    assert not worker.is_alive() and written()


def record(qid: str, tokens: int = 3) -> dict:
    from specframe.bench.runner import RECORD_METRICS

    return {"method": "m", "qid": qid, "category": "c", "turn": 0, "repeat": 0, "tokens": [1] * tokens,
            "metrics": dict.fromkeys(RECORD_METRICS, 0)}


def test_records_are_appended_under_the_directory_lock(tmp_path):
    from specframe.bench.runner import RecordStore

    store = RecordStore(tmp_path / "records.jsonl")
    big = record("q1", tokens=100_000)  # a line well over the pipe buffer
    assert_waits_for(tmp_path / ".bench.lock", lambda: store.add(big),
                     lambda: (tmp_path / "records.jsonl").exists())
    assert RecordStore(tmp_path / "records.jsonl").get("m", "q1", 0, 0) == big


def test_settings_are_checked_under_the_directory_lock(tmp_path):
    from specframe.bench.runner import check_settings

    assert_waits_for(tmp_path / ".bench.lock", lambda: check_settings(tmp_path, {"model": "a"}),
                     lambda: (tmp_path / "settings.json").exists())


def test_a_run_whose_settings_were_replaced_meanwhile_stops_adding_records(tmp_path):
    from specframe.bench.runner import RecordStore, check_settings

    check_settings(tmp_path, {"model": "a"})
    store = RecordStore(tmp_path / "records.jsonl")
    check_settings(tmp_path, {"model": "b"})  # another run, started before this one's first record
    with pytest.raises(ConfigurationError, match="settings.json was replaced while this run"):
        store.add(record("q1"))
    assert not (tmp_path / "records.jsonl").exists()


def test_an_out_directory_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    from specframe.bench.harness import start_out

    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigurationError, match="--out .* cannot be a directory"):
        start_out(tmp_path / "file" / "out", {"model": "a"}, fresh=False)


# --- datastores ------------------------------------------------------------------------------------------


def test_replacing_a_datastore_never_leaves_its_name_empty(tmp_path, monkeypatch):
    """`publish` swaps the new store in: at every rename or swap, a reader finds a whole store at `out`."""
    import specframe_corpus.build as build
    from specframe_corpus.datastore import HEADER

    out, new = tmp_path / "ds", tmp_path / ".ds.building-x"
    for path, text in ((out, "old"), (new, "new")):
        path.mkdir()
        (path / HEADER).write_text(text)
    seen = []

    def watched(step):
        def run(*args):
            seen.append((out / HEADER).read_text() if (out / HEADER).is_file() else None)
            result = step(*args)
            seen.append((out / HEADER).read_text() if (out / HEADER).is_file() else None)
            return result
        return run

    monkeypatch.setattr(Path, "rename", watched(Path.rename))
    monkeypatch.setattr(build, "exchange", watched(build.exchange))
    build.publish(new, out)
    assert None not in seen and seen[-1] == "new"
    assert (out / HEADER).read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["ds"]



HOLD_AND_DIE = """
import os, signal, sys
from pathlib import Path
from specframe.support.atomic_dirs import exclusive
with exclusive(Path(sys.argv[1]), RuntimeError):
    print("held", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_lock_file_left_by_a_killed_holder_is_never_taken_for_a_held_lock(tmp_path):
    """A holder killed by a signal cannot remove its lock file; the lock is the kernel's flock on it,
    released with the process, so the next holder takes it at once (no wait) and removes the file."""
    lock = tmp_path / ".out.lock"
    killed = subprocess.run([sys.executable, "-c", HOLD_AND_DIE, str(lock)], capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -9 and killed.stdout == "held\n", killed.stderr
    assert lock.is_file() and lock.stat().st_size == 0  # what a kill leaves
    with exclusive(lock, lambda: AssertionError("a stale lock file was taken for a held lock")):
        pass
    assert not lock.exists()
