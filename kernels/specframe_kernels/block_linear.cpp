// y = x @ W^T (+ b) for float32 rows on a CPU with AVX-512, where W is held as the 4- or 8-bit codes and
// per-block scales it was dequantized from (block_linear.py: which weights, and why).
//
// The weights stream past in tiles of 16 outputs; each tile is dequantized once per pass, into the very
// float32 values the model holds (scale * code, plus the block's offset for 4-bit codes, rounded after
// each operation as the dequantizer rounded them), and multiplied into up to kMaxRows rows kept in
// registers. Each output is summed in one order (the inputs in ascending order, one fused multiply-add
// each, from zero; bias added last) whatever the number of rows, so a row gets the same bits alone as
// inside a tree, and the same bits as stream_linear.cpp gets from the dequantized matrix.
//
// Build with -ffp-contract=off: a fused scale * code + offset would round once, not as the model's
// weights were rounded.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

namespace {

constexpr int64_t kTile = 16;   // outputs per tile: one vector of floats
constexpr int64_t kBlock = 32;  // inputs per quantization block (one scale, one offset)
constexpr int kMaxRows = 16;    // accumulators per pass; with the tile's temporaries, 22 of 32 registers

// T tiles of 4-bit codes at a time (independent sums, so that one row still keeps the FMA units busy):
// tile t's `codes` start at codes + t * code_stride, [in / 2][16] bytes, byte j of pair p holding input
// 2p of output j in its low half and input 2p + 1 in its high half; its `scale` and `offset`, [in / 32][16],
// at t * block_stride. Partial sums go to sums[t][r][16].
template <int R, int T>
void tiles_4bit(const float* x, int64_t in, const uint8_t* codes, int64_t code_stride, const float* scale,
                const float* offset, int64_t block_stride, float* sums) {
  __m512 acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi32(0xF);
  for (int64_t k0 = 0; k0 < in; k0 += kBlock) {
    __m512 d[T], m[T];
    for (int t = 0; t < T; ++t) {
      d[t] = _mm512_loadu_ps(scale + t * block_stride + (k0 / kBlock) * kTile);
      m[t] = _mm512_loadu_ps(offset + t * block_stride + (k0 / kBlock) * kTile);
    }
    for (int64_t k = k0; k < k0 + kBlock; k += 2) {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m512i pair = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + t * code_stride + k * 8)));
        const __m512 w0 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(pair, low)), d[t]), m[t]);
        const __m512 w1 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(pair, 4)), d[t]), m[t]);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          acc[t][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * in + k]), w0, acc[t][r]);
          acc[t][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * in + k + 1]), w1, acc[t][r]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(sums + (t * R + r) * kTile, acc[t][r]);
}

// T tiles of signed 8-bit codes at a time: [in][16] codes each, scales [in / 32][16]; no offset.
template <int R, int T>
void tiles_8bit(const float* x, int64_t in, const int8_t* codes, int64_t code_stride, const float* scale,
                int64_t block_stride, float* sums) {
  __m512 acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < in; k0 += kBlock) {
    __m512 d[T];
    for (int t = 0; t < T; ++t) d[t] = _mm512_loadu_ps(scale + t * block_stride + (k0 / kBlock) * kTile);
    for (int64_t k = k0; k < k0 + kBlock; ++k) {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m512i q = _mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + t * code_stride + k * kTile)));
        const __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d[t]);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[t][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * in + k]), w, acc[t][r]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(sums + (t * R + r) * kTile, acc[t][r]);
}

// Tiles per pass for R rows: enough independent sums to cover the FMA latency, within the registers.
constexpr int tiles_for(int rows) { return rows <= 2 ? 4 : rows <= 8 ? 2 : 1; }

