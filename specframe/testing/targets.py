"""Tiny random targets and plain-decoding references, for tests that must run in seconds on a CPU.

The references here never touch a specframe backend: `reference_greedy` decodes as transformers'
`generate(do_sample=False)` does, with the model's own forward and cache, so a speculative decoder that
matches it is lossless by comparison with the model itself, not with another piece of specframe.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch

from specframe.terms.target import Target


# The tiny tokenizer's vocabulary: one token per character, printable ASCII then the newline (96 ids).
CHARACTERS = [chr(c) for c in range(32, 127)] + ["\n"]


def tiny_tokenizer():
    """A character-level transformers tokenizer over printable ASCII and the newline: token i is
    `CHARACTERS[i]`, 96 ids, no special tokens, no EOS. Built in memory, nothing is downloaded. Other
    characters are dropped when encoding. It gives tests text prompts, stop strings and decoded text."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(CHARACTERS)}, merges=[]))
    backend.decoder = decoders.Fuse()  # concatenate characters, no spaces between tokens
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def tiny_target(seed: int = 0, *, vocab_size: int = 96, hidden_size: int = 32, layers: int = 2,
                max_context: int = 512, tokenizer: bool = True) -> Target:
    """A random Llama with grouped-query attention and, when `vocab_size` is 96 and `tokenizer` is True,
    the character-level `tiny_tokenizer` (so text prompts work; its text is random characters). With
    `tokenizer=False`, or another vocabulary size, it has no tokenizer: pass token ids.

    Weights are drawn with a large initializer range so that logits are well separated: an argmax that
    flips under 1e-6 of float noise would make a lossless comparison meaningless. It has no EOS token,
    so greedy runs always reach `max_new_tokens`.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_context, initializer_range=0.2,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    words = tiny_tokenizer() if tokenizer and vocab_size == len(CHARACTERS) else None
    return Target(model=model, tokenizer=words, name=f"tiny-llama-{seed}")


def repetitive_prompt(vocab_size: int, length: int = 48, seed: int = 0) -> list[int]:
    """Token ids in which a short random phrase recurs, so that copy-based drafters find matches."""
    rng = np.random.default_rng(seed)
    phrase = rng.integers(0, vocab_size, size=8)
    pieces = []
    while sum(len(p) for p in pieces) < length:
        pieces.append(phrase)
        pieces.append(rng.integers(0, vocab_size, size=int(rng.integers(1, 5))))
    return [int(t) for t in np.concatenate(pieces)[:length]]


@torch.inference_mode()
def reference_logits(target: Target, ids: Sequence[int]) -> torch.Tensor:
    """(L, V) float32 logits of one plain forward pass over `ids`, with no cache."""
    input_ids = torch.tensor([list(ids)], device=target.device)  # (1, L)
    return target.model(input_ids=input_ids).logits[0].float()


@torch.inference_mode()
def reference_hidden(target: Target, ids: Sequence[int]) -> torch.Tensor:
    """(L, H) last hidden states of one plain forward pass over `ids`."""
    input_ids = torch.tensor([list(ids)], device=target.device)  # (1, L)
    return target.model(input_ids=input_ids, output_hidden_states=True).hidden_states[-1][0]


@torch.inference_mode()
def reference_greedy(target: Target, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding, the ground truth for losslessness: the prompt in one forward, then each new
    token in a forward of its own on the model's cache, as `model.generate(do_sample=False)` runs.

    Not a recomputation of the whole sequence per token: a model may compute a token differently with
    others than alone (Mamba2-type mixers clamp their time steps to `time_step_limit` in a multi-token
    forward only), and plain decoding feeds every new token alone. Stops after an EOS token (included),
    like `SpeculativeDecoder.generate`.
    """
    from transformers import DynamicCache

    model = target.model
    params = inspect.signature(model.forward).parameters
    cache_kwarg = "past_key_values" if "past_key_values" in params else "cache_params"  # Mamba2: cache_params
    kwargs = {cache_kwarg: DynamicCache(config=model.config), "use_cache": True}
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    ids = list(prompt_ids)
    new: list[int] = []
    fed = 0  # tokens in the cache
    while len(new) < max_new_tokens:
        chunk = torch.tensor([ids[fed:]], device=target.device)  # (1, m)
        if "position_ids" in params:  # as `generate` passes them (Bamba would restart at 0 without)
            kwargs["position_ids"] = fed + torch.arange(chunk.shape[1], device=target.device)[None]  # (1, m)
        token = int(model(input_ids=chunk, **kwargs).logits[0, -1].argmax())
        fed = len(ids)
        ids.append(token)
        new.append(token)
        if token in target.eos_token_ids:
            break
    return new
