"""The `specframe` pytest plugin (entry point `pytest11`): fixtures for testing components and plugins.

Fixtures:

- `tiny_target`: a random two-layer Llama (vocabulary 96) with a character-level tokenizer over printable
  ASCII (`specframe.testing.targets.tiny_tokenizer`, built offline), shared by the session.
- `tiny_prompt`: 40 token ids in which a phrase recurs, so copy-based drafters have something to find.
- `specframe_registry`: a fresh `PluginRegistry` loaded from the installed entry points, isolated from
  the process-wide one, for tests that register plugins of their own.
- `make_decoder`: `specframe.testing.make_decoder`, to assemble a decoder from classes or names.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_target():
    from specframe.testing.targets import tiny_target as make

    return make(seed=0)


@pytest.fixture
def tiny_prompt(tiny_target) -> list[int]:
    from specframe.testing.targets import repetitive_prompt

    return repetitive_prompt(tiny_target.vocab_size, 40, seed=0)


@pytest.fixture
def specframe_registry():
    from specframe.plugging.registry import PluginRegistry

    registry = PluginRegistry()
    registry.load()
    return registry


@pytest.fixture
def make_decoder():
    from specframe.testing.checks import make_decoder

    return make_decoder
