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
# # Drafter: REST, retrieval from a datastore (`rest`)
#
# REST (He et al., 2023) drafts by retrieval from a corpus: it finds the longest suffix of the text so far
# in a suffix array over the corpus, collects what followed its occurrences, merges those continuations
# into a frequency-weighted trie and proposes the best nodes. Here we build a small datastore from a few
# standard-library packages, look at what it retrieves, and decode with it.

# %%
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

import specframe
from specframe import DraftContext

target = specframe.load_target("smollm2-135m")
tok = target.tokenizer

# %% [markdown]
# ## Build a datastore
#
# `specframe datastore build` builds one from directories, files or the target's own answers. The datastore
# records the tokenizer it was built with; opening it with a different tokenizer is refused.

# %%
stdlib = Path(sysconfig.get_paths()["stdlib"])
sources = [arg for package in ("json", "collections", "email") for arg in ("--source", str(stdlib / package))]
tmp = tempfile.TemporaryDirectory(prefix="specframe-rest-")  # removed when the kernel exits
workdir = Path(tmp.name)
start = time.perf_counter()
subprocess.run([sys.executable, "-m", "specframe.cli", "datastore", "build", *sources, "--glob", "*.py",
                "--out", str(workdir / "stdlib-small"), "--model", target.name], check=True)
print(f"built in {time.perf_counter() - start:.1f} s")
store = str(workdir / "stdlib-small")
info = subprocess.run([sys.executable, "-m", "specframe.cli", "datastore", "info", store, "--json"],
                      check=True, capture_output=True, text=True).stdout
print({k: v for k, v in json.loads(info).items() if not isinstance(v, (dict, list))})

# %% [markdown]
# ## What it retrieves

# %%
REST = specframe.get_registry().get("drafter", "rest")
drafter = REST(target, datastore=str(workdir / "stdlib-small"))
text = "import json\n\n\ndef dumps(obj):\n    return json.dumps(obj, indent="
ids = np.array(tok(text)["input_ids"])
proposal = drafter.propose(DraftContext(ids, prompt_len=len(ids), budget=8))
print(f"longest match: {drafter.last_match_length} tokens; {len(proposal)} proposed nodes")
for i in range(len(proposal)):
    print(f"  node {i} parent {proposal.parents[i]:2d} weight {proposal.scores[i]:.2f} "
          f"{tok.decode([proposal.tokens[i]])!r}")

# %% [markdown]
# ## Decode with it
#
# `rest(live=1)` also retrieves from the prompt and the output so far, like prompt lookup, merged into the
# same trie. `trie` keeps the best-weighted nodes. Greedy verification keeps the output identical to plain
# decoding.

# %%
prompt = "import json\n\n\nclass JSONEncoder(object):\n    def default(self, o):\n"
store = str(workdir / "stdlib-small")
runs = {"none": ("none", "chain"), "rest": (f"rest(datastore='{store}')", "trie"),
        "rest + live": (f"rest(datastore='{store}', live=1)", "trie")}
results = {}
for label, (drafter_spec, tree) in runs.items():
    decoder = specframe.SpeculativeDecoder.from_names(target, drafter=drafter_spec, tree=tree, budget=8)
    results[label] = decoder.generate(prompt, max_new_tokens=32)
print(results["rest"].text)
for label, r in results.items():
    assert r.tokens == results["none"].tokens, label
    print(f"{label:12} steps={r.metrics.steps:3d} tau={r.metrics.tau:.2f} alpha={r.metrics.alpha:.2f}")
