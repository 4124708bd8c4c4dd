"""specframe-corpus: the checked, memory-mapped suffix-array datastore that drafters copy from.

Several plugins draft from or train on a corpus: `rest` retrieves from a datastore, `suffix` drafts
from one as a static source, `s4c` trains on the answers a `model:self` build stored, and `hybrid`
distils on answers and code. They share this package, the only package one plugin may import from
another (declared in pyproject.toml): the datastore format (`datastore.py`), its build from sources
(`build.py`, `sources.py`, `answers.py`, `self_prompts.py`), shards and their distributed build
(`shards.py`, `distributed.py`), the search over it (`retrieval.py`) and where named stores live
(`stores.py`).

As a plugin it registers the `specframe datastore build|info` commands. Use::

    specframe datastore build --model smollm2-135m --source python-site --out python-site
    specframe datastore info python-site

or from Python: `specframe_corpus.build_datastore(out, sources, target)`. Importing this package
imports no heavy module.
"""

from __future__ import annotations

import specframe
from specframe_corpus.datastore import Datastore, DatastoreError, TokenizerIdentity

__all__ = ["Datastore", "DatastoreError", "TokenizerIdentity", "build_datastore", "register_commands"]


def build_datastore(*args, **kwargs):
    """See `specframe_corpus.build.build_datastore`."""
    from specframe_corpus.build import build_datastore as build

    return build(*args, **kwargs)


@specframe.hookimpl
def register_commands(cli):
    from specframe_corpus.cli import app

    cli.add_typer(app, name="datastore")
