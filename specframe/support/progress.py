"""Progress bars that draw only on a terminal.

A tqdm bar redraws its line with carriage returns. On a terminal that is one line that moves; piped into a
file, a CI log or a notebook every redraw stays behind as a line of its own. So every bar specframe and its
plugins show goes through `bar`, which draws on stderr when stderr is a terminal and stays silent otherwise::

    from specframe.support.progress import bar

    with bar(total=len(jobs), desc="building shards", unit="shard") as shards:
        ...
        shards.update()
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")

Bar = tqdm
"""The type `bar` returns (a `tqdm.tqdm`), for annotations."""


def on_a_terminal() -> bool:
    """Whether progress should be drawn: stderr, where bars go, is a terminal."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def bar(iterable: Iterable[T] | None = None, *, show: bool = True, **options: Any) -> tqdm:
    """A tqdm bar on stderr, drawn only where `show` is true and stderr is a terminal.

    `iterable` and `options` are tqdm's own (`total`, `desc`, `unit`, `initial`, `leave`, `mininterval`...).
    A bar that does not draw still counts and still wraps `iterable`, so callers never branch on it.
    """
    return tqdm(iterable, file=sys.stderr, disable=not (show and on_a_terminal()), **options)
