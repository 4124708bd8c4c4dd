"""Linear layers that multiply by weights pre-packed for oneDNN: fast trees on the CPU, in float32.

Speculative decoding pays when a forward over the N rows of a tree costs about one plain step. On the
CPUs we measured, `torch.nn.functional.linear` breaks that: one row runs as a matrix-vector product,
2-16 rows as a matrix product that re-packs the whole weight matrix on every call, so SmolLM2's
matrices cost two to three times more for 4 rows than for one (its 49152-row output layer above all).
oneDNN with a weight packed once into its blocked layout costs about the same for 1 to 8 rows and less
than the plain kernel for one row. `docs/explanation/metrics-and-costs.md` has the measured
step costs with and without packing.

`pack_linear_layers(model)` replaces every `torch.nn.Linear` of a model by a `PackedLinear` that holds
the same parameters (state dicts, tied weights and `.weight` readers are unchanged) and keeps a packed
copy beside them, made on first use and made again whenever the weight changes in place. It uses the
packed copy only where that gives the same function: CPU, float32, no gradient to record. Anything else
(training, half precision, another device) runs `torch.nn.functional.linear` as before. The result is
the same product summed in another order: logits move by about 1e-5. A module that asks for it
(`bfloat16=True`: the `s4c` drafter's heads) is also packed in bfloat16 where the CPU multiplies
bfloat16 natively (`native_bfloat16`), at half the memory traffic of float32.

oneDNN's bfloat16 kernels give every row of a product of 2 to `INVARIANT_ROWS` rows the same bits, and
switch kernels above. A single row gets those bits too on CPUs with AMX (Intel Sapphire Rapids on), but
not on all CPUs with AVX-512 BF16 alone: on an AMD EPYC (Zen 4), SmolLM2's 1536-input layers multiply one
row by a kernel that sums in another order, and about one output in 6,000 rounds to other bfloat16 bits.
So a layer packed with `exact_rows=n` multiplies a single row as two (the row twice, one result kept),
and inputs of more rows, up to n, in blocks of `INVARIANT_ROWS` rows: a tree forward of up to n rows then
computes each row as a plain step would (what the exact rows of `specframe.runtime.attention` need from
the linears). Larger inputs (prompts, read by the same call whether decoding is speculative or not) run
as one product. That holds for SmolLM2's shapes, not for every shape: a bfloat16 layer from 32 inputs to
49152 outputs keeps only 6 rows exact at two threads and 1 at one. So `invariant_rows` measures how many
rows a layer keeps exact on the CPU it runs on, packed or not, for
`specframe.runtime.attention.exact_rows`.

`load_target` packs CPU float32 models by default, and bfloat16 ones where the CPU multiplies bfloat16
natively (`bfloat16=True`, `exact_rows=EXACT_ROWS`); `SPECFRAME_CPU_LINEAR=torch` turns it off.

`SPECFRAME_CPU_LINEAR=blocks` (`blocks=True`; the default, `auto`, chooses it where the kernel runs)
multiplies float32 inputs of up to `BLOCK_ROWS` rows by `specframe_kernels.block_linear` wherever a
layer's float32 weights are the exact dequantization of 4- or 8-bit blocks (a model loaded from a GGUF
file, such as SmolLM2's Q4_1): it reads the codes, a fifth of the bytes, computes with the same float32
weights, and gives each row the bits that row alone gets. Layers whose weights are not such blocks, and
larger inputs (prompts), run through oneDNN. Without AVX-512, or where the kernel does not build, `auto`
packs for oneDNN alone (and an explicit `blocks` warns).

`SPECFRAME_CPU_LINEAR=stream` (`stream=True`) multiplies float32 inputs of up to 12 rows by
`specframe_kernels.stream_linear` instead, where the CPU has AVX-512: a kernel of ours that reads each
weight once for up to 12 rows, where oneDNN's cost jumps at 7, and sums each row in one order for any
row count. Larger inputs (prompts) still run through oneDNN. Without AVX-512, or where the kernel does not
build, `load_target` warns and packs for oneDNN alone.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from specframe.support.settings import env_choice

if TYPE_CHECKING:
    from specframe_kernels.stream_linear import StreamWeight

ENV = "SPECFRAME_CPU_LINEAR"
# The values of `ENV`: `block_linear` where it runs and oneDNN elsewhere (the default), oneDNN with packed
# weights, torch's own linear, `stream_linear` for tree-sized products and oneDNN for the rest, or
# `block_linear` (warning where it cannot run).
KERNELS = ("auto", "onednn", "torch", "stream", "blocks")
# The most rows `block_linear` multiplies (every row exact); more (a prompt) go to oneDNN: the same bound
# as exact attention's (`specframe.runtime.attention.EXACT_ROWS`).
BLOCK_ROWS = 64
# The most rows for which oneDNN's bfloat16 kernels give each row the same bits as a product of that row
# alone (measured on AVX-512 and AMX CPUs: `tests/core/runtime/test_exact_attention.py`).
INVARIANT_ROWS = 32


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (x86 and most ARM builds do)."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
            and hasattr(ops, "_reorder_linear_weight"))


def chosen_kernel() -> str:
    """The CPU linear kernel `SPECFRAME_CPU_LINEAR` asks for: auto (the default), onednn, torch, stream
    or blocks."""
    return env_choice(ENV, KERNELS, "CPU linear kernel")


@cache  # a property of the CPU and the torch build
def native_bfloat16() -> bool:
    """Whether oneDNN multiplies bfloat16 natively on this CPU (AVX-512 BF16 or AMX), so that a bfloat16
    product reads half the bytes of a float32 one at no loss of speed."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return onednn_available() and check is not None and bool(check())


