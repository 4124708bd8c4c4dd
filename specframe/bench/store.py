"""The record store of `specframe bench`: one append-only JSONL of finished runs beside the settings they
were made with, for a one-request run (`REQUESTS`: a record per method, question, turn and repeat) and for
a batch run (`CALLS`: a record per method, batch size B, repeat and chunk), so that either resumes alike.

Every record is appended at once under the lock of `--out` (`bench_lock`), so that shards or runs into
one directory never interleave their lines; a rerun with the same settings skips what is there, and a
rerun with other settings is refused (or starts over with `--fresh`). A last line cut short by an
interruption fails to parse and its run is simply redone. The two layouts keep their own files, so a
one-request run and a batch run can share an `--out`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specframe.support.atomic_dirs import (FILE_LOCK_WAIT, exclusive, remove_stale, temp_name_pattern,
                                          write_atomically)
from specframe.support.paths import check_writable_dir
from specframe.support.untrusted import json_problem
from specframe.terms.errors import ConfigurationError, OutputError, io_failure


@dataclass(frozen=True)
class Layout:
    """Where one kind of run keeps its records and settings under `--out`, what keys a record, and what
    every record must hold (fields with their JSON kinds, metrics the reports read)."""

    records: str
    settings: str
    key: tuple[str, ...]
    fields: dict
    metrics: tuple[str, ...]
    noun: str  # what a line is called in an error: "benchmark record", "batch record"

    def key_of(self, record: dict) -> tuple:
        return tuple(tuple(v) if isinstance(v, list) else v for v in (record[k] for k in self.key))


# The metrics the reports read from every one-request record (specframe/bench/report.py).
RECORD_METRICS = ("new_tokens", "steps", "draft_tokens", "accepted_draft_tokens", "acceptance_histogram",
                  "time_s", "prefill_s", "wall_s", "tokens_per_s", "decode_tokens_per_s", "peak_memory_bytes")
REQUESTS = Layout("records.jsonl", "settings.json", ("method", "qid", "turn", "repeat"),
                  {"method": str, "qid": str, "category": str, "turn": int, "repeat": int, "tokens": list,
                   "metrics": dict}, RECORD_METRICS, "benchmark record")
CALLS = Layout("batch_records.jsonl", "batch_settings.json", ("method", "batch", "repeat", "qids"),
               {"method": str, "batch": int, "repeat": int, "qids": list, "tokens": list, "metrics": dict},
               ("wall_s", "new_tokens", "tokens_per_s", "latency_s", "steps", "accepted_draft_tokens"),
               "batch record")
_JSON_KIND = {str: "string", int: "integer", list: "list", dict: "object"}
# Temporary files of the reports and settings `write_atomically` writes into --out.
OUT_TEMPORARIES = re.compile("|".join(temp_name_pattern(f"{name}.", ".tmp") for name in (
    "settings.json", "results.json", "results.md", "batch_settings.json", "batch_results.json",
    "batch_results.md")))


@contextmanager
def bench_lock(out: Path) -> Iterator[None]:
    """Hold the lock of the benchmark directory `out` for one update of its files (a record appended, the
    settings checked and written, the reports written). Shards of a suite may run into one `--out` at
    once: each update is short, so a writer waits for the others."""
    lock = out / ".bench.lock"

    def busy() -> ConfigurationError:
        return ConfigurationError(f"{out} stayed locked by another bench run for {FILE_LOCK_WAIT:g} s "
                                  f"({lock}); if no specframe process is running, delete that lock file")

    with exclusive(lock, busy, wait=FILE_LOCK_WAIT, waiting=f"specframe: waiting for another bench run "
                   f"writing to {out} ({lock})"):
        yield


@contextmanager
def writing(path: Path | str, kept: str) -> Iterator[None]:
    """A write under `--out` whose failure (a full disk, mostly) becomes an `OutputError` naming `path`,
    the system's reason and `kept`: what stays in `--out` and how to go on. The CLI prints it as one
    `error:` line instead of a traceback."""
    try:
        yield
    except OSError as err:
        if err.filename is not None and str(err.filename) == str(path):
            err = OSError(err.errno, err.strerror)  # the message names the file once
        raise OutputError(f"bench could not write {path} ({io_failure(err, 'pass another --out')}); "
                          f"{kept}") from None


def records_kept(count: int, path: Path) -> str:
    """What a failed write leaves of a run's records, and how to go on from them."""
    if not count:
        return f"no record was in {path} yet"
    return (f"the {count} record(s) written before stay in {path}: once there is room, rerun the same "
            "command to resume from them")


def tables_kept(records: Path) -> str:
    """What a failed write of a finished run's tables or plots leaves, and how to go on."""
    return (f"every record stays in {records}: once there is room, rerun the same command to write the "
            "tables from them (nothing is run again)")