// R rows of x (row-major, `in` wide) times every tile, into y (row-major, `out` wide) plus bias. Tiles
// past the last (when the tile count is not a multiple of T) are computed one at a time: each output's
// sum is the same either way.
template <int R>
void product(const float* x, int64_t in, const void* codes, bool four_bit, const float* scale,
             const float* offset, int64_t out, const float* bias, float* y) {
  constexpr int T = tiles_for(R);
  const int64_t tiles = (out + kTile - 1) / kTile, blocks = in / kBlock;
  const int64_t code_stride = four_bit ? in / 2 * kTile : in * kTile, block_stride = blocks * kTile;
  const int64_t groups = (tiles + T - 1) / T;
  at::parallel_for(0, groups, 4, [&](int64_t first, int64_t end) {
    float sums[T * R * kTile];
    for (int64_t g = first; g < end; ++g) {
      const int64_t t0 = g * T, count = std::min<int64_t>(T, tiles - t0);
      for (int64_t t = t0; t < t0 + count; t += (count == T ? T : 1)) {
        const int width_tiles = count == T ? T : 1;
        float* part = sums + (t - t0) * R * kTile;
        const float* d = scale + t * block_stride;
        if (four_bit) {
          const uint8_t* c = static_cast<const uint8_t*>(codes) + t * code_stride;
          if (width_tiles == T) tiles_4bit<R, T>(x, in, c, code_stride, d, offset + t * block_stride, block_stride, part);
          else tiles_4bit<R, 1>(x, in, c, code_stride, d, offset + t * block_stride, block_stride, part);
        } else {
          const int8_t* c = static_cast<const int8_t*>(codes) + t * code_stride;
          if (width_tiles == T) tiles_8bit<R, T>(x, in, c, code_stride, d, block_stride, part);
          else tiles_8bit<R, 1>(x, in, c, code_stride, d, block_stride, part);
        }
      }
      for (int64_t t = t0; t < t0 + count; ++t) {
        const float* tile_sums = sums + (t - t0) * R * kTile;
        const int64_t n0 = t * kTile, width = std::min(kTile, out - n0);
        for (int r = 0; r < R; ++r) {
          for (int64_t j = 0; j < width; ++j) {
            const float s = tile_sums[r * kTile + j];
            y[r * out + n0 + j] = bias ? s + bias[n0 + j] : s;
          }
        }
      }
    }
  });
}

void rows_product(int rows, const float* x, int64_t in, const void* codes, bool four_bit, const float* scale,
                  const float* offset, int64_t out, const float* bias, float* y) {
  switch (rows) {
#define SPECFRAME_ROWS(R) \
  case R: product<R>(x, in, codes, four_bit, scale, offset, out, bias, y); break;
    SPECFRAME_ROWS(1) SPECFRAME_ROWS(2) SPECFRAME_ROWS(3) SPECFRAME_ROWS(4) SPECFRAME_ROWS(5) SPECFRAME_ROWS(6)
    SPECFRAME_ROWS(7) SPECFRAME_ROWS(8) SPECFRAME_ROWS(9) SPECFRAME_ROWS(10) SPECFRAME_ROWS(11) SPECFRAME_ROWS(12)
    SPECFRAME_ROWS(13) SPECFRAME_ROWS(14) SPECFRAME_ROWS(15) SPECFRAME_ROWS(16)
#undef SPECFRAME_ROWS
  }
}

}  // namespace

// x [rows, in] (any number of rows, multiplied kMaxRows at a time) times the weight whose codes
// (uint8 [tiles, in / 2, 16] for 4-bit, int8 [tiles, in, 16] for 8-bit), scales ([tiles, in / 32, 16]) and
// 4-bit offsets (same shape; empty for 8-bit) block_linear.py laid out, plus `bias` if given.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                     const torch::Tensor& offset, int64_t out, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu() && x.is_contiguous(),
              "block_linear.linear: expected 2-d contiguous float32 CPU rows");
  const int64_t rows = x.size(0), in = x.size(1), tiles = (out + kTile - 1) / kTile;
  const bool four_bit = codes.scalar_type() == torch::kUInt8;
  TORCH_CHECK(in % kBlock == 0 && codes.dim() == 3 && codes.size(0) == tiles && codes.is_contiguous() &&
                  codes.size(1) == (four_bit ? in / 2 : in) && codes.size(2) == kTile &&
                  (four_bit || codes.scalar_type() == torch::kInt8),
              "block_linear.linear: the codes do not match ", in, " inputs and ", out, " outputs");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == tiles * (in / kBlock) * kTile &&
                  (four_bit ? offset.sizes() == scale.sizes() && offset.is_contiguous() &&
                                  offset.scalar_type() == torch::kFloat32
                            : offset.numel() == 0),
              "block_linear.linear: the scales or offsets do not match the codes");
  torch::Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b.numel() == out && b.scalar_type() == torch::kFloat32, "block_linear.linear: bad bias");
  }
  auto y = torch::empty({rows, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const float* op = four_bit ? offset.data_ptr<float>() : nullptr;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int chunk = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
    rows_product(chunk, xp + r0 * in, in, codes.data_ptr(), four_bit, scale.data_ptr<float>(), op, out, bp,
                 y.data_ptr<float>() + r0 * out);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &linear, "x [rows, in] times a weight held as block codes and scales, plus bias");
  m.attr("max_rows") = kMaxRows;
}
