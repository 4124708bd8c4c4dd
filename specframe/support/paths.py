"""Where specframe keeps its files (`specframe_home`: converted models, calibrations, caches, datastores),
and a check that a directory can be written before slow work is spent on filling it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specframe.terms.errors import ConfigurationError


def specframe_home() -> Path:
    """`$SPECFRAME_HOME`, else `$XDG_CACHE_HOME/specframe`, else `~/.cache/specframe`."""
    if os.environ.get("SPECFRAME_HOME"):
        return Path(os.environ["SPECFRAME_HOME"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specframe"


def check_writable_dir(path: Path, what: str, fix: str) -> None:
    """Create `path` if needed and write a scratch file in it, so that a read-only directory, or a file
    where a directory should be, is reported before slow work (loading or dequantizing a model) and not
    as an OSError traceback after it. A write is tried: `os.access` says yes to root on read-only modes."""
    blocker = _file_in_the_way(path)
    if blocker is not None:
        where = "" if blocker == path else f" ({blocker} is a file)"
        raise ConfigurationError(f"{what} {path} cannot be a directory{where}: {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ConfigurationError(f"{what} {path} is not writable ({err.strerror or err}): {fix}") from None


def _file_in_the_way(path: Path) -> Path | None:
    """`path` or the nearest of its parents that exists, when that is not a directory."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None
