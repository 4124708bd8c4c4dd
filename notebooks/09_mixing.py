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
# # Mixing components: REST drafts on a hybrid Mamba model
#
# Components are independent: a retrieval drafter written for transformers works unchanged on a
# Mamba2 + attention hybrid, as long as the backend can serve the model. Here a hybrid model that uses
# SmolLM2's tokenizer drafts with REST, and its trees are scored with the SSM tree scan.
#
# A trained hybrid ships with specframe (`smollm2-135m-hybrid`, SmolLM2 with distilled Mamba2 layers, built
# on first use: see notebook 12). This notebook uses a small random hybrid instead, so that it runs in
# seconds; its text is gibberish, and its acceptance rates say nothing about REST's quality on real text.
# The point is that the pipeline assembles, runs and is lossless, and that retrieval pays off when the
# datastore holds the text.

# %%
import tempfile
from pathlib import Path

import torch
from transformers import BambaConfig, BambaForCausalLM

import specframe
from specframe_corpus import build_datastore
from specframe_corpus.sources import TokenDocuments

smollm2 = specframe.load_target("smollm2-135m")  # for its tokenizer

# %% [markdown]
# ## A hybrid that speaks SmolLM2's tokens

# %%
torch.manual_seed(0)
config = BambaConfig(vocab_size=smollm2.vocab_size, hidden_size=64, num_hidden_layers=4,
                     attn_layer_indices=[1, 3],
                     mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_expand=2,
                     mamba_d_conv=4, mamba_chunk_size=32, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, initializer_range=0.1, tie_word_embeddings=False)
model = BambaForCausalLM(config).eval()
hybrid = specframe.Target(model, tokenizer=smollm2.tokenizer, name="random-bamba-smollm2-vocab")
tok = hybrid.tokenizer
print(hybrid.config.layers_block_type, f"vocab {hybrid.vocab_size}")

# %% [markdown]
# ## A datastore of the model's own answers
#
# REST can retrieve from any corpus in the model's tokens; one useful corpus is the model's own earlier
# answers (`specframe datastore build --source model:PROMPTS.jsonl` does this for a real model). Here we
# decode three prompts plainly with the hybrid and index prompt + answer as token ids.

# %%
prompts = ["import json\n\n\ndef load(path):", "class Stack:\n    def __init__(self):", "for i in range(10):"]
plain = specframe.SpeculativeDecoder.from_names(hybrid, drafter="none", backend="ssm-tree", budget=1)
documents = []
for text in prompts:
    ids = tok(text)["input_ids"]
    documents.append(ids + plain.generate(ids, max_new_tokens=40).tokens)
workdir = tempfile.TemporaryDirectory(prefix="specframe-mix-")  # removed when the kernel exits
store = Path(workdir.name) / "own-answers"
build_datastore(store, [TokenDocuments("the hybrid's own answers", "ids", documents=documents)], hybrid,
                progress=False)

# %% [markdown]
# ## Assemble by name, check capabilities
#
# The `kv` backend refuses the hybrid and names the right backend; `ssm-tree` accepts it.

# %%
try:
    specframe.assemble(hybrid, drafter=f"rest(datastore='{store}')", tree="trie", backend="kv")
except specframe.CapabilityError as err:
    print("refused:", err)

# %% [markdown]
# ## Decode: lossless, and fast where the datastore knows the answer
#
# The first prompt's answer is in the datastore, so REST drafts it and the target accepts long runs; a new
# prompt finds little to retrieve and decodes about one token per step, exactly like plain decoding.

# %%
for text in (prompts[0], "while True:"):
    ids = tok(text)["input_ids"]
    results = {}
    for label, drafter, backend in (("plain", "none", "ssm-tree"),
                                    ("rest + ssm-tree", f"rest(datastore='{store}')", "ssm-tree"),
                                    ("rest + ssm-unrolled", f"rest(datastore='{store}')", "ssm-unrolled")):
        decoder = specframe.SpeculativeDecoder.from_names(hybrid, drafter=drafter, tree="trie",
                                                          backend=backend, budget=8)
        results[label] = decoder.generate(ids, max_new_tokens=40)
    print(f"prompt {text!r}")
    for label, r in results.items():
        assert r.tokens == results["plain"].tokens, label  # lossless on the hybrid too
        m = r.metrics
        forward = m.time_per_step_ms["forward"]
        print(f"  {label:20} steps={m.steps:3d} tau={m.tau:.2f} ms/step forward={forward:.1f}")
