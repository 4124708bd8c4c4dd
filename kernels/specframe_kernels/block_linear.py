"""A float32 CPU linear that reads weights as the 4- or 8-bit blocks they were dequantized from.

A model loaded from a GGUF file (SmolLM2's Q4_1: 4-bit layers, an 8-bit output layer) is dequantized to
float32 by transformers, and then every step reads 4 bytes for each weight that its file stores in about
half a byte: the plain step is bound by reading 540 MB where 100 MB hold the same numbers. This kernel
(`block_linear.cpp`) reads the codes instead and computes with the same float32 weights:

- `recover(weight)` finds, for every block of 32 inputs of a float32 matrix, the float16 scale (and for
  4-bit codes the float16 offset) and the codes whose dequantization (`scale * code + offset`, rounded
  after each operation, as GGUF dequantizers compute it) gives back every weight bit for bit; it returns
  None where any block does not, and the layer stays as it was. It recognises the layouts of GGUF's Q4_1
  and Q8_0 (and Q4_0, as 8-bit codes), and of any format with those block equations, without reading
  the file: the float32 matrix itself is the evidence.
- `linear(x, weight)` dequantizes each tile of 16 outputs once per pass, in registers, and multiplies it
  into up to 16 rows at a time. Each output is summed in one order (inputs ascending, one fused
  multiply-add each, bias last) for any row count, so a row of a tree gets the bits that row alone gets
  (`tests/kernels/test_block_linear.py`), and the bits `stream_linear` gets from the float32 matrix.

It is C++ with AVX-512 intrinsics, built on first use by `torch.utils.cpp_extension` (about a minute, once;
torch caches the build) with the system compiler and ninja. `available()` says whether it can run here:
an x86-64 CPU with AVX-512 and a build that succeeded; otherwise `specframe.runtime.packed_linear` uses
oneDNN. `dequantize` and `torch.nn.functional.linear` are the PyTorch reference it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from specframe_kernels.cpu_build import build

MAX_ROWS = 16  # rows per pass: larger products run as several passes, each row summed the same way
BLOCK = 32  # inputs per quantization block (GGUF's Q4_0, Q4_1 and Q8_0 blocks)
TILE = 16  # outputs per tile: one AVX-512 vector
SOURCE = Path(__file__).with_name("block_linear.cpp")
NAME = "specframe_block_linear"  # the extension's name: torch caches its build under it

@cache  # one build per process; torch caches the compiled library across processes
def _extension():
    """The compiled extension, or None where it cannot run here (`cpu_build.build`)."""
    # -ffp-contract=off: scale * code + offset rounds twice, as the weights were rounded (see the .cpp)
    return build(NAME, SOURCE, ["-mavx512bw", "-ffp-contract=off"],
                 announce="building the block_linear CPU kernel once (about a minute)...")


def available() -> bool:
    """Whether the kernel runs here: an AVX-512 CPU and a successful build (made now if not yet)."""
    return _extension() is not None


@dataclass(frozen=True)
class BlockWeight:
    """A float32 weight [out, in] held as codes and per-block scales (and offsets, for 4-bit codes),
    laid out in tiles of `TILE` outputs for `linear`; `bits` is 4 or 8."""

    codes: torch.Tensor  # 4-bit: uint8 [tiles, in / 2, TILE], two inputs a byte; 8-bit: int8 [tiles, in,
    #                      TILE]
    scale: torch.Tensor  # float32 [tiles, in / BLOCK, TILE]
    offset: torch.Tensor  # float32, like `scale` for 4-bit codes; empty for 8-bit ones
    in_features: int
    out_features: int

    @property
    def bits(self) -> int:
        return 4 if self.codes.dtype == torch.uint8 else 8

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.offset))


def recover(weight: torch.Tensor) -> BlockWeight | None:
    """The codes and scales that `weight` (float32 [out, in], CPU) was dequantized from, laid out for
    `linear`: 4-bit codes with an offset per block where every block fits that equation, else signed
    8-bit codes where every block fits theirs, else None (a weight trained or stored in float: nothing
    to gain, nothing lost)."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.shape[1] % BLOCK or weight.numel() == 0:
        return None
    with torch.inference_mode(False), torch.no_grad():
        blocks = weight.detach().reshape(weight.shape[0], -1, BLOCK)
        found = _affine_4bit(blocks)
        if found is not None:
            return _lay_out(*found, bits=4)
        found = _symmetric_8bit(blocks)
        return None if found is None else _lay_out(*found, torch.empty(0), bits=8)


def _half_neighbours(value: torch.Tensor, steps: int = 2):
    """`value` rounded to float16, then the float16 numbers up to `steps` apart (nearest first), as float32:
    the scales a quantizer may have stored for a block whose float32 ideal scale is `value`. Lazily: the
    first one usually fits every block."""
    bits = value.to(torch.float16).view(torch.int16)
    for step in [0, *[s for k in range(1, steps + 1) for s in (k, -k)]]:
        near = (bits + step).view(torch.float16).float()
        yield torch.where(torch.isfinite(near), near, 0.0)


