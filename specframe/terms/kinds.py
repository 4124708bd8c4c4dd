"""The four kinds of pipeline component, and the component of each kind the core uses by default."""

from __future__ import annotations

import enum


class ComponentKind(str, enum.Enum):
    """A kind of component. A str enum: `ComponentKind.DRAFTER == "drafter"`, so plain strings still work."""

    DRAFTER = "drafter"
    TREE_BUILDER = "tree builder"
    VERIFIER = "verifier"
    BACKEND = "backend"

    def __str__(self) -> str:  # "drafter", not "ComponentKind.DRAFTER", in messages
        return self.value

    @property
    def registration_hook(self) -> str:
        """The hook through which plugins register components of this kind."""
        return {"drafter": "register_drafters", "tree builder": "register_tree_builders",
                "verifier": "register_verifiers", "backend": "register_state_backends"}[self.value]


# What `assemble`, `generate` and the CLI use when a kind is not named, and the drafter of plain decoding
# (bench's baseline). Their plugins always load, whatever SPECFRAME_LOAD_PLUGINS says.
DEFAULT_COMPONENTS = {ComponentKind.DRAFTER: "pld", ComponentKind.TREE_BUILDER: "chain",
                      ComponentKind.VERIFIER: "greedy", ComponentKind.BACKEND: "kv"}
PLAIN_DRAFTER = "none"
# Tree nodes per step: "auto" keeps, every step, the subtree expected to emit the most tokens per second,
# up to 24 nodes (docs/explanation/adaptive-speculation.md); a number fills that many every step.
DEFAULT_BUDGET = "auto"