def append_line(path: Path, line: str) -> None:
    """Append one record's line to `path` (the one place records are written)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(line)


def end_cut_line(path: Path) -> None:
    """End a last line cut short (an interrupted or failed write), so the next record starts on a line of
    its own; the cut line fails to parse and its run is simply redone."""
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
        if cut:
            append_line(path, "\n")


class RecordStore:
    """The records of `path` (a `layout.records` file), keyed by `layout.key`.

    Records are appended under the directory's lock, after checking that the settings file still holds
    the settings it held when the store was opened: a run started meanwhile into the same directory with
    other settings would otherwise mix its records with this one's."""

    def __init__(self, path: Path, layout: Layout = REQUESTS):
        self.path, self.layout = path, layout
        self.records: dict[tuple, dict] = {}
        with bench_lock(path.parent):
            self.settings = _settings_in(path.parent, layout)
            if path.exists():
                for record in read_records(path, layout):
                    self.records[self.key(record)] = record
                with writing(path, records_kept(len(self.records), path)):
                    end_cut_line(path)

    def key(self, record: dict) -> tuple:
        return self.layout.key_of(record)

    def __len__(self) -> int:
        return len(self.records)

    def get(self, *key) -> dict | None:
        """The record of `key` (the layout's key fields in order), None when there is none."""
        return self.records.get(tuple(tuple(v) if isinstance(v, list) else v for v in key))

    def add(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        with writing(self.path, records_kept(len(self.records), self.path)), bench_lock(self.path.parent):
            if _settings_in(self.path.parent, self.layout) != self.settings:
                raise ConfigurationError(
                    f"{self.path.parent / self.layout.settings} was replaced while this run was writing to "
                    f"{self.path.parent} (another bench run with other settings, or --fresh, started "
                    "there): run one benchmark per --out, or shards of one run with the same settings")
            append_line(self.path, line)
        self.records[self.key(record)] = record


def _settings_in(out: Path, layout: Layout = REQUESTS) -> dict | None:
    """The settings recorded in `out`, None when there are none."""
    path = out / layout.settings
    return read_settings(path) if path.exists() else None


def read_records(path: Path, layout: Layout = REQUESTS) -> list[dict]:
    """The finished runs of a records file, in order, without changing the file (for reports and scripts
    that read a run; `RecordStore` reads the same way). A line that is not JSON is a line cut short by an
    interrupted write, skipped (its run is redone); one that is JSON but no record is refused."""
    records = []
    for number, line in enumerate(path.read_text("utf-8", errors="replace").splitlines(), 1):
        parsed = json_problem(line)  # why a line is not JSON, or (its value,)
        if isinstance(parsed, str):
            continue
        problem = record_problem(parsed[0], layout)
        if problem:
            raise ConfigurationError(
                f"{path}, line {number} is not a {layout.noun}: {problem}. Delete that line to redo the "
                "run it stood for, or pass --fresh to discard every earlier record")
        records.append(parsed[0])
    return records


def record_problem(record, layout: Layout = REQUESTS) -> str | None:
    """What is wrong with one parsed record, or None when it holds every field the bench reads (`{}`,
    `null` or a record without metrics would otherwise fail later, deep in the reports)."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {json.dumps(record)[:40]}"
    for name, kind in layout.fields.items():
        if name not in record:
            return f"field '{name}' is missing"
        value = record[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"field '{name}' should be a JSON {_JSON_KIND[kind]}, got {json.dumps(value)[:40]}"
    missing = [m for m in layout.metrics if m not in record["metrics"]]
    return f"its metrics lack {', '.join(missing)}" if missing else None


def check_settings(out: Path, settings: dict, layout: Layout = REQUESTS) -> None:
    """Refuse to resume into a directory holding records made with other settings; record the settings
    otherwise. A settings file with no records beside it binds nothing (a run that failed before its
    first record, e.g. on a bad option, leaves one), so it is simply replaced."""
    path, records = out / layout.settings, out / layout.records
    with bench_lock(out):
        remove_stale(out, OUT_TEMPORARIES, f"temporary files in {out}")
        recorded = records.exists() and read_records(records, layout)
        if path.exists() and recorded:
            old = read_settings(path)
            changed = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
            if changed:
                raise ConfigurationError(
                    f"{out} holds results made with other settings ({changed}, as (old, new)); "
                    "resume with the same settings, or pass another --out (or --fresh to start over)")
        else:
            with writing(path, "nothing was run yet"):
                write_atomically(path, json.dumps(settings, indent=2))


def read_settings(path: Path) -> dict:
    """The settings recorded by an earlier run, refused with a way out when the file is damaged."""
    old = json_problem(path.read_bytes())  # why it is not JSON, or (its value,)
    if isinstance(old, str):
        old, problem = None, f"it is not valid JSON ({old})"
    else:
        old = old[0]
        problem = None if isinstance(old, dict) else f"expected a JSON object, got {json.dumps(old)[:40]}"
    if problem:
        raise ConfigurationError(
            f"{path} is damaged: {problem}. Delete it to resume (if the records beside it were made with "
            "the settings you pass now), or pass --fresh to start over")
    return old


def start_out(out: Path, settings: dict, fresh: bool, layout: Layout = REQUESTS) -> RecordStore:
    """Create `out` (emptied of earlier records of `layout` with `fresh`), record or check the settings,
    and open the store."""
    check_writable_dir(out, "--out", "pass an --out directory you can write to")
    if fresh:
        with bench_lock(out):
            for name in (layout.records, layout.settings):
                (out / name).unlink(missing_ok=True)
    check_settings(out, settings, layout)
    return RecordStore(out / layout.records, layout)


def call_metrics(wall_s: float, new_tokens: list[int], latency_s: list[float], steps: int,
                 accepted: int, split: dict | None = None) -> dict:
    """What a `CALLS` record keeps of one batched call: its seconds, every row's new tokens and latency,
    the steps and accepted draft tokens of all rows (tau = (accepted + steps) / steps), and for a
    specframe pipeline the call's time split as a whole (`split`:
    `specframe.decode.batch.BatchMetrics.to_dict`: batched steps, prefill seconds, seconds and ms per
    batched step by phase)."""
    total = sum(new_tokens)
    return {"wall_s": wall_s, "new_tokens": total, "tokens_per_s": total / wall_s if wall_s > 0 else 0.0,
            "row_new_tokens": new_tokens, "latency_s": latency_s, "steps": steps,
            "accepted_draft_tokens": accepted, **(split or {})}
