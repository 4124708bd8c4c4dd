"""Building specframe's AVX-512 CPU kernels (`stream_linear`, `block_linear`) on first use.

Each is one C++ file compiled by `torch.utils.cpp_extension` with the system compiler and ninja, once per
machine (torch caches the build under the extension's name). `cpu_supported` says whether this CPU can
run them at all; `build` returns the extension, or None where the build fails, so that the caller falls
back to oneDNN.
"""

from __future__ import annotations

import logging
import platform
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# -fopenmp: at::parallel_for splits the outputs over torch's threads (torch's own libgomp.so.1, already
# loaded, serves the extension too); without it a kernel would run on one thread
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp"]


def cpu_supported() -> bool:
    """Whether this CPU and torch build can run AVX-512 code (x86-64, torch reports AVX512)."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch.backends.cpu.get_cpu_capability() == "AVX512"


def build(name: str, source: Path, flags: list[str], *, announce: str | None = None):
    """The extension `name` compiled from `source` with `flags` (beside `FLAGS`), or None where this CPU
    cannot run it or the build fails (no compiler, no ninja), with the reason logged. `announce` is
    printed to stderr before a build that is not cached yet (a kernel the default path builds: the first
    load would otherwise seem to hang)."""
    if not cpu_supported():
        return None
    from torch.utils.cpp_extension import _get_build_directory, load

    try:
        if announce and not (Path(_get_build_directory(name, verbose=False)) / f"{name}.so").exists():
            print(f"specframe: {announce}", file=sys.stderr, flush=True)
        return load(name=name, sources=[str(source)], extra_cflags=[*FLAGS, *flags],
                    extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as err:  # a missing compiler or ninja raises RuntimeError, OSError or others
        log.warning("%s kernel not built (%s): linears use oneDNN", source.stem, str(err).splitlines()[0])
        return None
