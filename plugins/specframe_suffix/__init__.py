"""specframe-suffix: SuffixDecoding (arctic-inference) as the drafter `suffix`, with a persisted cache.

Registers the drafters `suffix`, `suffix-heads` (plus S4C draft heads) and `suffix-eagle` (plus an EAGLE
head), the bench presets `suffix`,
`suffix-rest` and `suffix-self`, and the `specframe cache info|clear` commands. The drafter's `finish`
ends each request: its response joins the cache of earlier responses, written to disk with `cache=`.
Use::

    specframe generate "def fib(n):" --drafter "suffix(cache='chat')" --tree trie
    specframe cache info

or from Python: `specframe.generate(prompt, drafter="suffix(cache='chat')", tree="trie")`. Needs the
`suffix` extra (arctic-inference, built from source: see the README). Importing this package imports
no heavy module; the drafter's module loads on registration and the library when a drafter is made.
"""

from __future__ import annotations

import specframe
from specframe.kit.drafting import TokenizerIdentity

__all__ = ["missing_corpus", "no_corpus", "no_self_corpora", "register_commands", "register_drafters",
           "register_presets"]

# The datastores of the `suffix-rest` and `suffix-self` presets, and the commands that build them.
CORPORA = {
    "python-site": "specframe datastore build --model MODEL --source python-site --out python-site",
    "self-chat": "specframe datastore build --model MODEL --source model:self --self-prompts 1200 "
                 "--answer-tokens 160 --batch-size 32 --out self-chat",
}
CORPUS = "python-site"  # the datastore of the `suffix-rest` preset


@specframe.hookimpl
def register_drafters(register):
    from specframe_suffix.drafter import SuffixDrafter
    from specframe_suffix.heads import SuffixEagleDrafter, SuffixHeadsDrafter

    register(SuffixDrafter)
    register(SuffixHeadsDrafter)
    register(SuffixEagleDrafter)


@specframe.hookimpl
def register_presets(register):
    register(specframe.Preset("suffix", "suffix+trie+greedy",
                              help="SuffixDecoding over the request and earlier responses"))
    register(specframe.Preset("suffix-rest", f"suffix(corpus='{CORPUS}')+trie+greedy", unusable=no_corpus,
                              help=f"suffix with the REST datastore '{CORPUS}' as a third, static source"))
    register(specframe.Preset(
        "suffix-self", "suffix(corpus=('python-site', 'self-chat'))+trie+greedy", unusable=no_self_corpora,
        help="suffix-rest plus 'self-chat', the target's own answers to prompts it wrote (model:self)"))


def no_corpus(target) -> str | None:
    """Why the `suffix-rest` preset cannot run on `target`: no `python-site` datastore for its tokenizer."""
    return missing_corpus(target, CORPUS)


def no_self_corpora(target) -> str | None:
    """Why the `suffix-self` presets cannot run on `target`: a datastore they draft from is missing."""
    return missing_corpus(target, "python-site") or missing_corpus(target, "self-chat")


def missing_corpus(target, name: str) -> str | None:
    """Why the datastore `name` of `CORPORA` cannot serve `target`: absent, unreadable, or built for
    another tokenizer; None when it can."""
    from specframe_corpus.datastore import HEADER, DatastoreError, read_header
    from specframe_corpus.stores import datastore_home, target_identity

    build = f"build it with `{CORPORA[name]}`"
    path = datastore_home() / name
    if not (path / HEADER).is_file():
        return f"no datastore '{name}' in {datastore_home()}: {build}"
    try:
        built_for = TokenizerIdentity(**read_header(path)["tokenizer"])
    except DatastoreError as err:
        return str(err)
    if not built_for.matches(target_identity(target)):
        return f"the datastore '{name}' was built for another tokenizer ({built_for.name}): {build}"
    return None


@specframe.hookimpl
def register_commands(cli):
    from specframe_suffix.cli import app

    cli.add_typer(app, name="cache")
