"""`llamacpp`: a state backend that verifies specframe's trees inside llama.cpp (through llama-cpp-python),
so every drafter, tree builder and verifier runs on the GGUF file's own quantized weights and kernels.

It serves a target loaded from a GGUF file or a GGUF alias (`--model path.gguf --backend llamacpp`, or the
default `smollm2-135m`): specframe loads the target as usual (its tokenizer and, for drafters that need
one, the model converted from the GGUF by transformers), and the backend runs the same file in llama.cpp.
The token ids are the GGUF's own: the target's tokenizer is the one transformers reads from the file.

One step is one `llama_decode` of the pending root and every tree node (`layout`; a tree of more than
`ubatch` rows takes one call per `ubatch` rows): each row at position
(committed length + depth), in the sequences of every root-to-leaf path through it, so that each row
attends to the committed tokens and its own ancestors only, and yields its logits. A commit keeps the root
and the accepted branch in sequence 0 and frees every other cell of the tree; when a rejected cell lies
between accepted ones, the accepted cells are moved together first (`engine.LlamaEngine.compact`), so
that the cache always stores the committed tokens in position order, as plain decoding does.

Lossless: with the context set up as `engine` says, every tree row's logits equal, bit for bit, those of
a plain one-token step through the same backend, so greedy speculative decoding emits exactly the tokens
of plain greedy decoding through it (`tests/plugins/llamacpp`). Limits: attention-only causal models
(recurrent, hybrid and sliding-window ones are refused); the CPU only; at most `max_leaves` root-to-leaf
paths per tree and `context` positions per request (both options, with errors that say which to raise);
no hidden states, so drafters that read the target's features (s4c) cannot run on it.

Batches (`SpeculativeDecoder.generate_batch`): `LlamaCppBackend.batch()` makes rows sequences of one
llama.cpp context of their own (`rows.LlamaRows`), every active row's tree in one `llama_decode` (in
micro-batches of `ubatch` rows), each row's logits those it gets alone, bit for bit. A row owns one
sequence id, a step lends the ids its tree's extra paths need (a step's trees share 255, one for each row
and one for each extra path; a step needing more is refused before it runs); the cache starts at `context`
cells and grows with the rows, and a row is refused, as alone, past `context` positions of its own.

The plugin also registers llama.cpp's own decoding as bench peers (`peers`: `llamacpp-generate`,
`llamacpp-pld`), timed beside specframe's methods against plain decoding through this backend.
"""

from __future__ import annotations

import specframe
from specframe_llamacpp.backend import LlamaCppBackend
from specframe_llamacpp.peers import LlamaCppGenerate, LlamaCppPromptLookup

__all__ = ["LlamaCppBackend", "LlamaCppGenerate", "LlamaCppPromptLookup", "register_peers",
           "register_state_backends"]


@specframe.hookimpl
def register_state_backends(register):
    register(LlamaCppBackend)


@specframe.hookimpl
def register_peers(register):
    register(LlamaCppGenerate)
    register(LlamaCppPromptLookup)
