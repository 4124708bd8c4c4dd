"""Sharded REST datastores: build throughput and peak memory per worker with Ray, and retrieval latency.

Over the first `--max-documents` files of the `python-site` corpus (every Python file of the installed
packages, in path order; all of them by default), tokenized with `--model`'s tokenizer:

- baseline: the single-process build (`build_datastore`), run in a fresh subprocess so that its peak
  resident memory is the build's own, not this script's (which holds the model), first and again last
  (speedups are against the mean of both, so drift in the machine's load hits both sides); every file
  is read once before, so no build reads the corpus from disk;
- 1, 2 and 4 shards (`--shards`) built as Ray tasks on a local Ray instance of `--ray-cpus` CPUs, started
  once before the builds (its start-up is not timed); every task runs in a fresh worker process and
  reports that process's ru_maxrss and its build time (wall time less the worker's start and the
  driver's split, check and publish);
- retrieval: one `rest` drafting step (c = 8, k = 256, m = 10, n_max = 16) on `--contexts` contexts of 64
  tokens drawn from the corpus (no document boundary inside), the store of the most shards against the
  single store, interleaved context by context; median and p99 of the wall time per step;
- identical proposals: every context's proposal from both stores is compared. They must be identical
  when the longest match occurs at most k times (every occurrence is used by both); past k both draw a
  spread sample of k occurrences of the same match, and only the match length must agree.

    OMP_NUM_THREADS=1 python benchmarks/measure_sharded_datastore.py --max-documents 5000 \
        --out results/sharded-datastores

Writes `sharded_datastore.json` and `sharded_datastore.md` (the tables) under `--out`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from specframe_rest.build import build_datastore
from specframe_rest.distributed import TokenizerTarget, build_sharded_datastore
from specframe_rest.drafter import RestDrafter
from specframe_rest.retrieval import SuffixIndex
from specframe_rest.shards import open_store
from specframe_rest.sources import TextFiles, parse_source
from tqdm.auto import tqdm

import specframe
from specframe import DraftContext

K, C, CONTEXT = 256, 8, 64


def corpus(max_documents: int | None) -> TextFiles:
    """The python-site source, cut to its first `max_documents` files."""
    site = parse_source("python-site")
    files = site.files[:max_documents]
    return TextFiles(site.spec, site.kind, len(files), {**site.meta, "files": len(files)}, files)


def warm_page_cache(source: TextFiles) -> None:
    """Read every file once, so that no build pays for reading the corpus from disk (the first would)."""
    for file in tqdm(source.files, desc="reading the corpus once", unit="file"):
        file.read_bytes()


def baseline_build(out: Path, source: TextFiles, target: TokenizerTarget) -> dict:
    """The single-process build in this (fresh) process; its header records the process's peak memory."""
    return build_datastore(out, [source], target, progress=False)


def measure_baseline(out: Path, source: TextFiles, target: TokenizerTarget, when: str) -> dict:
    start = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        header = pool.submit(baseline_build, out, source, target).result()
    seconds = time.perf_counter() - start
    return {"config": f"single store, in-process ({when})", "shards": 1, "tokens": header["n_tokens"],
            "documents": header["n_documents"], "seconds": seconds,
            "worker_seconds": [header["build"]["seconds"]],
            "peak_memory_bytes": [header["build"]["peak_memory_bytes"]]}


def measure_sharded(out: Path, source: TextFiles, target, shards: int) -> dict:
    start = time.perf_counter()
    manifest = build_sharded_datastore(out, [source], target, shards=shards, ray="local", progress=False)
    seconds = time.perf_counter() - start
    label = f"{shards} shard{'s' if shards > 1 else ''}, Ray local"
    return {"config": label, "shards": shards, "tokens": manifest["n_tokens"],
            "documents": manifest["n_documents"], "seconds": seconds,
            "worker_seconds": [s["seconds"] for s in manifest["builds"][-1]["shards"]],
            "peak_memory_bytes": [s["peak_memory_bytes"] for s in manifest["builds"][-1]["shards"]]}


def draw_contexts(store_path: Path, count: int, seed: int = 0) -> list[np.ndarray]:
    """`count` windows of CONTEXT tokens from the store's corpus, none crossing a document boundary."""
    store = open_store(store_path)
    tokens = np.asarray(store.tokens)
    rng = np.random.default_rng(seed)
    found: list[np.ndarray] = []
    while len(found) < count:
        for end in rng.integers(CONTEXT + 1, len(tokens), 4 * count):
            window = tokens[end - CONTEXT : end].astype(np.int64)
            if not (window == store.separator).any():
                found.append(window)
                if len(found) == count:
                    break
    return found


def same_proposal(p, q) -> bool:
    return all(np.array_equal(getattr(p, f), getattr(q, f)) for f in ("tokens", "parents", "scores", "group"))


