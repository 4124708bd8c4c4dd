// y = x @ W^T (+ b) for 1 to 12 rows of float32 on a CPU with AVX-512: the products of a tree forward.
//
// A tree of a few nodes is a product of a few rows by each weight matrix, so its cost is reading the
// weights from memory once, if the kernel reads them once. Each output is summed in one order (the
// inputs in ascending order, one fused multiply-add each, bias added last) whatever the number of rows,
// so a row gets the same bits alone as inside a tree. stream_linear.py explains the layout and when
// specframe uses this kernel.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;  // outputs per block: two vectors of 16 floats
constexpr int64_t kChunk = 64;  // inputs per pass: a chunk of x and of a block's weights stay in L1
constexpr int kMaxRows = 12;    // 2 x 12 accumulators, 2 weight vectors and 1 broadcast: 27 of 32 registers

// Sums `depth` inputs of one chunk into the [R][32] partial sums `acc` (zeroed first when `first`).
// `xt` is the chunk of x transposed ([depth][R]), `w` the chunk of one block ([depth][32]).
template <int R>
void chunk_of_block(const float* xt, int64_t depth, const float* w, float* acc, bool first) {
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    lo[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + kBlock * r);
    hi[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + kBlock * r + 16);
  }
  for (int64_t k = 0; k < depth; ++k) {
    const __m512 w_lo = _mm512_loadu_ps(w + k * kBlock), w_hi = _mm512_loadu_ps(w + k * kBlock + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(xt[k * R + r]);
      lo[r] = _mm512_fmadd_ps(x, w_lo, lo[r]);
      hi[r] = _mm512_fmadd_ps(x, w_hi, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(acc + kBlock * r, lo[r]);
    _mm512_storeu_ps(acc + kBlock * r + 16, hi[r]);
  }
}

template <int R>
void product(const float* xt, int64_t in, const float* packed, int64_t out, const float* bias, float* y) {
  const int64_t blocks = (out + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, 1, [&](int64_t first_block, int64_t end_block) {
    std::vector<float> acc((end_block - first_block) * R * kBlock);
    for (int64_t k0 = 0; k0 < in; k0 += kChunk) {  // chunk-major: one pass reads one contiguous stream
      const int64_t depth = std::min(kChunk, in - k0);
      const float* chunk = packed + (k0 / kChunk) * blocks * kChunk * kBlock;
      for (int64_t b = first_block; b < end_block; ++b) {
        chunk_of_block<R>(xt + k0 * R, depth, chunk + b * kChunk * kBlock,
                          acc.data() + (b - first_block) * R * kBlock, k0 == 0);
      }
    }
    for (int64_t b = first_block; b < end_block; ++b) {
      const float* sums = acc.data() + (b - first_block) * R * kBlock;
      const int64_t n0 = b * kBlock, width = std::min(kBlock, out - n0);
      for (int r = 0; r < R; ++r) {
        for (int64_t j = 0; j < width; ++j) {
          const float s = sums[r * kBlock + j];
          y[r * out + n0 + j] = bias ? s + bias[n0 + j] : s;
        }
      }
    }
  });
}

}  // namespace

// The weight [out, in] laid out for `linear`: [in chunks][out blocks][kChunk][kBlock], zero-padded.
torch::Tensor pack(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32 && weight.device().is_cpu(),
              "stream_linear.pack: expected a 2-d float32 CPU weight");
  const int64_t out = weight.size(0), in = weight.size(1);
  const int64_t blocks = (out + kBlock - 1) / kBlock, chunks = (in + kChunk - 1) / kChunk;
  auto padded = torch::zeros({blocks * kBlock, chunks * kChunk}, weight.options());
  padded.narrow(0, 0, out).narrow(1, 0, in).copy_(weight);
  return padded.view({blocks, kBlock, chunks, kChunk}).permute({2, 0, 3, 1}).contiguous();
}

// x [rows, in] (1 <= rows <= kMaxRows) times the weight `pack` made of [out, in], plus `bias` if given.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(),
              "stream_linear.linear: expected 2-d float32 CPU rows");
  const int64_t rows = x.size(0), in = x.size(1);
  TORCH_CHECK(rows >= 1 && rows <= kMaxRows, "stream_linear.linear: 1 to ", kMaxRows, " rows, got ", rows);
  TORCH_CHECK(packed.dim() == 4 && packed.size(0) == (in + kChunk - 1) / kChunk &&
                  packed.size(1) == (out + kBlock - 1) / kBlock && packed.is_contiguous(),
              "stream_linear.linear: the packed weight does not match ", in, " inputs and ", out, " outputs");
  const torch::Tensor xt = x.t().contiguous();
  torch::Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b.numel() == out && b.scalar_type() == torch::kFloat32, "stream_linear.linear: bad bias");
  }
  auto y = torch::empty({rows, out}, x.options());
  const float* xp = xt.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  switch (rows) {
#define SPECFRAME_ROWS(R) \
  case R: product<R>(xp, in, wp, out, bp, yp); break;
    SPECFRAME_ROWS(1) SPECFRAME_ROWS(2) SPECFRAME_ROWS(3) SPECFRAME_ROWS(4) SPECFRAME_ROWS(5) SPECFRAME_ROWS(6)
    SPECFRAME_ROWS(7) SPECFRAME_ROWS(8) SPECFRAME_ROWS(9) SPECFRAME_ROWS(10) SPECFRAME_ROWS(11) SPECFRAME_ROWS(12)
#undef SPECFRAME_ROWS
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "the weight [out, in] laid out for linear");
  m.def("linear", &linear, "x [rows <= 12, in] times the packed weight, plus bias");
  m.attr("max_rows") = kMaxRows;
}