def _affine_4bit(blocks: torch.Tensor):
    """(codes, scale, offset) with blocks == scale * codes + offset (codes 0-15, float16 scale and
    offset, rounded after each operation), or None. A block's offset is its least weight (its code-0
    weight is the offset itself), its scale near a fifteenth of its spread."""
    low = blocks.amin(-1, keepdim=True)
    if not torch.equal(low.half().float(), low):
        return None
    spread = blocks.amax(-1, keepdim=True) - low
    return _first_exact(blocks, _half_neighbours(spread / 15), lambda d: (blocks - low) / d, 0, 15, low)


def _symmetric_8bit(blocks: torch.Tensor):
    """(codes, scale) with blocks == scale * codes (codes -128 to 127, a float16 scale), or None:
    Q8_0 (scale near the largest magnitude / 127) and Q4_0 (codes -8 to 7: near it / 8)."""
    top = blocks.abs().amax(-1, keepdim=True)
    candidates = (d for ideal in (top / 127, top / 8, -top / 8) for d in _half_neighbours(ideal))
    return _first_exact(blocks, candidates, lambda d: blocks / d, -128, 127, None)


def _first_exact(blocks, candidates, ratio, lowest, highest, offset):
    """For each block, the first candidate scale whose rounded codes reproduce it exactly; None unless
    every block has one. A zero scale is tried as 1: its blocks are constant (their codes are 0) or it
    reproduces nothing."""
    scale = codes = open_ = None
    for d in candidates:
        q = ratio(torch.where(d == 0, 1.0, d)).round_().clamp_(lowest, highest)
        again = q * d if offset is None else q * d + offset
        if open_ is None and torch.equal(again, blocks):  # the usual case: the first fits every block
            return (q, d) if offset is None else (q, d, offset)
        exact = (again == blocks).all(-1, keepdim=True)
        if open_ is None:
            scale, codes, open_ = torch.where(exact, d, 0.0), torch.where(exact, q, 0.0), ~exact
        else:
            exact &= open_
            scale, codes = torch.where(exact, d, scale), torch.where(exact, q, codes)
            open_ &= ~exact
        if not open_.any():
            return (codes, scale) if offset is None else (codes, scale, offset)
    return None


def _lay_out(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, *, bits: int) -> BlockWeight:
    """Codes [out, blocks, 32] and scales/offsets [out, blocks, 1] in the kernel's tiles of `TILE` outputs
    (padded with zero weights)."""
    out, blocks, _ = codes.shape
    tiles = -(-out // TILE)

    def tiled(t: torch.Tensor, dtype) -> torch.Tensor:  # [out, ...] -> [tiles, ..., TILE]
        t = t.reshape(out, -1).to(dtype)
        padded = torch.zeros((tiles * TILE, t.shape[1]), dtype=dtype)
        padded[:out] = t
        return padded.view(tiles, TILE, -1).transpose(1, 2).contiguous()

    scales = tiled(scale, torch.float32)
    offsets = tiled(offset, torch.float32) if bits == 4 else torch.empty(0)
    if bits == 8:
        return BlockWeight(tiled(codes, torch.int8), scales, offsets, blocks * BLOCK, out)
    nibbles = tiled(codes, torch.uint8)  # [tiles, in, TILE]
    packed = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)  # byte j of pair p: inputs 2p, 2p + 1 of output j
    return BlockWeight(packed.contiguous(), scales, offsets, blocks * BLOCK, out)


def dequantize(weight: BlockWeight) -> torch.Tensor:
    """The float32 matrix [out, in] that `weight` holds, computed in PyTorch (the reference)."""
    if weight.bits == 4:
        codes = torch.stack([weight.codes & 0xF, weight.codes >> 4], dim=2).flatten(1, 2)
    else:
        codes = weight.codes
    per_input = codes.float()  # [tiles, in, TILE]
    scale = weight.scale.repeat_interleave(BLOCK, dim=1)
    values = per_input * scale
    if weight.bits == 4:
        values = values + weight.offset.repeat_interleave(BLOCK, dim=1)
    return values.transpose(1, 2).reshape(-1, weight.in_features)[:weight.out_features]


def linear(x: torch.Tensor, weight: BlockWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x` ([..., in], float32, any number of rows) times `weight`, plus `bias`: what
    `torch.nn.functional.linear` computes with the dequantized matrix, summed in one order for any
    row count."""
    if x.shape[-1] != weight.in_features:
        raise ValueError(f"block_linear.linear: x has {x.shape[-1]} features, the weight "
                         f"{weight.in_features} inputs")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = _extension().linear(flat, weight.codes, weight.scale, weight.offset, weight.out_features, bias)
    return out.view(*x.shape[:-1], weight.out_features)
