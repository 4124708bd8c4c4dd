"""specframe-example-plugin: registers the `bigram` drafter, the `breadth-first` tree builder and the
`recompute` state backend.

specframe finds this module through the entry point `example = "specframe_example"` in the group
`specframe` (see pyproject.toml) and calls the hooks below once, the first time a component is looked up.
"""

import specframe

from specframe_example.backend import RecomputeBackend
from specframe_example.drafter import BigramDrafter
from specframe_example.tree import BreadthFirstTreeBuilder

__version__ = "0.1.0"
__all__ = ["BigramDrafter", "BreadthFirstTreeBuilder", "RecomputeBackend"]


@specframe.hookimpl
def register_drafters(register):
    register(BigramDrafter)


@specframe.hookimpl
def register_tree_builders(register):
    register(BreadthFirstTreeBuilder)


@specframe.hookimpl
def register_state_backends(register):
    register(RecomputeBackend)
