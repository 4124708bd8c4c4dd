"""What the `llamacpp` plugin's tests share: their skip where llama-cpp-python is missing, the `target`
fixture (a tiny random Llama written as a GGUF, `tiny_gguf`), and plain decoding through the backend."""

from __future__ import annotations

import pytest
import torch
from tiny_gguf import tiny_gguf_target

from specframe import TokenTree

SKIP = "llama-cpp-python is not installed: pip install 'specframe[llamacpp]'"


def require_llama_cpp() -> None:
    """Skip the test module calling this (as it is imported) where llama-cpp-python is not installed."""
    pytest.importorskip("llama_cpp", reason=SKIP)


@pytest.fixture(scope="module", name="target")
def gguf_target(tmp_path_factory):
    """`target`: the tiny GGUF Llama, once per test module that imports this fixture."""
    return tiny_gguf_target(tmp_path_factory.mktemp("gguf"))


def plain_logits(backend, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The next-token logits of plain decoding through `backend` after `prompt`, then `tokens` one step
    each."""
    backend.prefill(prompt)
    for token in tokens:
        backend.commit(backend.score(TokenTree.empty()), [], token)
    return backend.score(TokenTree.empty()).logits[0]
