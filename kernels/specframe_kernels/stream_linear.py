"""A float32 CPU linear for 1 to 12 rows that reads each weight once: tree forwards on AVX-512 CPUs.

A verification step on the CPU multiplies a few rows (the tree's nodes) by every weight matrix of the
model, and a few rows cost what reading the weights costs, if the kernel reads them once. oneDNN's
packed kernels do that up to 6 rows and then jump at 7, and their single-row kernel reads the weights
more slowly than their 4-row one (an AMD EPYC, Zen 4: docs/explanation/metrics-and-costs.md). This
kernel (`stream_linear.cpp`) keeps up to 12 rows in registers while the weights stream past:

- the weight is laid out once as `[input chunk][block of 32 outputs][64 inputs][32 outputs]`, so one pass
  over a chunk of 64 inputs is one contiguous read, and that chunk of x (transposed) and of one block stay
  in the L1 cache while 2 x rows vectors of 16 partial sums stay in registers;
- every output is summed in one order (inputs ascending, one fused multiply-add each, bias last) for any
  number of rows, so each row of a tree gets the bits it gets alone (`tests/kernels/test_stream_linear.py`).

It is C++ with AVX-512 intrinsics, built on first use by `torch.utils.cpp_extension` (about 20 s, once;
torch caches the build) with the system compiler and ninja. `available()` says whether it can run here:
an x86-64 CPU with AVX-512 and a build that succeeded; otherwise `specframe.runtime.packed_linear` uses
oneDNN.
`linear_reference` is the PyTorch product it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from specframe_kernels.cpu_build import build

MAX_ROWS = 12  # rows per product: 2 x 12 accumulators, 2 weight vectors and a broadcast fill 27 registers
SOURCE = Path(__file__).with_name("stream_linear.cpp")


@cache  # one build per process; torch caches the compiled library across processes
def _extension():
    """The compiled extension, or None where it cannot run here (`cpu_build.build`)."""
    return build("specframe_stream_linear", SOURCE, [])


def available() -> bool:
    """Whether the kernel runs here: an AVX-512 CPU and a successful build (made now if not yet)."""
    return _extension() is not None


@dataclass(frozen=True)
class StreamWeight:
    """A weight laid out for `linear` (`pack`), with the shape it came from."""

    packed: torch.Tensor  # [in chunks of 64][out blocks of 32][64][32], zero-padded
    in_features: int
    out_features: int


def pack(weight: torch.Tensor) -> StreamWeight:
    """`weight` ([out, in], float32, CPU) laid out for `linear`: a copy of the same size, rounded up to
    32 outputs and 64 inputs."""
    out_features, in_features = weight.shape
    return StreamWeight(_extension().pack(weight.detach().contiguous()), in_features, out_features)


def linear(x: torch.Tensor, weight: StreamWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x` ([..., in], float32, at most `MAX_ROWS` rows in all) times `weight`, plus `bias`: what
    `torch.nn.functional.linear` computes, summed in one order for any row count."""
    if x.shape[-1] != weight.in_features:
        raise ValueError(f"stream_linear.linear: x has {x.shape[-1]} features, the weight "
                         f"{weight.in_features} inputs")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = _extension().linear(flat, weight.packed, weight.out_features, bias)
    return out.view(*x.shape[:-1], weight.out_features)


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The product `linear` computes, in PyTorch: float32 sums differ from it only in rounding."""
    return torch.nn.functional.linear(x, weight, bias)
