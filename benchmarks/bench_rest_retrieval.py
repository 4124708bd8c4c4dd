"""Latency of one REST drafting step (longest match + continuations + trie + top-c) by datastore size.

Datastores of 10^5, 10^6 and 10^7 tokens are cut from the cached `python-site` datastore (whole documents;
built with `specframe datastore build --source python-site --out python-site`), plus the full store; without
it, from the tokenized standard library. Queries are contexts from `argparse.py` at fixed positions.

    pytest benchmarks/bench_rest_retrieval.py --benchmark-only
    python benchmarks/bench_rest_retrieval.py   # median and p99 over 2000 steps per size
"""

from __future__ import annotations

import itertools
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from specframe_corpus.build import build_datastore
from specframe_corpus.source_specs import parse_source
from specframe_corpus.sources import TokenDocuments
from specframe_corpus.stores import resolve_datastore
from specframe_rest.drafter import RestDrafter

import specframe
from specframe import DraftContext

SIZES = (10**5, 10**6, 10**7)


def corpus_documents(target, store_path: Path | None, size: int) -> list[np.ndarray]:
    """Whole documents of the python-site store (else the tokenized stdlib), about `size` tokens in all."""
    if store_path is not None:
        from specframe_corpus.datastore import Datastore

        tokens = np.asarray(Datastore.open(store_path).tokens[: size + 1]).astype(np.int64)
        sep = target.vocab_size
        cuts = np.flatnonzero(tokens == sep)
        pieces = np.split(tokens[: cuts[-1]], cuts[:-1])  # each piece: a separator, then one document
        return [piece[1:] for piece in pieces if len(piece) > 1]
    docs, total = [], 0
    for batch, _ in parse_source("python-stdlib").batches():
        for text in batch:
            ids = np.array(target.tokenizer(text, add_special_tokens=False)["input_ids"])
            docs.append(ids)
            total += len(ids)
            if total >= size:
                return docs
    return docs


_TMP_DIR = tempfile.TemporaryDirectory(prefix="bench-rest-")  # removed when the process exits


def stores(target) -> dict[str, Path]:
    """size label -> datastore directory (built in a temporary directory, full python-site reused)."""
    cached = resolve_datastore("python-site")
    cached = cached if cached is not None and cached.exists() else None
    tmp = Path(_TMP_DIR.name)
    result = {}
    for size in SIZES if cached else SIZES[:2]:
        out = tmp / f"{size}"
        build_datastore(
            out,
            [TokenDocuments(f"{size} tokens", "ids", documents=corpus_documents(target, cached, size))],
            target,
            progress=False,
        )
        result[f"{size:.0e}"] = out
    if cached:
        result["python-site"] = cached
    return result


def queries(target, count: int = 256) -> list[np.ndarray]:
    text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    ids = np.array(target.tokenizer(text, add_special_tokens=False)["input_ids"])
    positions = np.random.default_rng(0).integers(64, len(ids), count)
    return [ids[p - 64 : p] for p in positions]


@pytest.fixture(scope="module")
def setup():
    target = specframe.load_target("smollm2-135m")
    return target, stores(target), queries(target)


@pytest.mark.parametrize("c", [8, 64])
@pytest.mark.parametrize("size", [f"{s:.0e}" for s in SIZES] + ["python-site"])
def test_rest_step_latency(benchmark, setup, size, c):
    target, paths, contexts = setup
    if size not in paths:
        pytest.skip(f"datastore {size} needs the cached python-site store")
    drafter = RestDrafter(target, datastore=str(paths[size]), c=c)
    cycle = itertools.cycle(contexts)
    benchmark.extra_info["tokens"] = drafter.store.header["n_tokens"]
    benchmark(lambda: drafter.propose(DraftContext(next(cycle), 0, c)))


def main() -> None:
    target = specframe.load_target("smollm2-135m")
    contexts = queries(target, 2000)
    print(f"{'datastore':>12} {'tokens':>12} {'c':>3} {'median ms':>10} {'p99 ms':>8} {'cpu p99 ms':>10}")
    for label, path in stores(target).items():
        for c in (8, 64):
            drafter = RestDrafter(target, datastore=str(path), c=c)
            wall, cpu = [], []
            for context in contexts:
                w, t = time.perf_counter(), time.thread_time()
                drafter.propose(DraftContext(context, 0, c))
                cpu.append(time.thread_time() - t)
                wall.append(time.perf_counter() - w)
            wall_ms, cpu_ms = 1e3 * np.array(wall), 1e3 * np.array(cpu)
            print(
                f"{label:>12} {drafter.store.header['n_tokens']:>12,} {c:>3} {np.median(wall_ms):>10.3f} "
                f"{np.percentile(wall_ms, 99):>8.3f} {np.percentile(cpu_ms, 99):>10.3f}"
            )


if __name__ == "__main__":
    main()
