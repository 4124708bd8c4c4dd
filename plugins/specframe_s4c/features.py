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
            self.ids = np.load(ids_path)
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
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"done": 0, "hidden": hidden}
        self.hidden = int(meta["hidden"])
        self.done = int(meta["done"])
        mode = "r+" if (self.dir / "features.f16").is_file() else "w+"
        self.features = np.memmap(self.dir / "features.f16", dtype=np.float16, mode=mode,
                                  shape=(*self.ids.shape, self.hidden))  # (B, T, H)

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
