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
# # Drafters with heads on the target's features: S4C (`s4c`) and EAGLE (`eagle`)
#
# S4C (He et al.) drafts with small heads that read the target's last hidden feature: head 1 predicts the
# token after the root, head k the token k steps ahead, each also predicting the feature the next head
# reads. The drafter expands the top tokens of each head into a candidate forest with real draft
# probabilities, which `static(preset=continuous)`, `beam` or `dynamic` then cut into a tree.
#
# Heads must be trained for each target: `specframe train s4c`. This notebook trains deliberately tiny
# heads for a few seconds (2048 tokens of standard-library code, 10 steps), so it shows the workflow, not
# the acceptance that properly trained heads reach.

# %%
import subprocess
import sys
import tempfile
from pathlib import Path


import specframe

target = specframe.load_target("smollm2-135m")
S4C = specframe.get_registry().get("drafter", "s4c")
print(S4C.capabilities)

# %% [markdown]
# ## Train tiny heads
#
# The command computes the frozen target's features for the corpus once (resumable), then trains the
# heads with the paper's loss and writes `heads.safetensors`.

# %%
workdir = tempfile.TemporaryDirectory(prefix="specframe-s4c-")  # removed when the kernel exits
run = Path(workdir.name)
command = [sys.executable, "-c", "from specframe.cli import main; main()", "train", "s4c",
           "--data", "python-stdlib:4", "--max-tokens", "2048", "--block", "64", "--batch", "4",
           "--steps", "10", "--draft-vocab", "2048", "--out", str(run), "--fresh"]
out = subprocess.run(command, capture_output=True, text=True, check=True)
print("\n".join(out.stdout.splitlines()[-4:]))
heads = run / "heads.safetensors"

# %% [markdown]
# ## What the heads propose
#
# S4C needs the target's hidden state, so the pipeline asks the backend for it; we build the decoder by
# name and look at one proposal made during decoding.

# %%
decoder = specframe.SpeculativeDecoder.from_names(
    target, drafter=f"s4c(heads='{heads}', topk=3)", tree="static(preset=continuous, depth=3, width=2)",
    budget=6)
drafter = decoder.pipeline.drafter
seen = []
propose = drafter.propose
drafter.propose = lambda context: seen.append(propose(context)) or seen[-1]
prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
result = decoder.generate(prompt, max_new_tokens=24)
proposal = seen[1]
tok = target.tokenizer
for i in range(len(proposal)):
    print(f"node {i:2d} parent {proposal.parents[i]:2d} {tok.decode([proposal.tokens[i]])!r:10} "
          f"log q(path) = {proposal.scores[i]:.2f}")

# %% [markdown]
# ## Lossless, whatever the heads' quality

# %%
plain = specframe.SpeculativeDecoder.from_names(target, drafter="none", budget=1)  # no cost calibration
plain = plain.generate(prompt, max_new_tokens=24)
assert result.tokens == plain.tokens
m = result.metrics
by_depth = [round(a, 2) for a in m.acceptance_by_depth]
print(f"tau = {m.tau:.2f}, alpha = {m.alpha:.2f}, acceptance by depth = {by_depth}")

# %% [markdown]
# ## Heads that ship with specframe
#
# When trained heads ship for the target (`plugins/specframe_s4c/weights/<model>/`), `s4c` with no
# `heads=` option uses them. Properly trained heads are what make S4C fast; these tiny ones only show the
# workflow.

# %%
try:  # without heads= and without shipped heads for the target, s4c refuses, saying so
    decoder = specframe.SpeculativeDecoder.from_names(target, drafter="s4c", tree="static(preset=continuous)",
                                                      budget=8)
except specframe.SpecframeError as err:
    print(err)
else:
    r = decoder.generate(prompt, max_new_tokens=24)
    assert r.tokens == plain.tokens
    print(f"shipped heads: tau = {r.metrics.tau:.2f}, alpha = {r.metrics.alpha:.2f}")

# %% [markdown]
# ## EAGLE: one decoder layer over the target's features
#
# The `eagle` drafter (EAGLE-1/2 and EAGLE-3, the heads vLLM, SGLang and TensorRT-LLM load) drafts
# autoregressively in feature space: its head reads a token's embedding with the target's feature there
# and predicts the next feature, level by level into a tree that `dynamic` (EAGLE-2's) ranks by
# cumulative log q. `specframe train eagle --model MODEL` trains a head for any target, which then is the
# drafter's default for that model (none ships: on this project's CPU it does not pay, see
# `docs/results/eagle.md`); an EAGLE-3 head of SmolLM2 reads the target's layers 2, 15 and 27, which `kv`
# hands out when asked (`hidden_layers`). How to train and load one: `docs/how-to/eagle.md`.

# %%
try:  # with no head trained here for smollm2-135m, the drafter says how to train one
    decoder = specframe.SpeculativeDecoder.from_names(
        target, drafter="eagle", tree="dynamic", backend="kv(hidden_layers=(2, 15, 27))", budget=8)
except specframe.SpecframeError as err:
    print(err)
else:
    r = decoder.generate(prompt, max_new_tokens=24)
    assert r.tokens == plain.tokens
    by_depth = [round(a, 2) for a in r.metrics.acceptance_by_depth]
    print(f"eagle: tau = {r.metrics.tau:.2f}, acceptance by depth = {by_depth}")
