"""specframe-rest: REST retrieval drafting (He et al., 2023) with a checked, memory-mapped datastore.

Registers the drafter `rest` and the `specframe datastore build|info` commands. Use::

    specframe datastore build --model smollm2-135m --source python-site --out python-site
    specframe generate "def fib(n):" --drafter "rest(datastore='python-site')" --tree trie --budget 8

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
    "register_commands",
    "register_drafters",
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
def register_commands(cli):
    from specframe_rest.cli import app

    cli.add_typer(app, name="datastore")
