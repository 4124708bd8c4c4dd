"""`static`: a fixed tree shape given as paths of ranks (Medusa's `*_choices` format), with presets.

A path `(r1, r2, ...)` names the node reached from the root by taking the r1-th best child, then that
node's r2-th best child, and so on; "best" ranks siblings by the proposal's scores (higher first, ties:
earlier node). A path the proposal cannot follow (too few children) is skipped. Paths are taken in the
order given until the budget is full, so list the most valuable first; the presets are ordered by depth,
then by the sum of their ranks.

Sampled drafts: ranks count siblings in draw order (the r-th child drawn), not by score, and the nodes are
taken in the drafter's draw order (`specframe.kit.drafting.draw_order_prefix`) while their rank path is one of
the paths or a prefix of one, a node only when every earlier-drawn sibling is kept too, until the budget is
full. Why this keeps `rejection` lossless: whether a node is kept then depends only on the positions of the
draws made before it, never on its token or on later draws, so the kept children of every node are a
draw-order prefix of a length independent of their values, and the k-th kept child is distributed as q with
the k - 1 earlier ones removed, which is what the verifier assumes. Ranking sampled siblings by score (their
draw counts) would break that.

Presets (`static(preset=...)`):
- `continuous` (S4C): the top-1 chain of length `depth` with the top-`width` alternatives at every depth:
  paths (0,)*(d-1) + (r,) for d = 1..depth, r < width -> depth * width nodes.
- `cartesian` (Medusa style): every prefix of the product of ranks range(w1) x range(w2) x ... for
  `widths=(w1, w2, ...)` -> w1 + w1*w2 + ... nodes.
- `A`..`E` (STree's width x depth configurations 3x4, 16x3, 6x3, 4x4, 3x5): `width` chains, the r-th best
  root child followed by top-1 children down to `depth` -> width * depth nodes, the same nodes a beam
  search of that width and depth keeps when every beam step is kept (see `beam`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from specframe import (
    BuildContext, ConfigurationError, DraftProposal, TokenTree, TreeBuilder, TreeBuilderCapabilities,
)
from specframe.kit.drafting import SAMPLED_DRAWS, draw_order_prefix

STREE_CONFIGS = {"A": (3, 4), "B": (16, 3), "C": (6, 3), "D": (4, 4), "E": (3, 5)}  # name -> (width, depth)

Path = tuple[int, ...]
MAX_PATHS = 4096  # nodes a preset may make (more than any budget fills)


def continuous_paths(depth: int = 3, width: int = 3) -> list[Path]:
    """S4C's continuous tree: a vertical top-1 chain plus `width` horizontal alternatives at each depth."""
    return [(0,) * (d - 1) + (r,) for d in range(1, depth + 1) for r in range(width)]


def cartesian_paths(widths: Sequence[int]) -> list[Path]:
    """Every prefix of the product of rank ranges: the full Medusa-style tree for per-depth top-k widths."""
    paths = [p for d in range(1, len(widths) + 1) for p in itertools.product(*(range(w) for w in widths[:d]))]
    return sorted(paths, key=lambda p: (len(p), sum(p), p))


def cartesian_size(widths: Sequence[int]) -> int:
    """How many paths `cartesian_paths(widths)` makes, counted only up to just past MAX_PATHS."""
    size = level = 0
    for width in widths:
        level = max(level, 1) * width
        size += level
        if size > MAX_PATHS:
            break
    return size


def chains_paths(width: int, depth: int) -> list[Path]:
    """`width` chains: the r-th best root child, then top-1 children to `depth` (STree's width x depth)."""
    return sorted(((r,) + (0,) * (d - 1) for r in range(width) for d in range(1, depth + 1)),
                  key=lambda p: (len(p), sum(p), p))


def preset_paths(preset: str, depth: int = 3, width: int = 3,
                 widths: Sequence[int] = (3, 2, 2)) -> list[Path]:
    if preset == "continuous":
        return continuous_paths(depth, width)
    if preset == "cartesian":
        return cartesian_paths(widths)
    if preset.upper() in STREE_CONFIGS:
        return chains_paths(*STREE_CONFIGS[preset.upper()])
    raise ConfigurationError(f"tree builder 'static': unknown preset '{preset}'; use continuous, cartesian, "
                             f"{', '.join(STREE_CONFIGS)} or paths=[[0], [1], [0, 0], ...]")


def ranked_children(proposal: DraftProposal) -> list[list[int]]:
    """`proposal.children` with each node's children sorted best score first (ties: earlier node)."""
    scores = proposal.scores
    return [sorted(kids, key=lambda i: (-scores[i], i)) for kids in proposal.children]


class StaticTreeBuilder(TreeBuilder):
    """`static(preset=continuous, depth=3, width=3)`, `static(preset=cartesian, widths=(3, 2, 2))`,
    `static(preset=B)` or `static(paths=[[0], [1], [0, 0]])`."""

    name = "static"
    capabilities = TreeBuilderCapabilities(keeps_draw_order=True)

    # the paths are made up front: at most MAX_PATHS of them, more than any budget fills
    option_limits = {"depth": (1, MAX_PATHS), "width": (1, MAX_PATHS), "widths": (1, MAX_PATHS)}

    def __init__(self, *, preset: str = "continuous", paths: Sequence[Sequence[int]] | None = None,
                 depth: int = 3, width: int = 3, widths: Sequence[int] = (3, 2, 2)):
        super().__init__()
        if paths is not None:
            self.paths = [tuple(int(r) for r in p) for p in paths]
        else:
            if depth < 1 or width < 1 or not widths or min(widths) < 1:
                raise ConfigurationError("tree builder 'static': depth, width and widths must be >= 1")
            size = cartesian_size(widths) if preset == "cartesian" else depth * width
            if size > MAX_PATHS:
                raise ConfigurationError(f"tree builder 'static': preset {preset} with depth={depth}, "
                                         f"width={width}, widths={tuple(widths)} makes a tree of more than "
                                         f"{MAX_PATHS} nodes; pass smaller widths")
            self.paths = preset_paths(str(preset), depth, width, tuple(widths))
        if not self.paths or any(not p or min(p) < 0 for p in self.paths):
            raise ConfigurationError("tree builder 'static': paths must be non-empty lists of ranks >= 0")

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        budget = context.budget
        if proposal.draw in SAMPLED_DRAWS:
            shape = {p[:d] for p in self.paths for d in range(1, len(p) + 1)}  # the paths and their prefixes
            keep = draw_order_prefix(proposal, budget, allowed=shape.__contains__)
            return TokenTree.from_proposal(proposal, keep, draw_order_prefix=True)
        kids = ranked_children(proposal)
        keep: dict[int, None] = {}  # ordered set of proposal nodes
        for path in self.paths:
            nodes, parent = [], -1
            for rank in path:
                siblings = kids[parent + 1]
                if rank >= len(siblings):
                    nodes = None
                    break
                parent = siblings[rank]
                nodes.append(parent)
            if nodes is None:
                continue
            new = [n for n in nodes if n not in keep]
            if len(keep) + len(new) > budget:
                continue
            keep.update(dict.fromkeys(new))
        return TokenTree.from_proposal(proposal, list(keep))
