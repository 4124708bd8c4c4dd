"""The `llamacpp` backend on the real SmolLM2-135M-Instruct Q4_1 GGUF (slow): tree rows and chains equal
plain steps bit for bit, greedy speculative decoding emits plain greedy decoding's tokens through the same
backend (fixed and adaptive budgets), and llama.cpp reads the prompts into the same token ids as the
target's tokenizer. Skipped where llama-cpp-python is not installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from llamacpp_tests import plain_logits, require_llama_cpp

from specframe import PolynomialCost, SpeculativeDecoder, TokenTree, assemble
from specframe.testing.synthetic import random_tree
from specframe_llamacpp import LlamaCppBackend

require_llama_cpp()

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # fixture in conftest.py

CODE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
CHAT = "Write a short poem about the sea, then explain its rhyme scheme."
LIST = "List the days of the week, one per line, then list them again in reverse order."
PIPELINES = [("pld", "chain", 8), ("suffix", "trie", 16), ("pld", "static", 24), ("suffix", "trie", "auto")]
# What budget="auto" plans with here (a node at 2 % of a step), instead of calibrating the real model first
COST = PolynomialCost((0.02, 1.0))


def prompt_ids(target, text: str, chat: bool) -> list[int]:
    if chat:
        return target.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                    add_generation_prompt=True, return_dict=False)
    return target.tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def prompts(smollm2):
    return [prompt_ids(smollm2, text, chat) for text, chat in ((CODE, False), (CHAT, True), (LIST, True))]


def test_a_chain_of_70_rows_equals_70_plain_steps_bit_for_bit(smollm2, prompts):
    backend = LlamaCppBackend(smollm2)
    tokens = prompts[1][:70]
    backend.prefill(prompts[0])
    chain = backend.score(TokenTree(np.array(tokens[:-1]), np.arange(len(tokens) - 1) - 1)).logits
    backend.prefill(prompts[0])
    for i, token in enumerate(tokens):
        scores = backend.score(TokenTree.empty())
        assert torch.equal(scores.logits[0], chain[i]), f"row {i}"
        backend.commit(scores, [], token)


def test_tree_rows_equal_plain_steps_bit_for_bit(smollm2, prompts):
    """Random trees of up to 40 nodes whose tokens the model finds likely and unlikely alike: every row
    equals a plain step after its path, and after the commits (mostly of branches that are not the first
    rows) the state is plain decoding's."""
    backend, reference = LlamaCppBackend(smollm2), LlamaCppBackend(smollm2)
    rng = np.random.default_rng(0)
    history = list(prompts[0])
    backend.prefill(history)
    for size in (6, 17, 40):
        tree = random_tree(rng, smollm2.vocab_size, size)
        likely = backend.score(TokenTree.empty()).logits[0].topk(size).indices.numpy()
        mixed = rng.random(size) < 0.5
        tree.tokens[mixed] = likely[mixed]  # some tokens the model finds likely, so some paths are taken
        scores = backend.score(tree)
        for node in range(-1, size):
            path = tree.path_to(node) if node >= 0 else []
            tokens = history[len(prompts[0]):] + tree.tokens[path].tolist()
            expected = plain_logits(reference, prompts[0], tokens)
            assert torch.equal(scores.logits[node + 1], expected), f"node {node} of {tree.parents.tolist()}"
        path = tree.path_to(size - 1)
        bonus = int(scores.logits[size].argmax())
        backend.commit(scores, path, bonus)
        history += [int(t) for t in tree.tokens[path]] + [bonus]
    after = plain_logits(reference, prompts[0], history[len(prompts[0]):])
    assert torch.equal(backend.score(TokenTree.empty()).logits[0], after)


@pytest.mark.parametrize("drafter,tree,budget", PIPELINES)
def test_greedy_output_is_plain_greedy_decoding_through_the_backend(smollm2, prompts, drafter, tree, budget):
    def decode(drafter, tree, budget, ids):
        pipeline = assemble(smollm2, drafter, tree, "greedy", "llamacpp")
        decoder = SpeculativeDecoder(smollm2, pipeline, budget=budget, cost=COST)
        return decoder.generate(ids, max_new_tokens=64)

    accepted = 0
    for i, ids in enumerate(prompts):
        result = decode(drafter, tree, budget, ids)
        assert result.tokens == decode("none", "chain", 1, ids).tokens, f"prompt {i}"
        accepted += result.metrics.accepted_draft_tokens
    assert accepted > 0


def test_llama_cpp_reads_the_prompts_as_the_targets_tokenizer_does(smollm2):
    from llama_cpp import Llama

    from specframe.kit.backend import gguf_file

    vocab = Llama(str(gguf_file(smollm2.name)), vocab_only=True, verbose=False)
    for text in (CODE, CHAT, LIST, "naïve café – 3.14159 “quotes” 日本語"):
        expected = smollm2.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert vocab.tokenize(text.encode(), add_bos=False, special=True) == expected, text
