"""Hook specifications: the whole plugin API of specframe.

Registration hooks receive a `register` callable and call it once per component *class* they provide
(or per `Preset` / `CliOption` record, or bench `Peer` class); importing a plugin allocates nothing.
Observer hooks are called during decoding. No hook is firstresult: every implementation is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # for the annotations only: a plugin's `specframe.hookimpl` loads neither numpy nor typer
    import typer

    from specframe.contract.extensions import CliOption, ModelRecipe, Preset
    from specframe.terms.records import StepEvent
    from specframe.terms.result import GenerationResult

PROJECT = "specframe"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_drafters(register: Callable[[type], None]) -> None:
    """Register `Drafter` subclasses: call `register(cls)` for each.

    Called once, the first time any component is looked up. Returns nothing. Not firstresult.
    """


@hookspec
def register_tree_builders(register: Callable[[type], None]) -> None:
    """Register `TreeBuilder` subclasses: call `register(cls)` for each.

    Called once, the first time any component is looked up. Returns nothing. Not firstresult.
    """


@hookspec
def register_verifiers(register: Callable[[type], None]) -> None:
    """Register `Verifier` subclasses: call `register(cls)` for each.

    Called once, the first time any component is looked up. Returns nothing. Not firstresult.
    """


@hookspec
def register_state_backends(register: Callable[[type], None]) -> None:
    """Register `StateBackend` subclasses: call `register(cls)` for each.

    Called once, the first time any component is looked up. Returns nothing. Not firstresult.
    """


@hookspec
def register_presets(register: Callable[[Preset], None]) -> None:
    """Register named pipelines for `specframe bench --methods`: call `register(Preset(...))` for each.

    A preset is offered (and run by `all`) only when every component it names is registered; its
    optional `unusable(target)` check says why it cannot run on a target. Called once, with the
    registration hooks above. Returns nothing. Not firstresult.
    """


@hookspec
def register_models(register: Callable[[ModelRecipe], None]) -> None:
    """Add model aliases built on first use: call `register(ModelRecipe(...))` for each.

    `load_target(alias)` (and `--model alias`) then builds the model once into the model cache and loads
    it from there. Called once, with the registration hooks above. Returns nothing. Not firstresult.
    """


@hookspec
def register_cli_options(register: Callable[[CliOption], None]) -> None:
    """Add options to `specframe generate` and `specframe bench`: call `register(CliOption(...))` for each.

    The option's value is applied as an environment variable or as an option of the plugin's component,
    as the record says. Called once, with the registration hooks above (the CLI triggers it when it
    starts). Returns nothing. Not firstresult.
    """


@hookspec
def register_peers(register: Callable[[type], None]) -> None:
    """Register bench peers, other systems' decoding timed beside specframe's methods (`specframe bench
    --peers NAME`): call `register(cls)` for each `Peer` subclass.

    Called once, with the registration hooks above (the core registers transformers' peers through it).
    Returns nothing. Not firstresult.
    """


@hookspec
def register_commands(cli: typer.Typer) -> None:
    """Add sub-commands to the `specframe` command line; `cli` is its `typer.Typer` app.

    Called once when the CLI starts; an implementation that raises is recorded as a failed plugin and
    the others still run. Returns nothing. Not firstresult.
    """


@hookspec
def on_decode_start(prompt_ids: list[int]) -> None:
    """Called by `SpeculativeDecoder.generate` before prefill, with the prompt's token ids. Returns nothing.
    Not firstresult."""


@hookspec
def on_step(event: StepEvent) -> None:
    """Called after every verification step with its `StepEvent`. Returns nothing. Not firstresult."""


@hookspec
def on_decode_end(prompt_ids: list[int], result: GenerationResult) -> None:
    """Called when a request finishes, with its prompt's token ids and its `GenerationResult` (after the
    drafter's `Drafter.finish`). Returns nothing. Not firstresult."""
