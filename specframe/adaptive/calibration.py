"""Measuring what a verification step costs for one target, backend, device, dtype and thread count.

`calibrate` prefills a synthetic prompt and times `backend.score` on flat trees and chains of a grid of
sizes, round-robin over the sizes so that a drift of the machine spreads over all of them, keeping the
fastest of five rounds of each: on a shared machine timing noise only ever adds time (another process,
an interrupt), so the minimum is the stablest estimate of what a size costs, and the decoder scales it
to what its real steps take (the speed the adaptive planner learns; see "Why the fastest of five" in
docs/explanation/adaptive-speculation.md). `cached_cost` returns a stored calibration for the same keys,
measuring one (about 15 s on the development CPU, with progress) when there is none; `specframe
calibrate` refreshes it.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from specframe.cost import MeasuredCost
from specframe.devices import synchronizer
from specframe.interfaces import StateBackend
from specframe.packed_linear import linear_kernel
from specframe.tree import TokenTree

SIZES = (0, 1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32)
PROMPT_TOKENS = 256  # a typical prompt plus part of an answer: the cache the tree attends to
ROUNDS = 5
FORMAT = 5  # 2: kv pads small trees to 4 rows on CPU; 3: the key holds the linear kernel and backend options;
# 4: and the attention implementation; 5: the fastest of 5 rounds (was the median of 3)


def calibrate(backend: StateBackend, sizes=SIZES, rounds: int = ROUNDS, progress: bool = True,
              seed: int = 0) -> MeasuredCost:
    """Time `backend.score` on flat trees and chains of every size in `sizes`; the fastest of `rounds`.

    Leaves the backend prefilled with a synthetic prompt: prefill again before decoding.
    """
    times = round_times(backend, sizes, rounds, progress=progress, seed=seed)
    fastest = {key: float(np.min(t)) for key, t in times.items()}
    return MeasuredCost(tuple(sizes), tuple(fastest[(n, "flat")] for n in sizes),
                        tuple(fastest[(n, "chain")] for n in sizes))


def round_times(backend: StateBackend, sizes=SIZES, rounds: int = ROUNDS, shapes=("flat", "chain"),
                progress: bool = True, seed: int = 0) -> dict[tuple[int, str], list[float]]:
    """Seconds of `backend.score` per round for each (size, shape), timed round-robin over the sizes so
    that a drift of the machine spreads over all of them (`calibrate` keeps the fastest)."""
    target = backend.target
    room = max(1, min(PROMPT_TOKENS, target.max_context - max(sizes) - 2))
    ids = np.random.default_rng(seed).integers(0, target.vocab_size, room + 1)
    backend.prefill(ids.tolist())
    trees = {(n, shape): probe_tree(n, shape, ids) for n in sizes for shape in shapes}
    for tree in (trees[(max(sizes), shapes[0])], trees[(1, shapes[-1])]):  # warm up kernels and caches
        backend.score(tree)
    times: dict[tuple[int, str], list[float]] = {key: [] for key in trees}
    sync = synchronizer(target.device) or (lambda: None)  # CUDA and MPS queue work: wait for it
    steps = tqdm(total=rounds * len(trees), desc="calibrating step cost", disable=not progress,
                 unit="forward", leave=False)
    for _ in range(rounds):
        for key, tree in trees.items():
            sync()
            start = time.perf_counter()
            backend.score(tree)
            sync()
            times[key].append(time.perf_counter() - start)
            steps.update()
    steps.close()
    return times


def probe_tree(n: int, shape: str, ids: np.ndarray) -> TokenTree:
    """A chain or a flat tree (every node a child of the root) of `n` nodes, tokens from `ids`."""
    tokens = ids[-n:] if n else ids[:0]
    parents = np.arange(n) - 1 if shape == "chain" else np.full(n, -1)
    return TokenTree(tokens, parents)


def cost_key(backend: StateBackend, options: dict | None = None) -> dict:
    """What a calibration depends on; its hash names the cache file."""
    target, model = backend.target, backend.target.model
    params = sum(p.numel() for p in model.parameters())
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    return {"format": FORMAT, "model": target.name, "parameters": params,
            "config": hashlib.sha256(config.encode()).hexdigest()[:16],
            "backend": backend.name, "options": sorted({**backend.cost_options(), **(options or {})}.items()),
            "device": str(target.device), "dtype": str(next(model.parameters()).dtype),
            "linear": linear_kernel(model), "attention": getattr(model.config, "_attn_implementation", None),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "machine": f"{platform.machine()} {platform.processor()}".strip()}


def cost_path(key: dict) -> Path:
    from specframe.models import specframe_home

    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return specframe_home() / "costs" / f"{key['backend']}-{digest}.json"


def cached_cost(backend: StateBackend, options: dict | None = None, refresh: bool = False,
                progress: bool = True) -> MeasuredCost:
    """The stored calibration for this backend's keys, measured and stored first when missing,
    damaged or `refresh` is set. A store that cannot be written only costs a recalibration next time."""
    key = cost_key(backend, options)
    path = cost_path(key)
    if not refresh:
        cost = _read(path, key)
        if cost is not None:
            return cost
    cost = calibrate(backend, progress=progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.time_ns()}.tmp")
        tmp.write_text(json.dumps({"key": key, "sizes": cost.sizes, "flat_s": cost.flat_s,
                                   "chain_s": cost.chain_s}, indent=1, default=str))
        tmp.replace(path)
    except OSError:
        pass
    return cost


def stored_cost(backend: StateBackend, options: dict | None = None) -> MeasuredCost | None:
    """The stored calibration for this backend's keys, or None: never measures."""
    key = cost_key(backend, options)
    return _read(cost_path(key), key)


def _read(path: Path, key: dict) -> MeasuredCost | None:
    try:
        data = json.loads(path.read_text())
        if json.loads(json.dumps(key, default=str)) != data["key"]:
            return None
        cost = MeasuredCost(tuple(int(n) for n in data["sizes"]), tuple(float(t) for t in data["flat_s"]),
                            tuple(float(t) for t in data["chain_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(cost.sizes) < 2 or not (len(cost.sizes) == len(cost.flat_s) == len(cost.chain_s)):
        return None
    return cost
