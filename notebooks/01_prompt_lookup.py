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
# # Drafter: prompt lookup (`pld`)
#
# Prompt lookup decoding drafts by copying: it matches the last few tokens against the prompt and the
# text generated so far, and proposes the tokens that followed the match. It costs almost nothing and
# shines when the output repeats the input (code edits, summaries, retrieval-augmented answers).
# specframe's `pld` prefers the most recent matches, and with `matches=k` merges the continuations of k
# matches into a trie for a tree builder to choose from.

# %%
import numpy as np

import specframe
from specframe import DraftContext

target = specframe.load_target("smollm2-135m")
tok = target.tokenizer
registry = specframe.get_registry()
PLD = registry.get("drafter", "pld")
print(PLD.__doc__ or PLD.__module__)

# %% [markdown]
# ## What it proposes
#
# The context ends with `fibonacci(n`, which occurred before; the drafter proposes what followed it.

# %%
text = ("def fibonacci(n):\n    if n < 2:\n        return n\n"
        "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
        "print(fibonacci(n")
ids = np.array(tok(text)["input_ids"])
for spec in ("pld", "pld(matches=3, num_tokens=6)"):
    parsed = specframe.ComponentSpec.parse(spec)
    proposal = PLD(target, **parsed.options).propose(DraftContext(ids, prompt_len=len(ids), budget=8))
    print(f"\n{spec}: {len(proposal)} nodes")
    for i in range(len(proposal)):
        print(f"  node {i:2d} parent {proposal.parents[i]:2d} score {proposal.scores[i]:.0f} "
              f"{tok.decode([proposal.tokens[i]])!r}")

# %% [markdown]
# ## Decoding with it, and checking it is lossless
#
# The drafter `none` turns the same loop into plain decoding, our reference. The model tends to write a
# second function much like the first, which prompt lookup can copy.

# %%
prompt = ("def fibonacci(n):\n    if n < 2:\n        return n\n"
          "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
          "def")
results = {}
for drafter, tree in (("none", "chain"), ("pld", "chain"), ("pld(matches=3)", "trie")):
    decoder = specframe.SpeculativeDecoder.from_names(target, drafter=drafter, tree=tree, budget=8)
    results[drafter] = decoder.generate(prompt, max_new_tokens=40)
print(results["pld"].text)
for name, r in results.items():
    assert r.tokens == results["none"].tokens, name  # lossless: identical tokens
    m = r.metrics
    print(f"{name:15} steps={m.steps:3d} tau={m.tau:.2f} alpha={m.alpha:.2f} tokens/s={m.tokens_per_s:.1f}")

# %% [markdown]
# ## Where acceptance happens
#
# `acceptance_by_depth[d-1]` is the share of steps that accepted a draft at depth d; the histogram counts
# steps by accepted length. Retrieval drafts are all-or-nothing: when the copy is right, it is right for
# many tokens.

# %%
m = results["pld"].metrics
print("acceptance by depth:", [round(a, 2) for a in m.acceptance_by_depth])
print("histogram of accepted drafts per step:", m.acceptance_histogram)
print("ms per step:", {k: round(v, 2) for k, v in m.time_per_step_ms.items()})
