"""What `load_target` changes in a model it loaded onto the CPU, so that a tree of a few nodes costs about
one plain step and, in half precision, tree forwards reproduce plain steps bit for bit.

In float32 the linear layers multiply by oneDNN-packed weights (`specframe.runtime.packed_linear`),
and by default (`SPECFRAME_CPU_LINEAR=auto`), where the CPU has AVX-512, those whose weights are
dequantized 4- or 8-bit blocks (a GGUF model) multiply tree-sized products by the blocks themselves
(`specframe_kernels.block_linear`: a fifth of the bytes, each row exact) and use exact attention, so that
tree forwards reproduce plain steps bit for bit. `SPECFRAME_CPU_LINEAR=onednn` packs for oneDNN alone,
`torch` turns packing off, `blocks` asks for the block kernel (a warning, and oneDNN alone, where it
cannot run), and `stream` multiplies products of up to 12 rows by `specframe_kernels.stream_linear`
where the CPU has AVX-512 (a warning, and oneDNN alone, where it cannot). In bfloat16, on a CPU that
multiplies bfloat16 natively, the linears are packed to keep up to `EXACT_ROWS` rows exact. Attention in
float32 reads shared key/value heads in place instead of copying them for each tree forward, and in
bfloat16 or float16 (or float32 on the block kernel) computes each row exactly
(`specframe.runtime.attention`); `SPECFRAME_CPU_ATTENTION=sdpa` turns both off.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from specframe.terms.errors import SpecframeWarning

if TYPE_CHECKING:  # torch is imported where it is used: plugins registering components need these helpers
    import torch


def chosen_cpu_kernels() -> str:
    """The CPU linear kernel `SPECFRAME_CPU_LINEAR` asks for, after checking it and
    `SPECFRAME_CPU_ATTENTION`: called before any slow work, so that a bad value fails at once."""
    from specframe.runtime.attention import chosen_attention
    from specframe.runtime.packed_linear import chosen_kernel

    kernel = chosen_kernel()
    chosen_attention()
    return kernel


def patch_cpu_model(model: torch.nn.Module, precision: torch.dtype, kernel: str) -> None:
    """Pack the linear layers of a CPU `model` computing in `precision` for the linear `kernel`
    (`chosen_cpu_kernels`), and switch its attention to the one for its dtype."""
    import torch

    from specframe.runtime.attention import EXACT_ROWS, use_cpu_attention
    from specframe.runtime.packed_linear import linear_kernel, native_bfloat16, pack_linear_layers

    if kernel != "torch" and precision == torch.float32:
        asked = kernel == "blocks"  # auto falls back quietly
        blocks = kernel in ("auto", "blocks") and _kernel_runs("block_linear", kernel, warn=asked)
        stream = kernel == "stream" and _kernel_runs("stream_linear", kernel, warn=True)
        pack_linear_layers(model, stream=stream, blocks=blocks)
    elif kernel != "torch" and precision == torch.bfloat16 and native_bfloat16():
        pack_linear_layers(model, bfloat16=True, exact_rows=EXACT_ROWS)  # trees computed as plain steps
    use_cpu_attention(model, exact=linear_kernel(model) == "blocks")


def _kernel_runs(name: str, kernel: str, *, warn: bool) -> bool:
    """Whether `specframe_kernels.<name>` (asked for by `SPECFRAME_CPU_LINEAR=<kernel>`) runs here; with
    `warn`, a warning says why not."""
    import importlib

    module = importlib.import_module(f"specframe_kernels.{name}")  # imported when asked: `test_registry.py`
    if module.available():
        return True
    if warn:
        warnings.warn(f"SPECFRAME_CPU_LINEAR={kernel} needs an x86-64 CPU with AVX-512 and a C++ compiler "
                      f"with ninja to build specframe_kernels.{name} (see its log message): using oneDNN",
                      SpecframeWarning, stacklevel=4)  # the caller of `load_target`
    return False
