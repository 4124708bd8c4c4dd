"""`llamacpp`: a state backend that verifies specframe's trees inside llama.cpp (through llama-cpp-python),
so every drafter, tree builder and verifier runs on the GGUF file's own quantized weights and kernels.

It serves a target loaded from a GGUF file or a GGUF alias (`--model path.gguf --backend llamacpp`, or the
default `smollm2-135m`): specframe loads the target as usual (its tokenizer and, for drafters that need
one, the model converted from the GGUF by transformers), and the backend runs the same file in llama.cpp.
The token ids are the GGUF's own: the target's tokenizer is the one transformers reads from the file.

The backend is written once, as rows (`rows.LlamaRows`, returned by `batch()`): requests are sequences of
one llama.cpp context, and one step is one `llama_decode` of every active row's pending root and tree
nodes (`layout`; a step of more than `ubatch` rows takes one call per `ubatch` rows): each node at
position (committed length + depth), in the sequences of every root-to-leaf path through it, so that it
attends to its row's committed tokens and its own ancestors only, and yields its logits. A commit keeps
each row's root and accepted branch in the row's own sequence and marks every other cell of the step as
discarded, never freeing one, so that each row's cells stay in position order, as plain decoding stores
them. A single request is a batch of one row (`StateBackend.prefill`, `score`, `commit`); the contexts
are kept between requests (`engine.ContextPool`).

Lossless: with the context set up as `engine` says, every tree row's logits equal, bit for bit, those of
a plain one-token step through the same backend, and each row's those it gets alone, so greedy
speculative decoding emits exactly the tokens of plain greedy decoding through it, alone and in a batch
(`tests/plugins/llamacpp`). Limits: attention-only causal models (recurrent, hybrid and sliding-window
ones are refused); the CPU only; at most `max_leaves` root-to-leaf paths per tree, `context` positions
per request, and 255 sequence ids per step (one for each row and one for each extra path), each with an
error, before any work, that says what to change; no hidden states, so drafters that read the target's
features (s4c) cannot run on it.

The plugin also registers llama.cpp's own decoding as bench peers (`peers`: `llamacpp-generate`,
`llamacpp-pld`), timed beside specframe's methods against plain decoding through this backend, and its
grammar decoding (`llamacpp-grammar`), a peer of the structured-output run.
"""

from __future__ import annotations

import specframe
from specframe_llamacpp.backend import LlamaCppBackend
from specframe_llamacpp.peers import LlamaCppGenerate, LlamaCppGrammar, LlamaCppPromptLookup

__all__ = ["LlamaCppBackend", "LlamaCppGenerate", "LlamaCppGrammar", "LlamaCppPromptLookup",
           "register_peers",
           "register_state_backends"]


@specframe.hookimpl
def register_state_backends(register):
    register(LlamaCppBackend)


@specframe.hookimpl
def register_peers(register):
    register(LlamaCppGenerate)
    register(LlamaCppPromptLookup)
    register(LlamaCppGrammar)
