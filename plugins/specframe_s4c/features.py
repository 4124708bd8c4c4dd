"""A resumable on-disk cache of the frozen target's features for token blocks.

The target's forward pass is the dearest part of head training on a CPU, and every epoch needs the same
features, so they are computed once, stored as float16 in a memory-mapped file beside the token blocks,
and filled block by block (a killed run continues where it stopped).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

import specframe


class FeatureCache:
    """`ids.npy` (B, T) int64, `features.f16` (B, T, H) float16 memmap, `progress.json` (blocks done)."""

    def __init__(self, directory: Path, blocks: np.ndarray | None = None, hidden: int | None = None):
        self.dir = Path(directory)
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
            np.save(ids_path, blocks)
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
        self.features = np.memmap(features, dtype=np.float16, mode="r+" if features.is_file() else "w+",
                                  shape=shape)  # (B, T, H)

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
        (self.dir / "progress.json").write_text(json.dumps({"done": self.done, "hidden": self.hidden}))

    def fill(self, target: specframe.Target, batch: int = 4, log=print,
             deadline: float | None = None) -> None:
        """Compute features for the blocks not done yet, `batch` blocks per forward pass."""
        t0, start = time.time(), self.done
        while self.done < len(self.ids) and (deadline is None or time.time() < deadline):
            rows = slice(self.done, min(self.done + batch, len(self.ids)))
            ids = torch.from_numpy(self.ids[rows]).to(target.device)  # (b, T)
            with torch.no_grad():
                out = target.model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
            self.features[rows] = out.hidden_states[-1].to(torch.float16).cpu().numpy()  # (b, T, H)
            self.features.flush()
            self.done = rows.stop
            self._write_progress()
            rate = (self.done - start) * self.ids.shape[1] / (time.time() - t0)
            log(f"features {self.done}/{len(self.ids)} blocks, {rate:.0f} tok/s")

    def batch(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, T) ids and (b, T, H) float32 features of the given block rows (all must be done)."""
        ids = torch.from_numpy(self.ids[rows])
        feats = torch.from_numpy(np.asarray(self.features[rows], dtype=np.float32))
        return ids, feats
