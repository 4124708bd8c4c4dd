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
# # Batched speculative decoding
#
# `SpeculativeDecoder.generate_batch` decodes several prompts together: each step drafts and builds a
# tree for every row, the `kv` backend scores all the trees in one forward, and each row is verified and
# committed on its own. Every row returns what its prompt returns decoded alone
# (`docs/explanation/batched-decoding.md` says why, and what speculation buys at batch B).
#
# This notebook decodes four short prompts with SmolLM2-135M, 16 new tokens each: plain decoding and
# prompt lookup (`pld`), one prompt at a time and four at once. It checks every row against plain
# decoding of its prompt alone and prints a small throughput table. The numbers are one short run on
# whatever machine executes this notebook; `docs/results/speed-batch.md` has measured sweeps.

# %%
import time

import torch

import specframe

torch.set_num_threads(1)  # steadier timings on a shared machine
target = specframe.load_target("smollm2-135m")
prompts = [
    "class Vector:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __add__(self, other):\n        return Vector(self.x + other.x, self.y + other.y)\n\n"
    "    def __sub__(self, other):\n",
    "def area_of_square(side):\n    return side * side\n\n\ndef area_of_rectangle(width, height):\n"
    "    return width * height\n\n\ndef perimeter_of_square(side):\n",
    "red = (255, 0, 0)\ngreen = (0, 255, 0)\nblue = (0, 0, 255)\nyellow =",
    "import os\nimport sys\n\nif __name__ == \"__main__\":\n    print(os.getcwd())\n    print(sys.argv)\n",
]
NEW_TOKENS = 16

# %% [markdown]
# ## Two decoders
#
# `none` drafts nothing: plain decoding through the same loop and backend, the baseline. `pld` copies
# continuations of the latest n-gram from the prompt and output. The budget is fixed at 8 nodes here;
# `budget="auto"` (the default) would size every row's tree together for the batch's tokens per second,
# after a one-time cost calibration of some twenty seconds that this notebook skips.

# %%
decoders = {
    "plain": specframe.SpeculativeDecoder.from_names(target, drafter="none", tree="chain", budget=8),
    "pld": specframe.SpeculativeDecoder.from_names(target, drafter="pld", tree="chain", budget=8),
}
decoders["pld"].generate_batch(prompts[:2], max_new_tokens=4)  # warm-up, untimed: the first forwards are slow

# %% [markdown]
# ## Plain decoding, one prompt at a time: the reference
#
# Every row decoded in a batch must equal these tokens. Their time is also plain decoding's throughput at
# B = 1.

# %%
start = time.perf_counter()
alone = [decoders["plain"].generate(prompt, max_new_tokens=NEW_TOKENS) for prompt in prompts]
alone_s = time.perf_counter() - start
reference = [result.tokens for result in alone]
for result in alone:
    print(repr(result.text[:60]))

# %% [markdown]
# ## One row at a time and four at once
#
# `batch_size=1` decodes the prompts one after the other through the batch loop (`pld` only: plain
# decoding at B = 1 is the reference above); `batch_size=4` (here the same as leaving it out) decodes all
# four together. Throughput is the new tokens of all rows over the
# seconds of the whole call; tau is the tokens a row emits per step.


# %%
def decode(name: str, size: int) -> dict:
    """Decode every prompt with decoder `name`, `size` rows at a time; its row of the table."""
    start = time.perf_counter()
    rows = decoders[name].generate_batch(prompts, max_new_tokens=NEW_TOKENS, batch_size=size)
    seconds = time.perf_counter() - start
    steps = sum(row.metrics.steps for row in rows)
    accepted = sum(row.metrics.accepted_draft_tokens for row in rows)
    identical = sum(row.tokens == tokens for row, tokens in zip(rows, reference))
    return {"method": name, "B": size, "tokens/s": sum(len(row.tokens) for row in rows) / seconds,
            "tau": (accepted + steps) / steps, "identical rows": f"{identical} of {len(rows)}"}


table = [{"method": "plain", "B": 1, "tokens/s": sum(len(t) for t in reference) / alone_s,
          "tau": 1.0, "identical rows": "reference"}]
table += [decode("pld", 1), decode("plain", 4), decode("pld", 4)]
assert all(row["identical rows"] == f"{len(prompts)} of {len(prompts)}" for row in table[1:])

print(f"{'method':<7} {'B':>2} {'tokens/s':>9} {'tau':>5}  identical rows")
for row in table:
    print(f"{row['method']:<7} {row['B']:>2} {row['tokens/s']:>9.1f} {row['tau']:>5.2f}  "
          f"{row['identical rows']}")

# %% [markdown]
# Every row equals plain decoding of its prompt alone, one at a time or four at once. On a CPU, four
# rows in one forward give plain decoding far more tokens per second than one row does: the weights are
# read once for four rows. That is also why speculation pays less at B = 4 than at B = 1: the rows already
# fill the matrix products, so each tree node costs nearly as much as a row, and only likely drafts earn
# their place.
#
# ## Rows that end at different times
#
# `max_new_tokens` can be given per prompt. With `batch_size=2`, two rows decode at once and a row that
# ends makes room for the next waiting prompt (continuous batching). A result's `wall_s` runs from its
# row's admission to its end.

# %%
limits = [8, 16, 8, 16]
rows = decoders["pld"].generate_batch(prompts, max_new_tokens=limits, batch_size=2)
for i, (row, limit) in enumerate(zip(rows, limits)):
    assert row.tokens == reference[i][:limit]  # greedy: the first `limit` tokens of the full reference
    print(f"prompt {i}: {len(row.tokens):>2} tokens, ended by {row.finish_reason}, "
          f"{row.metrics.wall_s:.2f} s from admission to end")
