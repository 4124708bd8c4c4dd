"""specframe-rest: REST retrieval drafting (He et al., 2023) with a checked, memory-mapped datastore.

Registers the drafter `rest`, the bench presets `rest` and `rest-live`, the `--datastore` option of
`specframe generate` and `specframe bench`, and the `specframe datastore build|info` commands. Use::

    specframe datastore build --model smollm2-135m --source python-site --out python-site
    specframe generate "def fib(n):" --drafter rest --datastore python-site --tree trie --budget 8

or from Python: `specframe.generate(prompt, drafter="rest(datastore='DIR', live=1)", tree="trie")`.
Importing this package imports no heavy module; the drafter's modules load on registration.
"""

from __future__ import annotations

import specframe
from specframe_rest.datastore import Datastore, DatastoreError, TokenizerIdentity

__all__ = [
    "Datastore",
    "DatastoreError",
    "TokenizerIdentity",
    "build_datastore",
    "register_cli_options",
    "register_commands",
    "register_drafters",
    "register_presets",
]


def build_datastore(*args, **kwargs):
    """See `specframe_rest.build.build_datastore`."""
    from specframe_rest.build import build_datastore as build

    return build(*args, **kwargs)


@specframe.hookimpl
def register_drafters(register):
    from specframe_rest.drafter import RestDrafter

    register(RestDrafter)


@specframe.hookimpl
def register_presets(register):
    register(specframe.Preset("rest", "rest+trie+greedy", unusable=no_datastore,
                              help="REST with the datastore of --datastore (or $SPECFRAME_DATASTORE)"))
    register(specframe.Preset("rest-live", "rest(live=1)+trie+greedy",
                              help="REST with the datastore, if any, and the live context"))


@specframe.hookimpl
def register_cli_options(register):
    from specframe_rest.drafter import ENV_DATASTORE

    register(specframe.CliOption(
        "--datastore", help="Datastore for the rest drafter when its spec names none (sets "
        f"${ENV_DATASTORE}).", envvar=ENV_DATASTORE))


def no_datastore(target) -> str | None:
    """Why the `rest` preset cannot run on `target`: no datastore named and no default one built for it."""
    from specframe_rest.drafter import resolve_datastore

    if resolve_datastore(None, target) is not None:
        return None
    return ("no datastore: pass --datastore DIR (or set $SPECFRAME_DATASTORE), or build the default one with "
            "`specframe datastore build --model MODEL --source python-site --out python-site`")


@specframe.hookimpl
def register_commands(cli):
    from specframe_rest.cli import app

    cli.add_typer(app, name="datastore")
