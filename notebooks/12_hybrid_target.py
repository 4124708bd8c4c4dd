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
# # A trained hybrid target: SmolLM2 with Mamba2 layers
#
# The SSM backends are checked on random weights. To see what drafters reach on a *trained* hybrid, the
# `hybrid` plugin turns SmolLM2-135M-Instruct into a Mamba2 + attention hybrid as MambaInLlama does:
# some attention layers become Mamba2 mixers that start from the attention weights (x from V, B from K,
# C from Q, the output projection from O), then each mixer is distilled to reproduce the attention layer it
# replaces. The result is a `GraniteMoeHybridForCausalLM` directory that transformers loads by itself.
#
# This notebook: (1) the conversion is exact where nothing is replaced; (2) one mixer distilled for a
# few steps; (3) the shipped hybrid `smollm2-135m-hybrid` against its teacher; (4) speculative decoding on
# it through the tree scan, with the same output as plain greedy decoding.

# %%
import tempfile
from pathlib import Path

import torch

import specframe
from specframe_hybrid.convert import convert, replaced_layers
from specframe_hybrid.data import code_documents, held_out_texts
from specframe_hybrid.distill import LayerTraining, TeacherActivations, train_mixer

torch.manual_seed(0)
teacher = specframe.load_target("smollm2-135m", device="cpu", dtype="float32")
code = 'def fibonacci(n):\n    """Return the n-th number."""\n'
ids = torch.tensor([teacher.tokenizer(code)["input_ids"]])

# %% [markdown]
# ## 1. The conversion
#
# With no layer replaced, the converted model is SmolLM2 in another class: same logits. With one layer in
# four replaced (`1/4`: layers 2, 6, ..., 26), the untrained mixers make it a different model.

# %%
with torch.no_grad():
    reference = teacher.model(ids).logits
    same = convert(teacher.model, [])(ids).logits
    print("no layer replaced, largest logit difference:", (same - reference).abs().max().item())
    layers = replaced_layers("1/4", teacher.config.num_hidden_layers)
    untrained = convert(teacher.model, layers)(ids).logits
    agreement = (untrained.argmax(-1) == reference.argmax(-1)).float().mean().item()
    print(f"layers {layers} replaced, untrained: argmax agreement {agreement:.2f}")

# %% [markdown]
# ## 2. Distilling one mixer
#
# The teacher's attention input and output at layer 2 are cached for a few blocks of standard library code;
# the mixer learns to map one to the other. The real recipe (`specframe hybrid build`) does this for every
# replaced layer on 135 k tokens (code and the teacher's own chat answers).

# %%
documents = code_documents(teacher.tokenizer, 4 * 256)
stream = [t for d in documents for t in d][: 4 * 256]
blocks = torch.tensor(stream).view(4, 256)  # (blocks, tokens)
tmp = tempfile.TemporaryDirectory(prefix="hybrid-notebook-")  # removed when the kernel exits
workdir = tmp.name
activations = TeacherActivations(Path(workdir) / "activations", blocks, [2])
activations.fill(teacher.model)
inputs, outputs = activations.pairs(2)
mixer = convert(teacher.model, [2]).model.layers[2].mamba
settings = LayerTraining(steps=30, batch=2, lr=2e-3, warmup=5)
report = train_mixer(mixer, inputs, outputs, settings, held_out=1)
print(f"relative error on a held-out block: {report['held_out_before']:.2f} -> "
      f"{report['held_out_after']:.2f}")

# %% [markdown]
# ## 3. The shipped hybrid against its teacher
#
# `smollm2-135m-hybrid` is built on first use, in seconds, from the distilled mixers shipped with the
# package. Greedy agreement with the teacher, on HumanEval prompts that no training block contains:

# %%
hybrid = specframe.load_target("smollm2-135m-hybrid", device="cpu", dtype="float32")
mamba = [i for i, kind in enumerate(hybrid.config.layer_types) if kind != "full_attention"]
print(type(hybrid.model).__name__, "Mamba2 layers:", mamba)
texts = held_out_texts(teacher.tokenizer, humaneval=3, per_category=1)["humaneval"]
agree = positions = 0
with torch.inference_mode():
    for sequence in texts:
        ids = torch.tensor([sequence])  # (1, T)
        mine = hybrid.model(ids, use_cache=False).logits[0].argmax(-1)  # (T,) greedy next tokens
        theirs = teacher.model(ids, use_cache=False).logits[0].argmax(-1)  # (T,)
        agree += int((mine == theirs).sum())
        positions += len(mine)
print(f"greedy agreement with SmolLM2 on {positions} positions: {agree / positions:.3f}")

# %% [markdown]
# ## 4. Speculative decoding on the hybrid
#
# `kv` cannot roll a Mamba2 state back, so it refuses the hybrid; `ssm-tree` verifies a whole token tree
# in one packed forward. Greedy output must equal plain greedy decoding token for token.

# %%
print("kv:", specframe.get_registry().get("backend", "kv").unsupported_reason(hybrid))
prompt = texts[0]  # the first HumanEval prompt, as token ids
plain = specframe.SpeculativeDecoder.from_names(hybrid, "none", "chain", "greedy", "ssm-tree", budget=1)
baseline = plain.generate(prompt, max_new_tokens=32)
for drafter, tree in (("pld", "chain"), ("pld(matches=4)", "trie"), ("rest(live=1)", "trie")):
    decoder = specframe.SpeculativeDecoder.from_names(hybrid, drafter, tree, "greedy", "ssm-tree", budget=8)
    result = decoder.generate(prompt, max_new_tokens=32)
    assert result.tokens == baseline.tokens
    print(f"{drafter:16s} {tree:6s} identical to plain greedy; tau {result.metrics.tau:.2f}, "
          f"{result.metrics.steps} steps for {len(result.tokens)} tokens")
print(baseline.text)

# %% [markdown]
# The measured speedups, tau and quality of both layer ratios are in `docs/results/conclusions.md`; the recipe
# and how to reproduce it in the how-to "Distil a hybrid target".
