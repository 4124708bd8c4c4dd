"""specframe-rest: REST retrieval drafting (He et al., 2023) from a datastore of `specframe_corpus`.

Registers the drafter `rest`, the bench presets `rest` and `rest-live` and the `--datastore` option of
`specframe generate` and `specframe bench`. The datastore and its `specframe datastore build|info`
commands come from the corpus package. Use::

    specframe datastore build --model smollm2-135m --source python-site --out python-site
    specframe generate "def fib(n):" --drafter rest --datastore python-site --tree trie --budget 8

or from Python: `specframe.generate(prompt, drafter="rest(datastore='DIR', live=1)", tree="trie")`.
Importing this package imports no heavy module; the drafter's modules load on registration.
"""

from __future__ import annotations

import specframe

__all__ = ["register_cli_options", "register_drafters", "register_presets"]


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
    from specframe_corpus.stores import ENV_DATASTORE

    register(specframe.CliOption(
        "--datastore", help="Datastore for the rest drafter when its spec names none (sets "
        f"${ENV_DATASTORE}).", envvar=ENV_DATASTORE))


def no_datastore(target) -> str | None:
    """Why the `rest` preset cannot run on `target`: no datastore named and no default one built for it."""
    from specframe_corpus.stores import resolve_datastore

    if resolve_datastore(None, target) is not None:
        return None
    return ("no datastore: pass --datastore DIR (or set $SPECFRAME_DATASTORE), or build the default one with "
            "`specframe datastore build --model MODEL --source python-site --out python-site`")

