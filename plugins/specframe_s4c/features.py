"""A resumable on-disk cache of the frozen target's features for token blocks.

The target's forward pass is the dearest part of head training on a CPU, and every epoch needs the same
features, so they are computed once, stored as float16 in a file beside the token blocks, and filled block
by block (a killed run continues where it stopped).

The file's space is reserved whole before the first block is computed, and blocks are written with
ordinary writes, never through a writable memory map: a store through a map into a full disk kills the
process with SIGBUS, where a write raises an error that is reported with what to do, the blocks already
done kept. Reading maps the file read-only.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

import specframe
from specframe.kit.files import io_failure, write_atomically


class FeatureCache:
    """`ids.npy` (B, T) int64, `features.f16` (B, T, H) float16, `progress.json` (blocks done)."""

    def __init__(self, directory: Path, blocks: np.ndarray | None = None, hidden: int | None = None):
        self.dir = Path(directory)
        with self.writing():
            self._open(blocks, hidden)

    def _open(self, blocks: np.ndarray | None, hidden: int | None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ids_path = self.dir / "ids.npy"
        if ids_path.is_file():
            self.ids = self._read_ids(ids_path)
            if blocks is not None and not np.array_equal(blocks, self.ids):
                raise specframe.ConfigurationError(
                    f"s4c training: the feature cache in {self.dir} holds other token blocks; "
                    "use a new --out directory or the same --data/--block/--max-tokens")
        else:
            if blocks is None:
                raise specframe.ConfigurationError(f"s4c training: no feature cache in {self.dir}")
            array = io.BytesIO()
            np.save(array, blocks)
            write_atomically(ids_path, array.getvalue())  # whole or not at all, even on a full disk
            self.ids = blocks
        meta_path = self.dir / "progress.json"
        meta = self._read_progress(meta_path) if meta_path.is_file() else {"done": 0, "hidden": hidden}
        self.hidden = int(meta["hidden"])
        self.done = int(meta["done"])
        if hidden is not None and hidden != self.hidden:
            raise specframe.ConfigurationError(
                f"s4c training: the feature cache in {self.dir} holds features of size {self.hidden}, the "
                f"target's are {hidden}: it was made for another model; use a new --out directory")
        features = self.dir / "features.f16"
        shape = (*self.ids.shape, self.hidden)  # (B, T, H)
        if features.is_file() and features.stat().st_size != int(np.prod(shape)) * 2:
            raise self.damaged(f"features.f16 has {features.stat().st_size} bytes, not the "
                               f"{int(np.prod(shape)) * 2} of {shape} float16 features")
        if not features.is_file():
            reserve(features, int(np.prod(shape)) * 2)
        self.path = features
        self.features = np.memmap(features, dtype=np.float16, mode="r", shape=shape)  # (B, T, H)

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Report a failed write in the cache (a full or read-only disk) as an error saying what to do; the
        blocks done so far stay in the cache, and a rerun continues from them."""
        try:
            yield
        except OSError as err:
            raise specframe.ConfigurationError(
                f"s4c training: writing the feature cache in {self.dir} failed: " + io_failure(
                    err, "pass an --out on a disk with room for the features; the blocks done so far "
                    "are kept, and a rerun with the same --out continues from them")) from None

    def damaged(self, problem: str) -> specframe.ConfigurationError:
        return specframe.ConfigurationError(
            f"s4c training: the feature cache in {self.dir} is damaged ({problem}); delete that directory "
            "to compute the features again, or use a new --out directory")

    def _read_ids(self, path: Path) -> np.ndarray:
        """The cached token blocks, a (B, T) int64 array (`allow_pickle=False`: reading runs no code)."""
        try:
            ids = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise self.damaged(f"ids.npy is not a numpy array file: {err}") from None
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 2 or 0 in ids.shape:
            raise self.damaged(f"ids.npy holds {getattr(ids, 'dtype', type(ids))} of shape "
                               f"{getattr(ids, 'shape', None)}, not (blocks, tokens) int64")
        return ids

    def _read_progress(self, path: Path) -> dict:
        """`progress.json`, checked: `hidden` a positive size, `done` a block count of this cache."""
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as err:
            raise self.damaged(f"progress.json is not valid JSON: {err}") from None
        fields = [meta.get(key) if isinstance(meta, dict) else None for key in ("hidden", "done")]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in fields) or not (
                0 < fields[0] <= 1 << 20 and 0 <= fields[1] <= len(self.ids)):
            raise self.damaged(f"progress.json holds {meta!r}, not a hidden size and a count of done blocks")
        return meta

    def _write_progress(self) -> None:
        write_atomically(self.dir / "progress.json", json.dumps({"done": self.done, "hidden": self.hidden}))

    def fill(self, target: specframe.Target, batch: int = 4, log=print,
             deadline: float | None = None) -> None:
        """Compute features for the blocks not done yet, `batch` blocks per forward pass."""
        t0, start = time.time(), self.done
        while self.done < len(self.ids) and (deadline is None or time.time() < deadline):
            rows = slice(self.done, min(self.done + batch, len(self.ids)))
            ids = torch.from_numpy(self.ids[rows]).to(target.device)  # (b, T)
            with torch.no_grad():
                out = target.model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
            block = out.hidden_states[-1].to(torch.float16).cpu().numpy()  # (b, T, H)
            with self.writing():
                write_at(self.path, block.tobytes(), rows.start * block[0].nbytes)
                self.done = rows.stop
                self._write_progress()
            rate = (self.done - start) * self.ids.shape[1] / (time.time() - t0)
            log(f"features {self.done}/{len(self.ids)} blocks, {rate:.0f} tok/s")

    def batch(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, T) ids and (b, T, H) float32 features of the given block rows (all must be done)."""
        ids = torch.from_numpy(self.ids[rows])
        feats = torch.from_numpy(np.asarray(self.features[rows], dtype=np.float32))
        return ids, feats


def reserve(path: Path, size: int) -> None:
    """Create `path` with `size` bytes of disk space allocated, or raise `OSError` (ENOSPC) and remove it:
    free space is checked first, then allocated (`posix_fallocate`), so a full disk is found before any
    block is computed."""
    free = shutil.disk_usage(path.parent).free
    if free < size:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({size:,} bytes needed, {free:,} free)",
                      str(path))
    try:
        with open(path, "wb") as f:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(f.fileno(), 0, size)
            else:
                f.truncate(size)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_at(path: Path, data: bytes, offset: int) -> None:
    """Write `data` into the file `path` at `offset`, with ordinary writes (a full disk raises `OSError`)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