class PackedLinear(torch.nn.Linear):
    """`torch.nn.Linear` over the same parameters, multiplying by a oneDNN-packed copy of the weight
    where that computes the same function (see the module docstring); `bfloat16=True` packs bfloat16
    weights too, where the CPU has native bfloat16. Inputs of at most `exact_rows` rows give each row
    the bits that row alone would get (multiplied in blocks of `INVARIANT_ROWS`); 0 leaves that to the
    kernel. `stream=True` multiplies float32 inputs of up to `stream_linear.MAX_ROWS` rows by
    `specframe_kernels.stream_linear` (the caller checks `stream_linear.available()`); `blocks=True`
    multiplies float32 inputs of up to `BLOCK_ROWS` rows by `specframe_kernels.block_linear` while the
    weight is the dequantization of 4- or 8-bit blocks (the caller checks `block_linear.available()`)."""

    def __init__(self, linear: torch.nn.Linear, *, bfloat16: bool = False, exact_rows: int = 0,
                 stream: bool = False, blocks: bool = False):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameter objects
        self._dtypes = (torch.float32, torch.bfloat16) if bfloat16 and native_bfloat16() else (torch.float32,)
        self._packed: torch.Tensor | None = None
        self._packed_from: tuple | None = None
        self._streamed: StreamWeight | None = None
        self._streamed_from: tuple | None = None
        self._blocked: tuple | None = None  # (the weight's stamp, its BlockWeight or None)
        self.exact_rows = exact_rows
        self.stream = stream
        self.blocks = blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._packable(x):
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        if self.blocks and x.dtype == torch.float32 and 0 < rows <= BLOCK_ROWS:
            blocked = self.block_weight()
            if blocked is not None:
                return _block_kernel().linear(x, blocked, self.bias)
        if self.stream and x.dtype == torch.float32:
            kernel = _stream_kernel()
            if 0 < rows <= kernel.MAX_ROWS:
                return kernel.linear(x, self._streamed_weight(), self.bias)
        x, weight = x.contiguous(), self._packed_weight()
        if not self.exact_rows or rows > self.exact_rows:
            return self._product(x, weight)
        flat = x.view(rows, self.in_features)
        blocks = [self._exact_product(flat[start:start + INVARIANT_ROWS], weight)
                  for start in range(0, rows, INVARIANT_ROWS)]
        out = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
        return out.view(*x.shape[:-1], self.out_features)

    def _product(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, weight, self.bias, "none", [], "")

    def _exact_product(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The product of up to `INVARIANT_ROWS` rows, a single row multiplied as two (see the module
        docstring: some CPUs take another kernel for one row)."""
        if len(x) > 1:
            return self._product(x, weight)
        return self._product(x.expand(2, -1).contiguous(), weight)[:1]

    def __getstate__(self):
        """Copies and pickles leave the packed copy out (oneDNN's opaque tensors cannot be copied)."""
        state = dict(self.__dict__)
        state["_packed"], state["_packed_from"] = None, None
        state["_streamed"], state["_streamed_from"] = None, None
        state["_blocked"] = None
        return state

    def _packable(self, x: torch.Tensor) -> bool:
        weight = self.weight
        if x.device.type != "cpu" or weight.device.type != "cpu":
            return False
        if x.dtype not in self._dtypes or weight.dtype != x.dtype:
            return False
        if self.bias is not None and self.bias.dtype != x.dtype:
            return False
        return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))

    def _packed_weight(self) -> torch.Tensor:
        """The oneDNN-packed copy of the weight."""
        return self._copy("_packed", lambda w: torch.ops.mkldnn._reorder_linear_weight(w, None))

    def _streamed_weight(self) -> StreamWeight:
        """The `stream_linear` layout of the weight."""
        return self._copy("_streamed", lambda w: _stream_kernel().pack(w))

    def block_weight(self):
        """The weight as the 4- or 8-bit blocks it was dequantized from (`block_linear.recover`), or
        None where it is not such blocks; found at first use and again when the weight changes."""
        stamp = self._stamp()
        if self._blocked is None or self._blocked[0] != stamp:
            self._blocked = (stamp, _block_kernel().recover(self.weight.detach()))
        return self._blocked[1]

    def _stamp(self) -> tuple:
        """What changes when the weight is replaced or changed in place: when copies are made again."""
        source = self.weight
        return source.data_ptr(), source._version, tuple(source.shape)

    def _copy(self, name: str, make):
        """The copy of the weight held in attribute `name` (its stamp in `name + "_from"`), made by `make`
        at first use and again when the weight was replaced or changed in place."""
        source, stamp = self.weight, self._stamp()
        if getattr(self, name) is None or stamp != getattr(self, name + "_from"):
            with torch.inference_mode(False), torch.no_grad():  # a plain tensor, usable in any mode
                setattr(self, name, make(source.detach()))
            setattr(self, name + "_from", stamp)
        return getattr(self, name)


