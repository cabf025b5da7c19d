// Matrix products over bf16 weights: y = x @ W^T (+ b), W (n, k) in bf16, x in bf16, fp16 or fp32.
//
// Arithmetic: each output is one fp32 sum over the inputs by pairs, from acc = 0, for p = 0..k/2-1:
//   acc = fma(x_{2p+1}, w_{2p+1}, acc); acc = fma(x_{2p}, w_{2p}, acc)     (x_j and w_j exact in fp32)
// then y = acc (+ b) rounded once to the output's dtype (the order of AVX512-BF16's VDPBF16PS, which is
// not used: it flushes denormals, and measured here it runs slower than two FMAs from 4 rows up). Every
// code path (portable, AVX2, AVX-512) does exactly these operations, so all give the same bits, and a
// row's result depends on that row only, whatever the number of rows.
//
// Weights are reordered once at load into tiles of 16 output columns: for each tile, k / 2 chunks of 64
// bytes, chunk p holding column c's inputs 2p and 2p + 1 at bytes 4c..4c+3. A register of one chunk gives
// 16 columns' input 2p (the low halves) and 2p + 1 (the high halves) in two operations, applied to every
// row of the call: a decoding step reads each weight once, for all the rows of a verify pass.

#pragma once

#include "blocks.h"

namespace tiles {

using blocks::AVX2;
using blocks::AVX512;
using blocks::COLS;  // output columns per tile, as the blocks'
using blocks::Path;
using blocks::tiles;

constexpr int64_t ROWS = 8;    // rows of x per register tile (AVX-512 and AVX2 alike)
constexpr int64_t CHUNK = 64;  // bytes per chunk: 16 columns x 2 inputs
constexpr int64_t AHEAD = 160;  // chunks prefetched ahead (10 KB: measured best of 16-320)

inline int64_t tile_bytes(int64_t k) { return k / 2 * CHUNK; }

inline float bf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// rows[col] (n rows of k bf16 values as uint16: one weight, or several stacked along the outputs) -> the tiled
// layout (tiles(n) * tile_bytes(k)), columns past n zero; the tiles in parallel, each a transpose of 16 columns x
// k/2 pairs (blocks of 16 pairs: whole cache lines read from each row)
inline void pack_rows(const std::vector<const uint16_t*>& rows, int64_t n, int64_t k, uint16_t* out) {
  const int64_t pairs = k / 2, per_tile = tile_bytes(k) / 4;  // uint32 pairs per tile
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  at::parallel_for(0, tiles(n), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      uint32_t* tile = o + t * per_tile;
      const int64_t col0 = t * COLS, cols = std::min(COLS, n - col0);
      if (cols < COLS) std::memset(tile, 0, per_tile * 4);
      for (int64_t q0 = 0; q0 < pairs; q0 += 16) {
        const int64_t q1 = std::min(pairs, q0 + 16);
        for (int64_t c = 0; c < cols; ++c) {
          const uint32_t* row = reinterpret_cast<const uint32_t*>(rows[col0 + c]);
          for (int64_t q = q0; q < q1; ++q) tile[q * COLS + c] = row[q];
        }
      }
    }
  });
}

inline void pack(const uint16_t* w, int64_t n, int64_t k, uint16_t* out) {
  std::vector<const uint16_t*> rows(n);
  for (int64_t col = 0; col < n; ++col) rows[col] = w + col * k;
  pack_rows(rows, n, k, out);
}

// acc (R x 16) of one tile for rows x[0..R-1] (fp32, k apart): the portable path
inline void tile_portable(const uint16_t* tile, int64_t k, const float* x, int64_t R, float* acc) {
  for (int64_t r = 0; r < R; ++r)
    for (int c = 0; c < COLS; ++c) {
      float s = 0.0f;
      for (int64_t q = 0; q < k / 2; ++q) {
        const uint16_t* w = tile + q * (CHUNK / 2) + 2 * c;
        s = std::fma(x[r * k + 2 * q + 1], bf16(w[1]), s);
        s = std::fma(x[r * k + 2 * q], bf16(w[0]), s);
      }
      acc[r * COLS + c] = s;
    }
}

#if SPECULA_X86

template <int R>
SPECULA_AVX512 void tile_avx512(const uint16_t* tile, int64_t k, const float* x, float* acc) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(tile);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 s[R];
  for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps();
  for (int64_t q = 0; q < k / 2; ++q) {
    __builtin_prefetch(p + (q + AHEAD) * CHUNK, 0, 2);
    __m512i w = _mm512_loadu_si512(p + q * CHUNK);
    __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), odd = _mm512_castsi512_ps(_mm512_and_si512(w, high));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      s[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * k + 2 * q + 1]), odd, s[r]);
      s[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * k + 2 * q]), even, s[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + r * COLS, s[r]);
}

