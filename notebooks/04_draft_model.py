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
# # Drafter: a draft model (`draft-model`)
#
# Classic speculative decoding drafts with a small model that shares the target's tokenizer.
# `draft-model(layers=N)` needs no second model: it drafts with the target's own first N decoder layers
# plus its final norm and LM head (self-speculation, no extra weights). Because it has real draft
# probabilities q, it feeds the probability-driven tree builders (`beam`, `dynamic`) and the `rejection`
# verifier.

# %%
import numpy as np

import specframe
from specframe import DraftContext, SamplingParams

target = specframe.load_target("smollm2-135m")
tok = target.tokenizer
print("target layers:", target.config.num_hidden_layers)
DraftModel = specframe.get_registry().get("drafter", "draft-model")
print(DraftModel.capabilities)

# %% [markdown]
# ## A candidate forest with probabilities
#
# `num_tokens=4` drafts a greedy chain of four tokens; `topk=2` adds each chain node's runner-up as a
# sibling leaf. Scores are cumulative log q.

# %%
text = "The quick brown fox jumps over the lazy"
ids = np.array(tok(text)["input_ids"])
drafter = DraftModel(target, layers=16, num_tokens=4, topk=2)
proposal = drafter.propose(DraftContext(ids, prompt_len=len(ids), budget=8))
for i in range(len(proposal)):
    q = proposal.draft_probs[i, proposal.tokens[i]].item()
    print(f"node {i} parent {proposal.parents[i]:2d} {tok.decode([proposal.tokens[i]])!r:10} "
          f"q = {q:.2f}  log q(path) = {proposal.scores[i]:.2f}")

# %% [markdown]
# ## Greedy: lossless, and how much depth buys
#
# More draft layers give better drafts but cost more per draft token. SmolLM2-135M has 30 layers.

# %%
prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
plain = specframe.SpeculativeDecoder.from_names(target, drafter="none", budget=1)  # no cost calibration
plain = plain.generate(prompt, max_new_tokens=16)
for layers, tree in ((8, "chain"), (16, "dynamic(topk=2, depth=4)")):
    spec = f"draft-model(layers={layers}, num_tokens=4, topk=2)"
    decoder = specframe.SpeculativeDecoder.from_names(target, drafter=spec, tree=tree, budget=6)
    r = decoder.generate(prompt, max_new_tokens=16)
    assert r.tokens == plain.tokens
    m = r.metrics
    print(f"layers={layers:2d} {tree:25} tau={m.tau:.2f} alpha={m.alpha:.2f} "
          f"ms/step draft={m.time_per_step_ms['draft']:.0f} forward={m.time_per_step_ms['forward']:.0f}")

# %% [markdown]
# ## Sampling with rejection
#
# At temperature 0.8, the drafter samples its drafts from q and `rejection` accepts a draft token x with
# probability min(1, p(x)/q(x)), which keeps the output distribution exactly the target's. The tree builder
# must keep the sampled drafts as drawn: `trie` keeps the first drafts in draw order (`beam` and `dynamic`
# choose by score, so pairing them with `rejection` while sampling is refused). The same seed gives the
# same output, and no step falls back to sample-and-match.

# %%
hot = SamplingParams(temperature=0.8, seed=3)
decoder = specframe.SpeculativeDecoder.from_names(
    target, drafter="draft-model(layers=16, num_tokens=4, topk=2)", tree="trie",
    verifier="rejection", budget=6, sampling=hot)
a = decoder.generate(prompt, max_new_tokens=16)
b = decoder.generate(prompt, max_new_tokens=16)
assert a.tokens == b.tokens
print(a.text)
print(f"tau = {a.metrics.tau:.2f}, steps verified by sample-and-match instead: {a.metrics.fallback_steps}")
