"""`benchmarks/self_samples_corpus.py`: batched completions of code prompts, left-padded correctly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import plain_greedy

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "self_samples_corpus.py"
PROMPTS = ["def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n",
           "from typing import List\n\n\ndef largest(numbers: List[int]) -> int:\n"
           "    \"\"\"Return the largest of a non-empty list of numbers.\"\"\"\n"]


def load_script():
    spec = importlib.util.spec_from_file_location("self_samples_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_problem_ranges_are_first_colon_last():
    script = load_script()
    assert script.problem_range("20:164") == slice(20, 164)
    assert list(range(200))[script.problem_range("3:5")] == [3, 4]


@pytest.mark.slow
def test_a_batch_of_prompts_of_different_lengths_completes_each_as_alone(smollm2):
    """Near temperature 0 each completion is the prompt's own greedy one: the shorter prompt's left
    padding is masked, and every completion stops at its end-of-sequence token."""
    torch.manual_seed(0)
    texts = load_script().complete(smollm2, PROMPTS, temperature=1e-4, max_new_tokens=12)
    for prompt, text in zip(PROMPTS, texts, strict=True):
        alone = plain_greedy(smollm2, smollm2.tokenizer(prompt)["input_ids"], 12)
        alone = [t for t in alone if t not in smollm2.eos_token_ids]
        assert text == smollm2.tokenizer.decode(alone)