template <int R>
SPECULA_AVX2 void tile_avx2(const uint16_t* tile, int64_t k, const float* x, float* acc) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(tile);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int h = 0; h < 2; ++h) {  // columns 8h..8h+7: half a chunk
    __m256 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_ps();
    for (int64_t q = 0; q < k / 2; ++q) {
      if (h == 0) __builtin_prefetch(p + (q + AHEAD) * CHUNK, 0, 2);
      __m256i w = simd::load<__m256i>(p + q * CHUNK + 32 * h);
      __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), odd = _mm256_castsi256_ps(_mm256_and_si256(w, high));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        s[r] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * k + 2 * q + 1]), odd, s[r]);
        s[r] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * k + 2 * q]), even, s[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc + r * COLS + 8 * h, s[r]);
  }
}

#else

template <int R>
void tile_avx512(const uint16_t*, int64_t, const float*, float*) {}
template <int R>
void tile_avx2(const uint16_t*, int64_t, const float*, float*) {}

#endif

template <int R>
void run_tile(Path p, const uint16_t* tile, int64_t k, const float* x, float* acc) {
  if (p >= AVX512) tile_avx512<R>(tile, k, x, acc);
  else if (p == AVX2) tile_avx2<R>(tile, k, x, acc);
  else tile_portable(tile, k, x, R, acc);
}

inline void rows_of_tile(Path p, const uint16_t* tile, int64_t k, const float* x, int64_t n, float* acc) {
  switch (n) {
    case 1: return run_tile<1>(p, tile, k, x, acc);
    case 2: return run_tile<2>(p, tile, k, x, acc);
    case 3: return run_tile<3>(p, tile, k, x, acc);
    case 4: return run_tile<4>(p, tile, k, x, acc);
    case 5: return run_tile<5>(p, tile, k, x, acc);
    case 6: return run_tile<6>(p, tile, k, x, acc);
    case 7: return run_tile<7>(p, tile, k, x, acc);
    default: return run_tile<8>(p, tile, k, x, acc);
  }
}

template <typename T, typename O>
void product(const T* x_in, int64_t rows, int64_t k, const uint16_t* packed, int64_t n, const float* bias, O* y) {
  thread_local std::vector<float> kept;  // x in fp32 (exact for bf16 and fp16)
  std::vector<float>& x = kept;  // the calling thread's, shared with the workers below
  x.resize(rows * k);
  for (int64_t i = 0; i < rows * k; ++i) x[i] = static_cast<float>(x_in[i]);
  const Path p = blocks::path();
  const int64_t per_tile = tile_bytes(k) / 2;
  at::parallel_for(0, tiles(n), 1, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[ROWS * COLS];
    for (int64_t c0 = 0; c0 < rows; c0 += blocks::ROW_CHUNK)  // prompts: a chunk of rows through every tile
      for (int64_t t = begin; t < end; ++t) {
        const int64_t col0 = t * COLS, cols = std::min(COLS, n - col0);
        for (int64_t r0 = c0; r0 < std::min(rows, c0 + blocks::ROW_CHUNK); r0 += ROWS) {
          const int64_t m = std::min(ROWS, rows - r0);
          rows_of_tile(p, packed + t * per_tile, k, x.data() + r0 * k, m, acc);
          blocks::store_rows(acc, m, cols, bias, col0, y + r0 * n, n);
        }
      }
  });
}

// y = x @ W^T (+ bias): x (rows, k) in bf16, fp16 or fp32, `packed` from pack_op for n outputs; y in x's
// dtype, or fp32 when `out_float`.
inline at::Tensor mm(const at::Tensor& x_in, const at::Tensor& packed, int64_t n, const c10::optional<at::Tensor>& bias,
                     bool out_float) {
  TORCH_CHECK(x_in.dim() == 2, "x: (rows, inputs)");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(), "packed: contiguous bf16");
  auto x = x_in.contiguous();
  const int64_t rows = x.size(0), k = x.size(1);
  TORCH_CHECK(k % 2 == 0 && n > 0 && packed.numel() * 2 == tiles(n) * tile_bytes(k),
              "the packed weight does not hold ", n, " outputs of ", k, " inputs");
  at::Tensor b32;
  if (bias) {
    TORCH_CHECK(bias->numel() == n, "a bias per output");
    b32 = bias->to(at::kFloat).contiguous();
  }
  auto y = at::empty({rows, n}, x.options().dtype(out_float ? at::kFloat : x.scalar_type()));
  if (rows == 0) return y;
  const float* bp = bias ? b32.data_ptr<float>() : nullptr;
  const uint16_t* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "tiles_mm", [&] {
    if (out_float) product<scalar_t, float>(x.data_ptr<scalar_t>(), rows, k, w, n, bp, y.data_ptr<float>());
    else product<scalar_t, scalar_t>(x.data_ptr<scalar_t>(), rows, k, w, n, bp, y.data_ptr<scalar_t>());
  });
  return y;
}

