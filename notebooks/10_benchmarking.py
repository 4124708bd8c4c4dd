# ---
# jupyter:
#   execution:
#     timeout: 900
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: execution
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Benchmarking: `specframe bench`
#
# The harness runs methods (pipeline specs or presets) and the plain-decoding baseline on a prompt suite
# (Spec-Bench, MT-Bench, HumanEval, or your JSONL), checks at temperature 0 that every method's output
# equals the baseline's, and writes per-request records, a results table and plots. From the command line:
#
# ```bash
# specframe bench --suite humaneval --methods "pld,pld(matches=3)+trie" --limit 5 --repeats 3
# ```
#
# This notebook runs a deliberately tiny version (1 HumanEval prompt, 24 new tokens, one repeat) through
# the Python API, so it finishes in seconds; real measurements need more prompts and repeats.

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

import specframe
from specframe.bench.harness import run_benchmark

target = specframe.load_target("smollm2-135m")
workdir = tempfile.TemporaryDirectory(prefix="specframe-bench-")  # removed when the kernel exits
out = Path(workdir.name)
run, table = run_benchmark(target, "humaneval", ["pld", "pld(matches=3)+trie"], out, peers="none",
                           limit=1, repeats=1, max_new_tokens=24, plots=False, progress=False,
                           command="notebooks/10_benchmarking.py")
print(sorted(p.name for p in out.iterdir()))

# %% [markdown]
# ## The results table
#
# `results.md` has one table per category: every method against the baseline (speed-up with and without
# the prefill, tau, alpha, tokens/s) and the number of outputs that differed from plain decoding.

# %%
print((out / "results.md").read_text())
for category, methods in table.items():
    for method, stats in methods.items():
        assert stats["mismatches"] == 0, (category, method)  # greedy: identical to plain decoding

# %% [markdown]
# ## Per-request records
#
# `records.jsonl` keeps one line per (method, prompt, turn, repeat), with every metric of the request, so a
# run can be resumed and re-analysed. Here: mean tokens/s per method.

# %%
records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
print(len(records), "records; fields:", sorted(records[0]))
by_method: dict[str, list[float]] = {}
for r in records:
    by_method.setdefault(r["method"], []).append(r["metrics"]["tokens_per_s"])
names = list(by_method)
plt.bar(range(len(names)), [sum(v) / len(v) for v in by_method.values()])
plt.xticks(range(len(names)), names, rotation=20)
plt.ylabel("mean tokens/s per request")
plt.show()
