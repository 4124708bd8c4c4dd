"""A registry of specframe's own plugins only, for tests of what a refusal recommends: the registry
composes a backend's refusal from what every installed backend says of the model
(`specframe.plugging.pipeline.backend_refusal`), and the example plugin installed beside specframe's
(`examples/specframe-example-plugin`, backend `recompute`) answers for models the tests expect no backend
to serve."""

from __future__ import annotations

import functools
import os
from importlib.metadata import entry_points
from unittest import mock

from specframe import PluginRegistry
from specframe.plugging.registry import DISTRIBUTION, ENTRY_POINT_GROUP


@functools.cache
def first_party_registry() -> PluginRegistry:
    """A loaded registry of the plugins the `specframe` distribution itself provides."""
    own = [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)
           if ep.dist is not None and ep.dist.name == DISTRIBUTION]
    registry = PluginRegistry()
    with mock.patch.dict(os.environ, {"SPECFRAME_LOAD_PLUGINS": ",".join(own)}):
        registry.load()
    return registry


def own_words(refusal: str) -> str:
    """`refusal` without the other backends' refusals it quotes ("; the 'x' backend refuses it too (...)"):
    the refused backend's reason and the registry's advice, which must recommend only backends that serve
    the model. (A quoted refusal is that backend's own text, checked where that backend is refused.)"""
    out, rest = [], refusal
    while (start := rest.find("; the '")) >= 0 and "' backend refuses it too (" in rest[start:start + 80]:
        out.append(rest[:start])
        depth, end = 0, rest.index("(", rest.index("refuses it too", start))
        while True:
            depth += {"(": 1, ")": -1}.get(rest[end], 0)
            if depth == 0 or end == len(rest) - 1:
                break
            end += 1
        rest = rest[end + 1:]
    return "".join(out) + rest