@cache  # the import statement is not free, and this runs for every small product
def _stream_kernel():
    """`specframe_kernels.stream_linear`, imported at first use: `import specframe` loads no other package
    of this distribution (`tests/core/plugging/test_registry.py`)."""
    from specframe_kernels import stream_linear

    return stream_linear


@cache
def _block_kernel():
    """`specframe_kernels.block_linear`, imported at first use (see `_stream_kernel`)."""
    from specframe_kernels import block_linear

    return block_linear


def pack_linear_layers(model: torch.nn.Module, *, bfloat16: bool = False, exact_rows: int = 0,
                       stream: bool = False, blocks: bool = False) -> int:
    """Replace each `torch.nn.Linear` (exactly that class: subclasses may change `forward`) of `model`
    by a `PackedLinear` over the same parameters (`bfloat16`, `exact_rows`, `stream`, `blocks`: see
    `PackedLinear`); the number replaced. With `blocks`, each layer's blocks are looked for now (about
    10 s for SmolLM2), so that `linear_kernel` can say what the model runs. A no-op without oneDNN."""
    if not onednn_available():
        return 0
    swaps = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if type(child) is torch.nn.Linear]
    for parent, name, child in swaps:
        packed = PackedLinear(child, bfloat16=bfloat16, exact_rows=exact_rows, stream=stream, blocks=blocks)
        if blocks and child.weight.dtype == torch.float32:
            packed.block_weight()
        setattr(parent, name, packed)
    return len(swaps)


def invariant_rows(linear: torch.nn.Linear, limit: int) -> int:
    """The most rows m <= `limit` such that `linear` (in its weight's dtype) gives every row of a product
    of up to m rows the bits that row alone gets: measured, not assumed, because it depends on the
    kernels the CPU and the torch build choose (oneDNN's bfloat16 kernels keep fewer rows invariant than a
    `PackedLinear` with `exact_rows=64`, which keeps all 64: docs/explanation/metrics-and-costs.md).
    Kernels are chosen by the class, shapes, types and thread count, not by the values, so the first
    layer of each such kind is probed on random inputs, once per process. A kernel that sums in another
    order changes only the outputs whose float32 sum lies near a bfloat16 rounding boundary (about one in
    6,000), so each row count is compared over at least `PROBE_OUTPUTS` outputs."""
    if isinstance(linear, PackedLinear) and linear.blocks and linear.block_weight() is not None:
        return min(limit, BLOCK_ROWS)  # `block_linear` sums each row in one order by construction: no probe
    packing = (linear.exact_rows, linear._dtypes) if isinstance(linear, PackedLinear) else None
    dtype = linear.weight.dtype
    kind = (type(linear), linear.in_features, linear.out_features, linear.bias is not None, packing, dtype,
            limit, torch.get_num_threads())
    if kind not in _PROBED:
        _PROBED[kind] = _probe_rows(linear, dtype, limit)
    return _PROBED[kind]


_PROBED: dict[tuple, int] = {}  # what `invariant_rows` measured, by kind of layer


# Outputs compared for each row count: a kernel that rounds one output in 6,000 otherwise (the AMD EPYC
# of the module docstring) then shows about 20 differences, and one as rare as one in 30,000 about 4.
PROBE_OUTPUTS = 1 << 17


def _probe_rows(linear: torch.nn.Linear, dtype: torch.dtype, limit: int) -> int:
    generator = torch.Generator().manual_seed(0)
    count = max(limit, -(-PROBE_OUTPUTS // linear.out_features))
    x = torch.randn(count, linear.in_features, generator=generator).to(dtype)
    with torch.inference_mode():
        alone = torch.cat([linear(x[row:row + 1]) for row in range(count)])
        for rows in range(2, limit + 1):
            whole = count - count % rows
            together = torch.cat([linear(x[start:start + rows]) for start in range(0, whole, rows)])
            if not torch.equal(together, alone[:whole]):
                return rows - 1
    return limit


def linear_kernel(model: torch.nn.Module) -> str:
    """"blocks" when some of `model`'s linear layers multiply their 4- or 8-bit blocks by `block_linear`,
    "stream" when they use `stream_linear` for small products, "onednn" when they are packed for oneDNN
    alone, else "torch": a key of measured step costs."""
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    if not packed:
        return "torch"
    if any(m.blocks and m.block_weight() is not None for m in packed):
        return "blocks"
    return "stream" if any(m.stream for m in packed) else "onednn"
