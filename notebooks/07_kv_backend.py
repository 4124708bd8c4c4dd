# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   execution:
#     timeout: 900
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # State backend: the transformer KV cache (`kv`)
#
# The `kv` backend serves any Hugging Face causal LM. To score a token tree in one forward pass it passes
# the model an explicit 4D attention mask (each node sees the prefix, its ancestors and itself) and
# explicit position ids (prefix length + depth), and after verification it compacts the accepted branch
# in the cache. This notebook checks both against plain forward passes and times tree scoring.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

import specframe
from specframe import TokenTree
from specframe.testing import reference_logits

target = specframe.load_target("smollm2-135m")
tok = target.tokenizer
KV = specframe.get_registry().get("backend", "kv")
print(KV.capabilities, "| refuses this model because:", KV.unsupported_reason(target))

# %% [markdown]
# ## Tree logits equal path logits
#
# A small tree under the pending root: two alternatives for the next token, the first with two children.

# %%
prompt_ids = tok("The capital of France is")["input_ids"]
words = [" Paris", " a", ".", " and", " city"]
tokens = [tok(w, add_special_tokens=False)["input_ids"][0] for w in words]
tree = TokenTree(np.array(tokens), np.array([-1, -1, 0, 0, 1]))
print("packed positions relative to the root:", tree.position_offsets.tolist())

backend = KV(target)
backend.prefill(prompt_ids)
scores = backend.score(tree)
print("logits", tuple(scores.logits.shape))
for i in range(-1, len(tree)):
    path = tree.path_to(i) if i >= 0 else []
    ref = reference_logits(target, prompt_ids + [tokens[j] for j in path])[-1]
    diff = (scores.logits[i + 1] - ref).abs().max().item()
    text = "".join(words[j] for j in path)
    following = tok.decode([int(ref.argmax())])
    print(f"node {i:2d} {text!r:22} max |tree - plain| = {diff:.1e}  next: {following!r}")
    assert diff < 1e-3

# %% [markdown]
# The mask `kv` gives the model for this row (`plugins/specframe_kv/rows.py`): prefix columns are all
# visible, the tree block is the tree's ancestor mask (each node sees the root, its ancestors and itself).

# %%
prefix = backend.committed_length
visible = np.ones((len(tree) + 1, prefix + len(tree) + 1), bool)  # (T, P + T)
visible[:, prefix:] = tree.ancestor_mask
fig, ax = plt.subplots(figsize=(8, 2.5))
ax.imshow(visible, cmap="Blues", aspect="auto")
ax.set_xlabel("key: prefix tokens, then root and nodes")
ax.set_ylabel("query: root, nodes")
plt.show()

# %% [markdown]
# ## Commit the accepted branch
#
# Accept `Paris` then `.` (nodes 0 and 2), with bonus token `\n`. The cache must then hold exactly the
# prompt, the root, and the accepted path, as if they had been decoded one by one.

# %%
bonus = tok("\n", add_special_tokens=False)["input_ids"][0]
before = backend.committed_length
backend.commit(scores, [0, 2], bonus)  # the scores of the latest score(): they carry the tree
print("committed length", before, "->", backend.committed_length)
history = prompt_ids + [tokens[0], tokens[2], bonus]
after = backend.score(TokenTree.empty()).logits[0]
gap = (after - reference_logits(target, history)[-1]).abs().max().item()
print("next-token logits vs plain forward:", gap)

# %% [markdown]
# ## What a bigger tree costs on this CPU
#
# Scoring time against the number of tree nodes (median of 3). On a GPU this curve is nearly flat; on a
# CPU it is not, which is why small budgets win here.

# %%
torch.manual_seed(0)
sizes, times = [0, 1, 4, 8, 16, 32], []
for n in sizes:
    t = TokenTree(np.random.randint(0, target.vocab_size, n), np.arange(n) // 2 - 1)  # a binary tree
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        backend.score(t)
        runs.append(time.perf_counter() - start)
    times.append(1000 * float(np.median(runs)))
plt.plot(sizes, times, marker="o")
plt.xlabel("tree nodes")
plt.ylabel("ms per score")
plt.show()
print({n: round(t, 1) for n, t in zip(sizes, times)})
