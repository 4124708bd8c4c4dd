"""`s4c`: S4C multi-head drafter (He et al., "S4C: Speculative Sampling with Syntactic and Semantic
Coherence"), and `specframe train s4c` to train its heads."""

from __future__ import annotations

import specframe

HEADS_BELOW = 0.85  # `suffix-s4c` runs the heads on steps whose best copied root child is less likely


@specframe.hookimpl
def register_commands(cli):
    from specframe.kit.cli_options import train_group
    from specframe_s4c.cli import train_s4c

    train_group(cli).command("s4c")(train_s4c)


@specframe.hookimpl
def register_drafters(register):
    from specframe_s4c.drafter import S4CDrafter

    register(S4CDrafter)


@specframe.hookimpl
def register_presets(register):
    register(specframe.Preset("s4c", "s4c+static+greedy", unusable=no_packaged_heads,
                              help="S4C with the heads shipped for the model"))
    # The heads as one more source of SuffixDecoding's merge: they draft where nothing was copied (chat)
    # and rest where a copied root child is already more than HEADS_BELOW likely (code). With one head
    # costing ~7 % of a plain step and its top-2 children holding the next token about half the time,
    # the heads are worth running while the copy sources leave more than ~15 % of that step uncovered.
    register(specframe.Preset("suffix-s4c", f"suffix-heads(heads_below={HEADS_BELOW})+trie+greedy",
                              unusable=no_packaged_heads,
                              help="suffix plus the shipped S4C heads, for what nothing copied says"))


def no_packaged_heads(target) -> str | None:
    """Why the `s4c` preset cannot run on `target`: no trained heads ship for it."""
    from specframe_s4c.drafter import packaged_heads

    path = packaged_heads(target.name)
    if path.is_file():
        return None
    return (f"no trained heads ship for model '{target.name}' (looked for {path}); train them with "
            f"`specframe train s4c --model {target.name}` and name them: --methods "
            "\"s4c(heads='RUN/heads.safetensors')+static+greedy\"")