// The tiled layout back to w (n, k): each tile's chunks hold its 16 columns' pairs of inputs, so a column's
// row of w is the 4-byte pairs at one place of every chunk (a transpose of k/2 x 16 pairs per tile).
inline void unpack(const uint16_t* packed, int64_t n, int64_t k, uint16_t* w) {
  const int64_t pairs = k / 2, per_tile = tile_bytes(k) / 4;  // uint32 pairs per tile
  const uint32_t* in = reinterpret_cast<const uint32_t*>(packed);
  uint32_t* out = reinterpret_cast<uint32_t*>(w);
  at::parallel_for(0, tiles(n), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint32_t* tile = in + t * per_tile;
      const int64_t col0 = t * COLS, cols = std::min(COLS, n - col0);
      for (int64_t q0 = 0; q0 < pairs; q0 += 16) {  // 16 pairs of every column at a time: whole cache lines
        const int64_t q1 = std::min(pairs, q0 + 16);
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t q = q0; q < q1; ++q) out[(col0 + c) * pairs + q] = tile[q * COLS + c];
      }
    }
  });
}

// that `packed` is the tiled layout of n outputs of k inputs, bf16 and contiguous
inline void check_holds(const at::Tensor& packed, int64_t n, int64_t k) {
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() && n > 0 && k % 2 == 0 &&
              packed.numel() * 2 == tiles(n) * tile_bytes(k), "the packed weight does not hold ", n, " outputs of ", k, " inputs");
}

// y = x @ W^T (+ bias) for a prompt's many rows where only the tiles are kept: W unpacked into the calling
// thread's scratch (kept for its next call: the largest product's size) and multiplied by ATen's product,
// as over the weight itself (the same bits as at::linear over w).
inline at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "x: (rows, inputs)");
  const int64_t k = x.size(1);
  check_holds(packed, n, k);
  thread_local at::Tensor scratch;
  if (!scratch.defined() || scratch.numel() < n * k) scratch = at::empty({n * k}, packed.options());
  at::Tensor w = scratch.narrow(0, 0, n * k).view({n, k});
  unpack(reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()), n, k,
         reinterpret_cast<uint16_t*>(w.data_ptr<at::BFloat16>()));
  return at::linear(x, w, bias);
}

// the tiled layout -> w (n, k), a new tensor
inline at::Tensor unpack_op(const at::Tensor& packed, int64_t n, int64_t k) {
  check_holds(packed, n, k);
  auto w = at::empty({n, k}, packed.options());
  unpack(reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()), n, k, reinterpret_cast<uint16_t*>(w.data_ptr<at::BFloat16>()));
  return w;
}

// weights (n_i, k) bf16, stacked along the outputs as one (sum n_i, k) weight without a copy of it -> the tiled
// layout, as a flat bf16 tensor
inline at::Tensor pack_parts_op(const std::vector<at::Tensor>& parts) {
  TORCH_CHECK(!parts.empty(), "no weight to pack");
  std::vector<at::Tensor> kept;
  std::vector<const uint16_t*> rows;
  const int64_t k = parts[0].dim() == 2 ? parts[0].size(1) : -1;
  for (const auto& w : parts) {
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16, "w: (outputs, inputs) bf16");
    TORCH_CHECK(w.size(1) == k, "weights of one input size to stack");
    TORCH_CHECK(k % 2 == 0, "an odd input size ", k);
    kept.push_back(w.contiguous());
    const uint16_t* base = reinterpret_cast<const uint16_t*>(kept.back().data_ptr<at::BFloat16>());
    for (int64_t r = 0; r < w.size(0); ++r) rows.push_back(base + r * k);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  TORCH_CHECK(n > 0, "no outputs to pack");
  auto out = at::empty({tiles(n) * tile_bytes(k) / 2}, parts[0].options());
  pack_rows(rows, n, k, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()));
  return out;
}

// w (n, k) bf16 -> the tiled layout, as a flat bf16 tensor
inline at::Tensor pack_op(const at::Tensor& w) { return pack_parts_op({w}); }

}  // namespace tiles
