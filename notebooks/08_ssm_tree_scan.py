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
# # State backends for SSM and hybrid models: the tree scan (`ssm-tree`) vs unrolled paths (`ssm-unrolled`)
#
# A Mamba2 layer keeps a recurrent state, not a list of keys, so a token tree cannot be scored by masking
# attention alone. `ssm-unrolled` runs every root-to-leaf path as its own sequence in a batch; `ssm-tree`
# scores the packed tree in one pass with STree's tree scan (see the explanation page "The SSM tree
# scan"). Both must give the logits of plain forward passes along each path. Here we check that on a
# small random hybrid (Mamba2 + attention, transformers' Bamba) and compare their cost as trees grow.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from transformers import BambaConfig, BambaForCausalLM

import specframe
from specframe import TokenTree
from specframe.testing import check_lossless, make_decoder, reference_logits, repetitive_prompt
from specframe_ssm import calibrate
from specframe_ssm.cost import full_binary_tree

torch.manual_seed(0)
config = BambaConfig(vocab_size=256, hidden_size=128, num_hidden_layers=4, attn_layer_indices=[1, 3],
                     mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=32, mamba_expand=2,
                     mamba_d_conv=4, mamba_chunk_size=32, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=256, initializer_range=0.1)
model = BambaForCausalLM(config).eval()
with torch.no_grad():
    model.lm_head.weight.mul_(8.0)  # sharper outputs: greedy decoding then repeats itself, as text often does
target = specframe.Target(model, tokenizer=None, name="tiny-bamba")
print("layers:", target.config.layers_block_type)

registry = specframe.get_registry()
print("kv refuses it:", registry.get("backend", "kv").unsupported_reason(target))
backends = {name: registry.get("backend", name) for name in ("ssm-tree", "ssm-unrolled")}

# %% [markdown]
# ## Same logits as plain forward passes

# %%
rng = np.random.default_rng(0)
prompt = repetitive_prompt(target.vocab_size, 32, seed=0)
tree = TokenTree(rng.integers(0, 256, 7), np.array([-1, -1, 0, 0, 1, 2, 5]))
print("paths:", tree.paths)
scores = {}
for name, cls in backends.items():
    backend = cls(target)
    backend.prefill(prompt)
    scores[name] = backend.score(tree).logits
for i in range(-1, len(tree)):
    path = tree.path_to(i) if i >= 0 else []
    ref = reference_logits(target, prompt + tree.tokens[path].tolist())[-1]
    diffs = {name: (s[i + 1] - ref).abs().max().item() for name, s in scores.items()}
    print(f"node {i:2d} depth {len(path)}", {k: f"{v:.1e}" for k, v in diffs.items()})
    assert max(diffs.values()) < 1e-3

# %% [markdown]
# ## Lossless decoding
#
# Prompt lookup drafts, a branching tree (`trie` over three matches), greedy verification: the output must
# equal plain greedy decoding, with either backend.

# %%
prompts = [repetitive_prompt(target.vocab_size, 40, seed=s) for s in (1, 2)]
for name in backends:
    decoder = make_decoder(target, "pld(matches=3)", "trie", "greedy", name, budget=8)
    check_lossless(decoder, prompts, max_new_tokens=32, label=name)
    m = decoder.generate(prompts[0], max_new_tokens=32).metrics
    print(f"{name:13} lossless; tau = {m.tau:.2f}")

# %% [markdown]
# ## Cost as the tree grows
#
# Full binary trees of depth 1..4 (2 to 30 nodes, 2 to 16 leaves). The unrolled backend repeats shared
# prefixes once per leaf; the tree scan computes each node once, at the price of a T x T scan per head.

# %%
def binary_tree(depth):
    parents = np.array(full_binary_tree(depth + 1))  # depth levels below the root
    return TokenTree(rng.integers(0, 256, len(parents)), parents)


timings = {name: [] for name in backends}
sizes = []
for depth in (1, 2, 3, 4):
    t = binary_tree(depth)
    sizes.append(len(t))
    for name, cls in backends.items():
        backend = cls(target)
        backend.prefill(prompt)
        backend.score(t)  # warm-up
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            backend.score(t)
            runs.append(time.perf_counter() - start)
        timings[name].append(1000 * float(np.median(runs)))
for name, ms in timings.items():
    plt.plot(sizes, ms, marker="o", label=name)
    print(name, {n: round(v, 1) for n, v in zip(sizes, ms)})
plt.xlabel("tree nodes (full binary tree)")
plt.ylabel("ms per score")
plt.legend()
plt.show()

# %% [markdown]
# ## The cost model tree builders see
#
# Each SSM backend offers `cost_model()`: a `PolynomialCost` in the packed tree size (nodes + 1), linear
# for pure SSM targets and quadratic with attention layers, as here (where `ssm-tree` pads its forwards
# to 4 rows, on a CPU where its calibration measured that no slower, its default reads smaller trees
# at 4 rows: a `PaddedCost` around the fit). The
# decode loop passes it to the tree builder in `BuildContext.cost`, so a builder can stop growing a tree
# when more nodes would not pay. The default scales fits measured on a reference CPU to the model;
# `calibrate` refits it on this machine.

# %%
for name, cls in backends.items():
    backend = cls(target)
    fitted = calibrate(backend, prompt, depths=(2, 3, 4, 5))  # the same full binary trees, root included
    default = backend.cost_model()
    print(name, "calibrated fit:", fitted.coefficients)
    for label, model in {"default": default, "calibrated": fitted}.items():
        print(f"   ms {label:10}", {n: round(1000 * model.step_seconds(n), 1) for n in sizes})
    print("   ms measured  ", dict(zip(sizes, (round(v, 1) for v in timings[name]))))
