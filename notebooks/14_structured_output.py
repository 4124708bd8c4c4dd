# ---
# jupyter:
#   execution:
#     timeout: 600
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
# # Structured output with speculation
#
# A constraint (here a JSON schema, compiled by llguidance) masks the target's distribution to the
# tokens it allows at each position; greedy decoding is the argmax of the masked distribution. Under a
# constraint every drafter still works, and the drafter `forced` proposes for free what the constraint
# forces (a schema's keys, quotes, colons and braces), then lets another drafter (`pld` here) continue
# after them. Verified against the masked law, the output is what constrained plain decoding gives
# (`docs/explanation/structured-output.md` says why).
#
# This notebook decodes one short extraction prompt with SmolLM2-135M under a small schema, at most 48
# new tokens: constrained plain decoding, then `forced(then=pld)`. It checks that both give the same
# tokens and that the text is JSON the schema accepts. Timings are one short run on whatever machine
# executes it; `specframe bench --suite structured` measures the shipped suite.

# %%
import json
import time

import jsonschema
import torch

import specframe

torch.set_num_threads(1)  # steadier timings on a shared machine
target = specframe.load_target("smollm2-135m")
schema = {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
    "properties": {"name": {"type": "string", "maxLength": 40},
                   "age": {"type": "integer", "minimum": 0, "maximum": 130},
                   "city": {"type": "string", "maxLength": 30}},
}
prompt = ("Extract the facts of this passage as JSON.\n"
          "Passage: Mara Okafor, 34, moved from Lagos to Lisbon last spring to open a bakery.\nJSON: ")
NEW_TOKENS = 48

# %% [markdown]
# ## The constraint
#
# `constraint_for` checks and compiles the schema once for the target's tokenizer. JSON is laid out as
# `json.dumps` writes it (`", "` and `": "`, no other whitespace), so the layout is forced too. A state of
# the constraint says which tokens it allows next, and which it forces.

# %%
constraint = specframe.constraint_for(target, json_schema=schema)
start = constraint.start()
print("tokens allowed first:", int(start.allowed().sum()), "of", constraint.vocab_size)
print("forced from the start:", repr(target.tokenizer.decode(start.forced(8))))

# %% [markdown]
# ## Constrained plain decoding, then `forced(then=pld)`
#
# `none` drafts nothing: constrained plain decoding through the same loop, the reference. Each decoder
# runs once untimed first (the first forwards are slow).

# %%
decoders = {
    "constrained plain": specframe.SpeculativeDecoder.from_names(target, drafter="none", budget=1),
    "forced(then=pld)": specframe.SpeculativeDecoder.from_names(target, drafter="forced(then=pld)", budget=8),
}
results = {}
for name, decoder in decoders.items():
    decoder.generate(prompt, max_new_tokens=8, constraint=constraint)  # warm-up, untimed
    begin = time.perf_counter()
    results[name] = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, constraint=constraint)
    seconds = time.perf_counter() - begin
    metrics = results[name].metrics
    print(f"{name:18} {metrics.new_tokens} tokens in {metrics.steps} steps (tau "
          f"{metrics.new_tokens / metrics.steps:.2f}), {seconds:.2f} s")
    print("   ", results[name].text)

# %% [markdown]
# ## The same tokens, and valid JSON
#
# Speculation changed how many forwards the answer took, not the answer.

# %%
plain, forced = results["constrained plain"], results["forced(then=pld)"]
assert forced.tokens == plain.tokens, "forced(then=pld) parted from constrained plain decoding"
text = target.tokenizer.decode(forced.tokens, skip_special_tokens=True)
value = json.loads(text)
jsonschema.validate(value, schema)
print("identical to constrained plain decoding; valid JSON:", value)
