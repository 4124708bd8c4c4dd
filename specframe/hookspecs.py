"""Hook specifications: the whole plugin API of specframe.

Registration hooks receive a `register` callable and call it once per component *class* they provide;
importing a plugin allocates nothing. Observer hooks are called during decoding. No hook is firstresult:
every implementation is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "specframe"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_drafters(register: Callable[[type], None]) -> None:
    """Register `Drafter` subclasses: call `register(cls)` for each.

    Called once, the first time any component is looked up. Returns nothing.
    """


@hookspec
def register_tree_builders(register: Callable[[type], None]) -> None:
    """Register `TreeBuilder` subclasses: call `register(cls)` for each.

    Called once, the first time any component is looked up. Returns nothing.
    """


@hookspec
def register_verifiers(register: Callable[[type], None]) -> None:
    """Register `Verifier` subclasses: call `register(cls)` for each.

    Called once, the first time any component is looked up. Returns nothing.
    """


@hookspec
def register_state_backends(register: Callable[[type], None]) -> None:
    """Register `StateBackend` subclasses: call `register(cls)` for each.

    Called once, the first time any component is looked up. Returns nothing.
    """


@hookspec
def register_commands(cli: Any) -> None:
    """Add sub-commands to the `specframe` command line; `cli` is its `typer.Typer` app.

    Called once when the CLI starts. Returns nothing.
    """


@hookspec
def on_decode_start(decoder: Any, prompt_ids: list[int]) -> None:
    """Called by `SpeculativeDecoder.generate` before prefill. Returns nothing."""


@hookspec
def on_step(decoder: Any, event: Any) -> None:
    """Called after every verification step with a `StepEvent`. Returns nothing."""


@hookspec
def on_decode_end(decoder: Any, result: Any) -> None:
    """Called with the `GenerationResult` when a request finishes. Returns nothing."""