def measure_retrieval(target, single: Path, sharded: Path, contexts: list[np.ndarray]) -> dict:
    """Interleaved step latencies of both stores, and how many proposals are identical (by regime)."""
    one = RestDrafter(target, datastore=str(single), c=C, k=K)
    many = RestDrafter(target, datastore=str(sharded), c=C, k=K)
    exact_index = SuffixIndex.of(one.store)
    for context in contexts[: min(200, len(contexts))]:  # warm the page cache of both stores
        one.propose(DraftContext(context, 0, C))
        many.propose(DraftContext(context, 0, C))
    wall = {"single": [], "sharded": []}
    checks = {"exact": [0, 0], "sampled": [0, 0], "same_length": 0}
    for i, context in enumerate(tqdm(contexts, desc="retrieval", unit="context")):
        proposals, order = {}, [("single", one), ("sharded", many)]
        for name, drafter in order[::-1] if i % 2 else order:  # alternate who goes first
            start = time.perf_counter()
            proposals[name] = (drafter.propose(DraftContext(context, 0, C)), drafter.last_match_length)
            wall[name].append(time.perf_counter() - start)
        regime = "exact" if exact_index.longest_match(context[-16:], 16, K).count <= K else "sampled"
        checks[regime][0] += 1
        checks[regime][1] += same_proposal(proposals["single"][0], proposals["sharded"][0])
        checks["same_length"] += proposals["single"][1] == proposals["sharded"][1]
    latency = {name: {"median_ms": 1e3 * statistics.median(times),
                      "p99_ms": 1e3 * float(np.percentile(times, 99))} for name, times in wall.items()}
    return {"latency": latency, "contexts": len(contexts), "exact": checks["exact"],
            "sampled": checks["sampled"], "same_match_length": checks["same_length"]}


def markdown(result: dict) -> str:
    base = result["builds"][0]
    singles = [b["seconds"] for b in result["builds"] if b["config"].startswith("single")]
    reference = statistics.fmean(singles)  # the single build runs first and last: drift hits both
    lines = [
        f"Corpus: python-site, first {result['documents_used']} files: {base['tokens']:,} tokens in "
        f"{base['documents']:,} documents; tokenizer of {result['model']}; Ray local, "
        f"{result['ray_cpus']} CPUs.",
        "",
        "| build | shards | wall s | tokens/s | vs single | build s per worker | peak MiB per worker |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in result["builds"]:
        peaks = ", ".join(f"{p / 2**20:,.0f}" for p in b["peak_memory_bytes"])
        rate, speedup = b["tokens"] / b["seconds"], reference / b["seconds"]
        inside = ", ".join(f"{s:.1f}" for s in b["worker_seconds"])
        lines.append(f"| {b['config']} | {b['shards']} | {b['seconds']:.1f} | {rate:,.0f} | {speedup:.2f}x "
                     f"| {inside} | {peaks} |")
    r = result["retrieval"]
    lines += [
        "",
        f"Retrieval: one `rest` step (c = {C}, k = {K}, m = 10, n_max = 16) over {r['contexts']:,} contexts "
        f"of {CONTEXT} tokens drawn from the corpus, interleaved.",
        "",
        "| store | median ms | p99 ms |",
        "|---|---|---|",
    ]
    for name, label in (("single", "single store"), ("sharded", f"{result['retrieval_shards']} shards")):
        latency = r["latency"][name]
        lines.append(f"| {label} | {latency['median_ms']:.3f} | {latency['p99_ms']:.3f} |")
    (exact_n, exact_same), (sampled_n, sampled_same) = r["exact"], r["sampled"]
    lines += [
        "",
        f"Identical proposals: {exact_same:,} of {exact_n:,} contexts whose longest match occurs at most "
        f"k = {K} times (all must be); {sampled_same:,} of {sampled_n:,} past k (sampled: not required). "
        f"Same longest match length: {r['same_match_length']:,} of {r['contexts']:,}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="model whose tokenizer builds the stores")
    parser.add_argument("--max-documents", type=int, default=None, help="first N python-site files (all)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4], help="shard counts to build")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument("--contexts", type=int, default=3000, help="contexts for the retrieval latency")
    parser.add_argument("--workdir", type=Path, default=None, help="where to build (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=Path("results/sharded-datastores"))
    args = parser.parse_args()

    import ray

    target = specframe.load_target(args.model)
    source = corpus(args.max_documents)
    warm_page_cache(source)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sharded-datastores-"))
    workdir.mkdir(parents=True, exist_ok=True)
    builds = []
    with tqdm(total=len(args.shards) + 2, desc="builds", unit="build") as bar:
        bar.set_postfix(now="single")
        builds.append(measure_baseline(workdir / "single", source, TokenizerTarget.of(target), "first"))
        bar.update(1)
        ray.init(address="local", num_cpus=args.ray_cpus, include_dashboard=False, logging_level="WARNING")
        try:
            for n in args.shards:
                bar.set_postfix(now=f"{n} shards")
                builds.append(measure_sharded(workdir / f"shards-{n}", source, target, n))
                bar.update(1)
        finally:
            ray.shutdown()
        bar.set_postfix(now="single again")
        builds.append(measure_baseline(workdir / "single-again", source, TokenizerTarget.of(target), "last"))
        bar.update(1)
    most = max(args.shards)
    contexts = draw_contexts(workdir / "single", args.contexts)
    retrieval = measure_retrieval(target, workdir / "single", workdir / f"shards-{most}", contexts)
    result = {"model": args.model, "documents_used": len(source.files), "ray_cpus": args.ray_cpus,
              "builds": builds, "retrieval_shards": most, "retrieval": retrieval}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sharded_datastore.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    (args.out / "sharded_datastore.md").write_text(table)
    print(table)
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
