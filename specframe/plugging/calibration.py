"""Measuring what a verification step costs for one target, backend, device, dtype and thread count.

`calibrate` prefills a synthetic prompt and times `backend.score` on flat trees of a grid of sizes and on
chains of a coarser one (`CHAIN_SIZES`), round-robin over them so that a drift of the machine spreads over
all of them, keeping the fastest of five rounds of each; then again after a longer prompt, which gives
each size's slope in the context length (a tree's nodes attend to every cached token). The fastest round,
because on a shared machine timing noise only ever adds time (another process, an interrupt), so the
minimum is the stablest estimate of what a size costs, and the decoder scales it to what its real steps
take (the speed the adaptive planner learns; see "Why the fastest of five" in
docs/explanation/adaptive-speculation.md). Chains are timed at `CHAIN_SIZES` and the slopes on flat trees
at `SLOPE_SIZES` only: about 130 forwards (docs/explanation/adaptive-speculation.md says what that takes).
`cached_cost` returns a stored calibration for the same keys, measuring one when there is none (announced
in one line with its expected time; a progress bar only on a terminal); `specframe calibrate` refreshes it.

What is stored reaches a backend only when it is built: `build_calibrated` hands a backend the calibration
stored for its keys (`specframe.contract.calibration.Calibration`), and `measure_cost` measures on backends
built for measuring (`Build`), handing each the padding it is to run with, so no backend is changed after it
is built. `specframe.plugging.pipeline.calibrate_pipeline` is where a calibration measured after assembly
reaches a pipeline.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from specframe.support.atomic_dirs import FILE_LOCK_WAIT, file_lock, locked_update, write_atomically
from specframe.terms.cost import MeasuredCost
from specframe.runtime.devices import CPU_MIN_ROWS, padded_rows, synchronizer
from specframe.terms.errors import ConfigurationError, io_failure
from specframe.contract.calibration import Calibration
from specframe.contract.interfaces import StateBackend
from specframe.runtime.packed_linear import linear_kernel
from specframe.support.progress import bar
from specframe.terms.tree import TokenTree

SIZES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
PROMPT_TOKENS = 256  # a typical prompt plus part of an answer: the cache the tree attends to
LONG_PROMPT_TOKENS = 1024  # a long one (RAG, summaries): the second point of each size's context slope
ROUNDS = 5
# Where chains are timed: a chain of 0 or 1 node is the flat tree of that size, and what a chain saves
# next to a flat tree (its mask) changes smoothly with the size, while the row count's kernel jumps hit both.
CHAIN_SIZES = (2, 4, 8, 16, 32)
SLOPE_SIZES = (0, 2, 8, 16, 32)  # where the context slope is measured: it grows smoothly with the nodes
# Part of `cost_key`, so of the file name: raised whenever what a calibration measures or stores changes
# (sizes, rounds, slopes, padding), so that a stored calibration of another kind is measured again.
FORMAT = 9
# Builds the backend being calibrated, handed a calibration (None: none), the same way each time: the
# backend of a pipeline as `assemble` builds it (`specframe.plugging.pipeline.Pipeline.build_backend`).
Build = Callable[[Calibration | None], StateBackend]


def calibrate(backend: StateBackend, sizes=SIZES, rounds: int = ROUNDS, progress: bool = True,
              seed: int = 0, padding_s: tuple[float, ...] = ()) -> MeasuredCost:
    """Time `backend.score` on flat trees and chains of every size in `sizes`, the fastest of `rounds`,
    after a prompt of `PROMPT_TOKENS` and again after one of `LONG_PROMPT_TOKENS` (when the model's
    context holds it) for the slopes in the context length. Slopes come out at least 0 and non-decreasing
    in size: attention's work never shrinks as the context or the tree grows, so anything else is noise.

    The backend is measured as it runs, at the rows it pads forwards to (its `min_rows`, stored with the
    costs); `padding_s` are the probe's timings (`probe_padding`) that chose them where the backend left
    its padding to measurement (`measure_cost`), stored beside them.

    Leaves the backend prefilled with a synthetic prompt: prefill again before decoding.
    """
    measured = {"min_rows": getattr(backend, "min_rows", 1), "padding_s": tuple(padding_s)}
    prompts = sorted({prompt_room(backend.target, sizes, n) for n in (PROMPT_TOKENS, LONG_PROMPT_TOKENS)})
    chains = chain_sizes(sizes)
    keys = [(n, "flat") for n in sizes] + [(n, "chain") for n in chains]
    times = round_times(backend, keys, rounds, progress=progress, seed=seed, prompt_tokens=prompts[0])
    fastest = {key: float(np.min(t)) for key, t in times.items()}
    flat = tuple(fastest[(n, "flat")] for n in sizes)
    chain = chain_times(sizes, flat, {n: fastest[(n, "chain")] for n in chains})
    context = prompts[0] + 1  # the cached prompt and the tree's root
    if len(prompts) == 1:
        return MeasuredCost(tuple(sizes), flat, chain, context, **measured)
    # The slopes: flat trees only, at fewer sizes, interpolated between them. A tree's nodes attend to the
    # context whatever its shape (stored calibrations measured chain and flat slopes alike within noise),
    # and the slope grows smoothly with the nodes; this halves the calibration's time.
    grid = slope_sizes(sizes)
    far = round_times(backend, [(n, "flat") for n in grid], rounds, progress=progress, seed=seed,
                      prompt_tokens=prompts[1])
    span = prompts[1] - prompts[0]
    at_grid = [max((float(np.min(far[(n, "flat")])) - fastest[(n, "flat")]) / span, 0.0) for n in grid]
    slope = non_decreasing(np.interp(sizes, grid, at_grid).tolist())
    return MeasuredCost(tuple(sizes), flat, chain, context, slope, slope, **measured)


def slope_sizes(sizes) -> tuple[int, ...]:
    """The sizes among `sizes` whose context slope `calibrate` measures: `SLOPE_SIZES`, and the ends."""
    return tuple(n for n in sizes if n in SLOPE_SIZES or n in (min(sizes), max(sizes)))


def chain_sizes(sizes) -> tuple[int, ...]:
    """The sizes among `sizes` at which `calibrate` times chains: `CHAIN_SIZES` and the largest, past 1."""
    return tuple(n for n in sizes if n > 1 and (n in CHAIN_SIZES or n == max(sizes)))


def chain_times(sizes, flat: tuple[float, ...], measured: dict[int, float]) -> tuple[float, ...]:
    """Chain seconds at every size: measured where timed, elsewhere the flat tree's time scaled by the
    chain-to-flat ratio interpolated between the timed sizes (1 at 0 and 1 node, where both are one tree)."""
    flat_at = dict(zip(sizes, flat))
    points = {n: 1.0 for n in sizes if n <= 1} | {n: t / flat_at[n] for n, t in measured.items()}
    grid = sorted(points)
    ratio = np.interp(sizes, grid, [points[n] for n in grid])  # (len(sizes),)
    return tuple(measured.get(n, f * r) for n, f, r in zip(sizes, flat, ratio.tolist()))


def expected_seconds(backend: StateBackend, sizes=SIZES, rounds: int = ROUNDS) -> float:
    """About how long `calibrate` takes: its forwards, priced by timing a plain step and the largest tree
    once each (after a warm-up) and interpolating between them by size."""
    target = backend.target
    room = prompt_room(target, sizes, PROMPT_TOKENS)
    ids = np.random.default_rng(0).integers(0, target.vocab_size, room + 1)
    backend.prefill(ids.tolist())
    small, large = probe_tree(min(sizes), "flat", ids), probe_tree(max(sizes), "flat", ids)
    backend.score(large)
    seconds = []
    for tree in (small, large):
        start = time.perf_counter()
        backend.score(tree)
        seconds.append(time.perf_counter() - start)
    priced = [np.interp(grid, [min(sizes), max(sizes)], seconds).sum()
              for grid in (sizes, chain_sizes(sizes), slope_sizes(sizes))]
    return rounds * float(priced[0] + priced[1] + 1.3 * priced[2])  # the longer context: dearer


def probe_padding(alone: StateBackend, padded: StateBackend, rounds: int = ROUNDS,
                  seed: int = 0) -> tuple[float, float]:
    """Seconds of a plain step (the root alone) after a prompt of `PROMPT_TOKENS` on two backends built
    alike but for their padding (`measure_cost` hands them `Calibration(min_rows=1)` and
    `Calibration(min_rows=CPU_MIN_ROWS)`), alternately, the fastest of `rounds` each after a warm-up:
    (alone, padded). The caller chooses (`padded_rows`)."""
    target = alone.target
    room = prompt_room(target, (getattr(padded, "min_rows", CPU_MIN_ROWS),), PROMPT_TOKENS)
    ids = np.random.default_rng(seed).integers(0, target.vocab_size, room + 1)
    plain = probe_tree(0, "flat", ids)
    sync = synchronizer(target.device) or (lambda: None)
    times: list[list[float]] = [[], []]
    for backend in (alone, padded):
        backend.prefill(ids.tolist())
    for _ in range(rounds + 1):  # the first round warms up
        for backend, seconds in zip((alone, padded), times):
            sync()
            start = time.perf_counter()
            backend.score(plain)
            sync()
            seconds.append(time.perf_counter() - start)
    return min(times[0][1:]), min(times[1][1:])


def non_decreasing(values: list[float]) -> tuple[float, ...]:
    """The least-squares non-decreasing fit (pool adjacent violators). A larger tree never does less
    attention per context token than a smaller one, so a slope below a smaller tree's is timing noise,
    and left alone it could make a plain step look dearer next to a tree as the context grows."""
    blocks: list[list[float]] = []  # [mean, count], means increasing
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return tuple(m for m, n in blocks for _ in range(int(n)))


def round_times(backend: StateBackend, keys, rounds: int = ROUNDS, progress: bool = True, seed: int = 0,
                prompt_tokens: int = PROMPT_TOKENS) -> dict[tuple[int, str], list[float]]:
    """Seconds of `backend.score` per round for each (size, shape) of `keys` after a synthetic prompt of
    `prompt_tokens` (fewer where the model's context is shorter), timed round-robin over the keys so
    that a drift of the machine spreads over all of them (`calibrate` keeps the fastest)."""
    target = backend.target
    room = prompt_room(target, [n for n, _ in keys], prompt_tokens)
    ids = np.random.default_rng(seed).integers(0, target.vocab_size, room + 1)
    backend.prefill(ids.tolist())
    trees = {(n, shape): probe_tree(n, shape, ids) for n, shape in keys}
    for key in (max(trees), min(trees)):  # warm up kernels and caches on the largest and smallest tree
        backend.score(trees[key])
    times: dict[tuple[int, str], list[float]] = {key: [] for key in trees}
    sync = synchronizer(target.device) or (lambda: None)  # CUDA and MPS queue work: wait for it
    steps = bar(total=rounds * len(trees), desc=f"calibrating step cost ({room} cached tokens)",
                show=progress, unit="forward", leave=False)
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


def prompt_room(target, sizes, prompt_tokens: int) -> int:
    """`prompt_tokens`, or fewer where the model's context must still hold the largest tree after them."""
    return max(1, min(prompt_tokens, target.max_context - max(sizes) - 2))


def probe_tree(n: int, shape: str, ids: np.ndarray) -> TokenTree:
    """A chain or a flat tree (every node a child of the root) of `n` nodes, tokens from `ids`."""
    tokens = ids[-n:] if n else ids[:0]
    parents = np.arange(n) - 1 if shape == "chain" else np.full(n, -1)
    return TokenTree(tokens, parents)


def cost_key(backend: StateBackend) -> dict:
    """What a calibration depends on; its hash names the cache file."""
    target, model = backend.target, backend.target.model
    params = sum(p.numel() for p in model.parameters())
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    return {"format": FORMAT, "model": target.name, "parameters": params,
            "config": hashlib.sha256(config.encode()).hexdigest()[:16],
            "backend": backend.name, "options": sorted(backend.cost_options().items()),
            "device": str(target.device), "dtype": str(next(model.parameters()).dtype),
            "linear": linear_kernel(model), "attention": getattr(model.config, "_attn_implementation", None),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "machine": f"{platform.machine()} {platform.processor()}".strip()}


def cost_path(key: dict) -> Path:
    from specframe.support.paths import specframe_home

    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return specframe_home() / "costs" / f"{key['backend']}-{digest}.json"


def cached_cost(backend: StateBackend, build: Build | None = None, refresh: bool = False,
                progress: bool = True) -> MeasuredCost:
    """The calibration stored for the keys of `backend`, measured and stored first when missing, damaged
    or `refresh` is set: on backends `build` makes as `backend` was made (`measure_cost`). A store that
    cannot be written only costs a recalibration next time.

    Without `build` (a backend not built by `assemble`) it is measured on `backend` as it runs, its
    padding not probed, and stored only where the backend does not leave its padding to measurement:
    stored, it would stand for a probe's choice that was never made."""
    key = cost_key(backend)
    path = cost_path(key)
    if not refresh:
        cost = read_cost(path, key)
        if cost is not None:
            return cost
    if build is None:
        cost = measure_cost(lambda calibration: backend, progress, probe=False)
        if not backend.pads_by_measurement():
            store_cost(path, key, cost)
        return cost
    cost = measure_cost(build, progress)
    store_cost(path, key, cost)
    return cost


def measure_cost(build: Build, progress: bool = True, probe: bool = True, sizes=SIZES,
                 rounds: int = ROUNDS) -> MeasuredCost:
    """`calibrate` a backend from `build` (at `sizes`, the fastest of `rounds`), announced on stderr in one
    line with its expected time where `progress`. Where that backend leaves its padding to measurement
    (`StateBackend.pads_by_measurement`) and `probe` is set, a plain step is first timed on a backend
    built unpadded and on one built padded (`probe_padding`), and the costs are measured on one built with
    the rows chosen (`padded_rows`): as the backends handed this calibration will run."""
    backend = build(None)
    if progress:
        print(f"calibrating step cost for {backend.target.name} on {backend.name} (once per machine/model, "
              f"~{expected_seconds(backend):.0f} s)", file=sys.stderr, flush=True)
    if not (probe and backend.pads_by_measurement()):
        return calibrate(backend, sizes, rounds, progress)
    del backend  # the probe's two backends and the measured one take its place
    padding = probe_padding(build(Calibration(min_rows=1)), build(Calibration(min_rows=CPU_MIN_ROWS)),
                            rounds=rounds)
    chosen = build(Calibration(min_rows=padded_rows(*padding, CPU_MIN_ROWS)))
    return calibrate(chosen, sizes, rounds, progress, padding_s=padding)


def store_cost(path: Path, key: dict, cost: MeasuredCost) -> str | None:
    """`write_cost`, reporting instead of raising: None once stored, else why it could not be, in words."""
    try:
        write_cost(path, key, cost)
    except OSError as err:
        return io_failure(err, "set SPECFRAME_HOME to a writable directory")
    except ConfigurationError as err:  # the file stayed locked by another process
        return str(err)
    return None


def write_cost(path: Path, key: dict, cost: MeasuredCost) -> None:
    """Store `cost` under `key` at `path`, atomically (a reader sees the old file or the new one), under
    the file's lock, which also clears the temporary files of killed writes. Two processes calibrating
    the same keys measured the same thing: the last one's numbers are kept."""
    def busy() -> ConfigurationError:
        return ConfigurationError(f"calibration {path} stayed locked by another process for "
                                  f"{FILE_LOCK_WAIT:g} s ({file_lock(path)}); if no specframe process is "
                                  "running, delete that lock file")

    with locked_update(path, busy, f"calibration '{path}'"):
        write_atomically(path, json.dumps({"key": key, **asdict(cost)}, indent=1, default=str))


def stored_cost(backend: StateBackend) -> MeasuredCost | None:
    """The stored calibration for the keys of `backend`, or None: never measures."""
    key = cost_key(backend)
    return read_cost(cost_path(key), key)


def build_calibrated(build: Build) -> StateBackend:
    """The backend `build` makes, handed the calibration stored for it (`Calibration.of`), if any. The
    store is keyed by what the built backend says of itself (`cost_key`: its target, name and
    `cost_options`), so it is built once without a calibration to read its keys, and where one is stored
    built again with it: the backend built first is then dropped, never changed."""
    backend = build(None)
    calibration = Calibration.of(stored_cost(backend))
    return backend if calibration == Calibration() else build(calibration)


def plausible(cost: MeasuredCost) -> bool:
    """Whether a stored calibration holds what `calibrate` measures: sizes increasing from 0, and times,
    slopes and the context finite and not negative (a hand-edited or damaged file is measured again)."""
    times = (*cost.flat_s, *cost.chain_s, *cost.flat_slope, *cost.chain_slope, *cost.padding_s)
    return (bool(cost.sizes) and cost.sizes[0] == 0 and all(a < b for a, b in zip(cost.sizes, cost.sizes[1:]))
            and all(math.isfinite(t) and t >= 0 for t in times) and cost.context >= 0)


def read_cost(path: Path, key: dict | None = None) -> MeasuredCost | None:
    """The calibration stored at `path`, or None where it is missing or damaged, or, given `key`, was
    measured for other keys (another model, thread count, kernel, ...)."""
    try:
        data = json.loads(path.read_text())
        if key is not None and json.loads(json.dumps(key, default=str)) != data["key"]:
            return None
        floats = {name: tuple(float(t) for t in data[name])
                  for name in ("flat_s", "chain_s", "flat_slope", "chain_slope")}
        padding = {"min_rows": int(data.get("min_rows", 1)),
                   "padding_s": tuple(float(t) for t in data.get("padding_s", ()))}
        cost = MeasuredCost(tuple(int(n) for n in data["sizes"]), context=int(data["context"]), **floats,
                            **padding)
    except (OSError, ValueError, KeyError, TypeError, ArithmeticError, RecursionError):
        return None  # ArithmeticError: a number too large for a float; RecursionError: nesting too deep
    if not plausible(cost):
        return None
    n = len(cost.sizes)
    if n < 2 or len(cost.flat_s) != n or len(cost.chain_s) != n:
        return None
    if len(cost.flat_slope) != len(cost.chain_slope) or len(cost.flat_slope) not in (0, n):
        return None
    if cost.padding_s and (len(cost.padding_s) != 2 or cost.min_rows not in (1, CPU_MIN_ROWS)):
        return None  # a padding choice is 1 or CPU_MIN_ROWS rows, from two timings (`probe_padding`)
    if cost.min_rows < 1:
        return None
    return cost
