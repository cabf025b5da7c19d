// Matrix products over a GGUF file's quantized blocks: y = x @ W^T (+ b), W in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q4_K, Q5_K or Q6_K with the file's scales and minimums as they are (fp16, and the K-quants' 6-bit and 8-bit ones).
//
// Arithmetic (ggml's): each row of x is quantized once per product to int8, with one fp32 scale dx = max|x| / 127
// (q = round-to-nearest-even(x * (1 / dx))) per block of 32 inputs for the legacy formats (as ggml's Q8_0) and per
// super-block of 256 for the K-quants (as its Q8_K). A block's products are then exact integer sums of the weight
// codes c_j times the row's codes q_j (S = sum_j q_j), and each output column adds up its blocks (legacy) or
// super-blocks (K-quants) in order in fp32 (d, m: a block's scale and minimum, exact in fp32):
//   Q4_0, Q5_0, Q8_0: v = sum_j (c_j - 8, 16 or 0) q_j      acc = fma(v, d * dx, acc)
//   Q4_1, Q5_1:  v = sum_j c_j q_j                          acc = fma(v, d * dx, acc); acc = fma(m, dx * S, acc)
//   Q4_K, Q5_K, over a super-block's 8 blocks g (6-bit scales s_g and minimums m_g, fp16 D and Dmin):
//                V = sum_g s_g sum_j c_j q_j, M = sum_g m_g S_g   acc = fma(V, D * dx, acc); acc = fma(-M, Dmin * dx, acc)
//   Q6_K:        V = sum_g (s0_g sum_{j<16} (c_j - 32) q_j + s1_g sum_{j>=16} (c_j - 32) q_j)   acc = fma(V, D * dx, acc)
// (|v| < 2^24, |V| < 2^31: V rounds to fp32 once, to nearest even), then y = acc (+ b) rounded once to the output's
// dtype. The K-quants' integer scales weight their blocks' sums as integers, leaving two float operations a
// super-block where there were three a block: on Zen 4 float multiplies and FMAs share the dot products' two ports
// (scripts/row_limit.py). Every operation on a column's float sum is the same in every code path (portable, AVX2,
// AVX-512 VNNI, AMX) and the integer sums are exact, so all paths give the same bits, and a row's result depends on
// that row only, whatever the number of rows.
//
// Weights are reordered once at load into tiles of 16 output columns: for each tile, its blocks of 32
// inputs in order, then (K-quants) the super-blocks' scales. A block holds its codes as 64-byte chunks
// where byte 4c + i is column c's code for input 4r + i (r the chunk; 4-bit codes hold chunk r in the low
// nibble and chunk r + 4 in the high one; Q5_0/Q5_1 add a chunk of the codes' fifth bits, Q6_K two of their
// top 2 bits), then its 16
// columns' scales. A vector register of one chunk meets the row's 4 int8 inputs broadcast to all lanes:
// 16 columns times 4 products per instruction, a block unpacked once for every row of the call.

#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <c10/util/Half.h>

// x86-64: the vector paths; elsewhere (ARM) the portable one only
#if defined(__x86_64__) && !defined(SPECULA_NO_X86)
#define SPECULA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define SPECULA_X86 0
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace blocks {

// GGML's type numbers
enum Format : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
// AMX: calls of AMX_FROM rows or more on CPUs with AMX-INT8 (Intel Xeon since Sapphire Rapids); fewer
// rows take AVX-512 there, faster for them (the same bits)
enum Path : int64_t { AUTO = 0, PORTABLE = 1, AVX2 = 2, AVX512 = 3, AMX = 4 };

constexpr int64_t QK = 32;     // inputs per block
constexpr int64_t QK_K = 256;  // inputs per K-quant super-block
constexpr int64_t COLS = 16;   // output columns per tile
constexpr int64_t ROWS = 8;    // rows of x per register tile (AVX-512; AVX2 takes 4)
constexpr int64_t CHUNK = 64;  // bytes per chunk of codes
constexpr int64_t AMX_ROWS = 16;  // rows of x per AMX tile
constexpr int64_t PREFETCH = 12;  // blocks ahead (8-16 time alike on the bundled model)
constexpr int64_t AMX_FROM = 16;  // the fewest rows of a call that AMX takes (measured: below, AVX-512 is faster)

constexpr bool known(int64_t fmt) {
  return fmt == Q4_0 || fmt == Q4_1 || fmt == Q5_0 || fmt == Q5_1 || fmt == Q8_0 || fmt == Q4_K || fmt == Q5_K ||
         fmt == Q6_K;
}
constexpr bool five_bit(int64_t fmt) { return fmt == Q5_0 || fmt == Q5_1 || fmt == Q5_K; }
constexpr bool k_min(int64_t fmt) { return fmt == Q4_K || fmt == Q5_K; }  // 6-bit scales and minimums
constexpr bool with_min(int64_t fmt) { return fmt == Q4_1 || fmt == Q5_1; }  // fp16 m per block
constexpr bool k_quant(int64_t fmt) { return fmt == Q4_K || fmt == Q5_K || fmt == Q6_K; }
constexpr bool nibbles(int64_t fmt) { return fmt != Q8_0; }  // codes held as 4-bit chunks (Q6_K: plus 2 bits)
constexpr int64_t code_bytes(int64_t fmt) {
  return fmt == Q8_0 ? 8 * CHUNK : fmt == Q6_K ? 6 * CHUNK : five_bit(fmt) ? 5 * CHUNK : 4 * CHUNK;
}
// one block of one tile: codes, then per column: fp16 d (Q4_0, Q5_0, Q8_0), fp16 d and m (Q4_1, Q5_1),
// 6-bit s and m as bytes (Q4_K, Q5_K), or int8 s0 and s1 (Q6_K)
constexpr int64_t block_bytes(int64_t fmt) { return code_bytes(fmt) + COLS * (with_min(fmt) ? 4 : 2); }
// one super-block's header of one tile (K-quants): fp16 D and Dmin (Q4_K, Q5_K) or D (Q6_K) per column
constexpr int64_t super_bytes(int64_t fmt) { return k_min(fmt) ? 4 * COLS : fmt == Q6_K ? 2 * COLS : 0; }
inline int64_t tile_bytes(int64_t fmt, int64_t nb) { return nb * block_bytes(fmt) + (nb * QK / QK_K) * super_bytes(fmt); }
// inputs and bytes of one block (or super-block) of one row in the file
constexpr int64_t file_inputs(int64_t fmt) { return k_quant(fmt) ? QK_K : QK; }
constexpr int64_t file_bytes(int64_t fmt) {
  return fmt == Q4_0 ? 18 : fmt == Q4_1 ? 20 : fmt == Q5_0 ? 22 : fmt == Q5_1 ? 24 : fmt == Q8_0 ? 34 : fmt == Q4_K ? 144
         : fmt == Q5_K ? 176 : 210;
}
// what the integer sums subtract per code: the code's zero (Q8_0 codes are held as q + 128)
constexpr int32_t code_zero(int64_t fmt) {
  return fmt == Q4_0 ? 8 : fmt == Q5_0 ? 16 : fmt == Q8_0 ? 128 : fmt == Q6_K ? 32 : 0;
}
inline int64_t tiles(int64_t n) { return (n + COLS - 1) / COLS; }

// f(std::integral_constant<int64_t, F>{}) for the format F that fmt names: the one switch from a format at run time
// to the code compiled for it (packing a file's blocks, a tile's product)
template <class Fn>
inline decltype(auto) with_format(int64_t fmt, Fn&& f) {
  switch (fmt) {
    case Q4_0: return f(std::integral_constant<int64_t, Q4_0>{});
    case Q4_1: return f(std::integral_constant<int64_t, Q4_1>{});
    case Q5_0: return f(std::integral_constant<int64_t, Q5_0>{});
    case Q5_1: return f(std::integral_constant<int64_t, Q5_1>{});
    case Q8_0: return f(std::integral_constant<int64_t, Q8_0>{});
    case Q4_K: return f(std::integral_constant<int64_t, Q4_K>{});
    case Q5_K: return f(std::integral_constant<int64_t, Q5_K>{});
    case Q6_K: return f(std::integral_constant<int64_t, Q6_K>{});
  }
  TORCH_CHECK(false, "unknown block format ", fmt);
}

// a format's (whether it is one of Format, weights and bytes of one block of a row in the file): what the Python table
// of formats (cpu/products.py, BLOCK_TABLE) is checked against
inline std::vector<int64_t> file_layout_op(int64_t fmt) {
  return {known(fmt) ? 1 : 0, known(fmt) ? file_inputs(fmt) : 0, known(fmt) ? file_bytes(fmt) : 0};
}

// One row's block of 32 weights as the file gives it: codes (unsigned, before the zero), and the scales.
struct FileBlock {
  uint8_t codes[QK];
  uint16_t d = 0, m = 0;  // fp16: the block's d (and Q4_1/Q5_1's m); K-quants' D (and Q4_K/Q5_K's Dmin)
  uint8_t s0 = 0, s1 = 0;  // Q4_K/Q5_K: the 6-bit scale and minimum; Q6_K: the int8 scales of inputs 0-15, 16-31
};

// Block b of a row (`row`: the row's bytes in the file). The format is a template argument: a model's load reads
// every block of every weight, and with it known the branches on it fold away (the load's packing: 2-3x faster).
template <int64_t fmt>
inline FileBlock read_block(const uint8_t* row, int64_t b) {
  FileBlock out;
  if (!k_quant(fmt)) {
    const uint8_t* src = row + b * file_bytes(fmt);
    std::memcpy(&out.d, src, 2);
    if (fmt == Q8_0) {
      for (int j = 0; j < QK; ++j) out.codes[j] = static_cast<uint8_t>(static_cast<int8_t>(src[2 + j]) + 128);
      return out;
    }
    if (with_min(fmt)) std::memcpy(&out.m, src + 2, 2);
    const uint8_t* nib = src + (with_min(fmt) ? 4 : 2);
    uint32_t high = 0;  // Q5_0/Q5_1: bit j is q_j's fifth bit, before the nibbles
    if (five_bit(fmt)) {
      std::memcpy(&high, nib, 4);
      nib += 4;
    }
    for (int j = 0; j < 16; ++j) {  // byte j: q_j low, q_{j+16} high
      out.codes[j] = (nib[j] & 15) | (((high >> j) & 1) << 4);
      out.codes[j + 16] = (nib[j] >> 4) | (((high >> (j + 16)) & 1) << 4);
    }
    return out;
  }
  const uint8_t* sb = row + (b * QK / QK_K) * file_bytes(fmt);
  const int g = static_cast<int>(b % (QK_K / QK));  // the block within its super-block
  if (k_min(fmt)) {  // D, Dmin, 12 bytes of 6-bit scales and minimums, (Q5_K: 32 bytes of fifth bits,) nibbles
    std::memcpy(&out.d, sb, 2);
    std::memcpy(&out.m, sb + 2, 2);
    const uint8_t* q = sb + 4;
    if (g < 4) {
      out.s0 = q[g] & 63, out.s1 = q[g + 4] & 63;
    } else {
      out.s0 = (q[g + 4] & 15) | ((q[g - 4] >> 6) << 4);
      out.s1 = (q[g + 4] >> 4) | ((q[g] >> 6) << 4);
    }
    const uint8_t* high = sb + 16;  // Q5_K: bit g of byte j is group g's input j's fifth bit
    const uint8_t* nib = sb + (fmt == Q5_K ? 48 : 16) + 32 * (g / 2);  // groups 2c, 2c + 1: low, high nibbles
    for (int j = 0; j < QK; ++j) {
      out.codes[j] = g % 2 ? nib[j] >> 4 : nib[j] & 15;
      if (fmt == Q5_K) out.codes[j] |= ((high[j] >> g) & 1) << 4;
    }
    return out;
  }
  // Q6_K: 128 bytes of low nibbles, 64 of top 2 bits, 16 int8 scales (one per 16 inputs), D
  std::memcpy(&out.d, sb + 208, 2);
  const int8_t* sc = reinterpret_cast<const int8_t*>(sb + 192);
  out.s0 = static_cast<uint8_t>(sc[2 * g]), out.s1 = static_cast<uint8_t>(sc[2 * g + 1]);
  const int half_ = g / 4, quarter = g % 4;  // inputs 128 * half_ + 32 * quarter + l
  const uint8_t* ql = sb + 64 * half_;
  const uint8_t* qh = sb + 128 + 32 * half_;
  for (int l = 0; l < QK; ++l) {
    uint8_t low = quarter % 2 ? ql[l + 32] : ql[l];
    low = quarter < 2 ? low & 15 : low >> 4;
    out.codes[l] = low | (((qh[l] >> (2 * quarter)) & 3) << 4);
  }
  return out;
}

// The file's rows (n, bytes per row) -> the tiled layout (tiles(n) * tile_bytes), columns past n zero.
template <int64_t fmt>
inline void pack_format(const uint8_t* raw, int64_t n, int64_t nb, uint8_t* out) {
  const int64_t bb = block_bytes(fmt), cb = code_bytes(fmt), tb = tile_bytes(fmt, nb);
  const int64_t row_bytes = nb * QK / file_inputs(fmt) * file_bytes(fmt);
  // tiles are disjoint: the threads take whole ones (a model's load packs every weight), and each clears its own
  // first (the first touch of the new memory's pages, which costs about as much as the packing, on every core)
  at::parallel_for(0, tiles(n), 1, [&](int64_t t0, int64_t t1) {
  std::memset(out + t0 * tb, 0, (t1 - t0) * tb);
  for (int64_t col = t0 * COLS; col < std::min(n, t1 * COLS); ++col) {
    int64_t t = col / COLS, c = col % COLS;
    uint8_t* tile = out + t * tb;
    for (int64_t b = 0; b < nb; ++b) {
      FileBlock fb = read_block<fmt>(raw + col * row_bytes, b);
      uint8_t* dst = tile + b * bb;
      for (int r = 0; r < 8; ++r)
        for (int i = 0; i < 4; ++i) {
          uint8_t code = fb.codes[4 * r + i];
          if (fmt == Q8_0) {
            dst[r * CHUNK + 4 * c + i] = code;
            continue;
          }
          dst[(r % 4) * CHUNK + 4 * c + i] |= (code & 15) << (r < 4 ? 0 : 4);
          if (fmt == Q6_K) dst[(4 + r / 4) * CHUNK + 4 * c + i] |= (code >> 4) << (2 * (r % 4));
          if (five_bit(fmt)) dst[4 * CHUNK + 4 * c + i] |= (code >> 4) << r;
        }
      uint8_t* scales = dst + cb;
      if (k_quant(fmt)) {
        scales[c] = fb.s0, scales[COLS + c] = fb.s1;
        if (b % (QK_K / QK) == 0) {
          uint16_t* super = reinterpret_cast<uint16_t*>(tile + nb * bb + (b * QK / QK_K) * super_bytes(fmt));
          super[c] = fb.d;
          if (k_min(fmt)) super[COLS + c] = fb.m;
        }
      } else {
        reinterpret_cast<uint16_t*>(scales)[c] = fb.d;
        if (with_min(fmt)) reinterpret_cast<uint16_t*>(scales)[COLS + c] = fb.m;
      }
    }
  }
  });
}

inline void pack(const uint8_t* raw, int64_t n, int64_t nb, int64_t fmt, uint8_t* out) {
  with_format(fmt, [&](auto f) { pack_format<decltype(f)::value>(raw, n, nb, out); });
}

// x's rows quantized to int8 codes with one scale dx per `span` inputs (QK for the legacy formats, as ggml's Q8_0; QK_K
// for the K-quants, as its Q8_K), and per block of 32 the codes' sum S (and of each half of 16). Held block-major: block
// b of every row side by side, so that a kernel finds its rows' codes, sums and scales for a block at fixed offsets
// from one place.
struct Acts {
  int64_t rows = 0, nb = 0, span = QK;
  std::vector<int8_t> q;
  std::vector<float> d, dsum;  // d: per span; dsum: per block, its span's d times its S (the legacy minimums' term)
  std::vector<int32_t> sum, zeros, pairs;  // per block: S, and -32 times each half's S (Q6_K's zero); per two blocks of
                                           // a span of 256: their S as two int16 (K-quants' minimums)
  int64_t per() const { return span / QK; }  // blocks per span
  int64_t spans() const { return nb / per(); }  // spans a row
  int64_t units() const { return rows * spans(); }  // spans of all rows: what quantize() takes a share of
  int64_t at(int64_t r, int64_t b) const { return b * rows + r; }  // row r's block b
  int64_t span_at(int64_t r, int64_t s) const { return s * rows + r; }  // row r's span s (its scale in d)
  const int8_t* codes(int64_t r, int64_t b) const { return q.data() + at(r, b) * QK; }
  int8_t* codes(int64_t r, int64_t b) { return q.data() + at(r, b) * QK; }
  // span u of x's rows (span u: row u / spans(), its u % spans()-th): its row r, place sp and first input
  template <typename T>
  const T* span_of(const T* x, int64_t u, int64_t& r, int64_t& sp) const {
    r = u / spans(), sp = u % spans();
    return x + r * nb * QK + sp * span;
  }
  // row r's span sp scaled by its inputs' largest magnitude: dx = amax / 127 kept, 1 / dx (0 where dx is) returned
  float scale(int64_t r, int64_t sp, float amax) {
    const float dx = amax / 127.0f;
    d[span_at(r, sp)] = dx;
    return dx != 0.0f ? 1.0f / dx : 0.0f;
  }
  const int32_t* pairs_at(int64_t r, int64_t s) const { return pairs.data() + span_at(r, s) * (per() / 2); }
  // room for `rows` rows of k inputs, a scale per `span_` of them
  void shape(int64_t n_rows, int64_t k, int64_t span_) {
    rows = n_rows;
    nb = k / QK;
    span = span_;
    q.resize(rows * k);
    d.resize(units());
    dsum.resize(rows * nb);
    sum.resize(rows * nb);
    zeros.resize(2 * rows * nb);
    pairs.resize(rows * nb / 2);
  }
  // row r's block b: its codes' sums of each half (its span's scale set before)
  void put(int64_t r, int64_t b, int32_t h0, int32_t h1) {
    const int64_t i = at(r, b);
    sum[i] = h0 + h1;
    zeros[2 * i] = -32 * h0, zeros[2 * i + 1] = -32 * h1;
    dsum[i] = d[span_at(r, b / per())] * static_cast<float>(h0 + h1);
    if (per() > 1 && b % 2)
      pairs[span_at(r, b / per()) * (per() / 2) + (b % per()) / 2] =
          static_cast<int32_t>((static_cast<uint32_t>(sum[at(r, b - 1)]) & 0xFFFFu) | (static_cast<uint32_t>(sum[i]) << 16));
  }
};

// Spans u0..u1-1 of x's rows (span u: row u / spans(), its u % spans()-th) into `a`, already shaped (Acts::shape): each
// span's scale, codes and sums depend on its own inputs only, so threads may take any share of them.
template <typename T>
void quantize(const T* x, int64_t u0, int64_t u1, Acts& a) {
  const int64_t per = a.per();
  for (int64_t u = u0; u < u1; ++u) {
    int64_t r, sp;
    const T* xs = a.span_of(x, u, r, sp);
    float amax = 0.0f;
    for (int64_t j = 0; j < a.span; ++j) amax = std::max(amax, std::fabs(static_cast<float>(xs[j])));
    const float id = a.scale(r, sp, amax);
    for (int64_t g = 0; g < per; ++g) {
      const T* xb = xs + g * QK;
      int8_t* q = a.codes(r, sp * per + g);
      int32_t h[2] = {0, 0};
      for (int j = 0; j < QK; ++j) {
        q[j] = static_cast<int8_t>(std::nearbyint(static_cast<float>(xb[j]) * id));
        h[j / 16] += q[j];
      }
      a.put(r, sp * per + g, h[0], h[1]);
    }
  }
}

// A block's codes and scales on simd.h's vocabulary, the same operations at every width: the group g of width<I>
// columns of a tile (one column for the portable path, 8 for AVX2, the 16 for AVX-512). Each is always inlined into
// its caller, whose target then covers the width's operations: no call of theirs is made with the ABI -Wpsabi warns of.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// The codes as 8 registers of unsigned bytes, one a chunk: lane k holds column W g + k's codes of the chunk's 4 inputs
// (Q8_0's q + 128).
template <typename I>
inline __attribute__((always_inline)) void unpack(const uint8_t* blk, int64_t fmt, int g, I* u) {
  const uint8_t* at = blk + 4 * simd::width<I> * g;  // the group's bytes of chunk 0
  if (fmt == Q8_0) {
    for (int c = 0; c < 8; ++c) u[c] = simd::load<I>(at + c * CHUNK);
    return;
  }
  const I low = simd::bytes<I>(0x0F), top = simd::bytes<I>(0x30);
  for (int c = 0; c < 4; ++c) {
    I v = simd::load<I>(at + c * CHUNK);
    u[c] = simd::bit_and(v, low);
    u[c + 4] = simd::bit_and(simd::shr16(v, 4), low);
  }
  if (five_bit(fmt)) {  // chunk r's fifth bits: bit r of the fifth chunk's bytes
    const I bit = simd::bytes<I>(0x10);
    I v = simd::load<I>(at + 4 * CHUNK);
    for (int r = 0; r < 8; ++r) {  // bit r to bit 4
      I moved = r <= 4 ? simd::shl16(v, 4 - r) : simd::shr16(v, r - 4);
      u[r] = simd::bit_or(u[r], simd::bit_and(moved, bit));
    }
  }
  if (fmt == Q6_K)
    for (int hb = 0; hb < 2; ++hb) {  // chunk 4 hb + i's top 2 bits: bits 2i, 2i + 1 of chunk 4 + hb
      I v = simd::load<I>(at + (4 + hb) * CHUNK);
      u[4 * hb + 0] = simd::bit_or(u[4 * hb + 0], simd::bit_and(simd::shl16(v, 4), top));
      u[4 * hb + 1] = simd::bit_or(u[4 * hb + 1], simd::bit_and(simd::shl16(v, 2), top));
      u[4 * hb + 2] = simd::bit_or(u[4 * hb + 2], simd::bit_and(v, top));
      u[4 * hb + 3] = simd::bit_or(u[4 * hb + 3], simd::bit_and(simd::shr16(v, 2), top));
    }
}

// A legacy block's scale d and minimum m (fp16s, exact in fp32; m zero where the format has none).
template <typename V>
inline __attribute__((always_inline)) void scales(const uint8_t* tile, int64_t fmt, int64_t b, int g, V& d, V& m) {
  const c10::Half* h = reinterpret_cast<const c10::Half*>(tile + b * block_bytes(fmt) + code_bytes(fmt)) + simd::width<V> * g;
  d = simd::load<V>(h);
  m = with_min(fmt) ? simd::load<V>(h + COLS) : simd::splat<V>(0.0f);
}

// A K-quant block's integer scales: Q4_K/Q5_K's 6-bit scale s0 and minimum s1, Q6_K's int8 scales s0, s1 of inputs
// 0-15 and 16-31.
template <typename I>
inline __attribute__((always_inline)) void kscales(const uint8_t* tile, int64_t fmt, int64_t b, int g, I& s0, I& s1) {
  const uint8_t* s8 = tile + b * block_bytes(fmt) + code_bytes(fmt) + simd::width<I> * g;
  if (fmt == Q6_K) {
    s0 = simd::widen<I>(reinterpret_cast<const int8_t*>(s8));
    s1 = simd::widen<I>(reinterpret_cast<const int8_t*>(s8 + COLS));
  } else {
    s0 = simd::widen<I>(s8);
    s1 = simd::widen<I>(s8 + COLS);
  }
}

// Super-block sb's fp16 D and Dmin (zero where the format has none), exact in fp32.
template <typename V>
inline __attribute__((always_inline)) void supers(const uint8_t* tile, int64_t nb, int64_t fmt, int64_t sb, int g, V& D, V& Dmin) {
  const c10::Half* h = reinterpret_cast<const c10::Half*>(tile + nb * block_bytes(fmt) + sb * super_bytes(fmt)) + simd::width<V> * g;
  D = simd::load<V>(h);
  Dmin = k_min(fmt) ? simd::load<V>(h + COLS) : simd::splat<V>(0.0f);
}

#pragma GCC diagnostic pop

// acc (rows x 16) for one tile of a legacy format over all its blocks, rows r0..r0+R-1: the portable path, a column
// at a time
inline void tile_portable(const uint8_t* tile, int64_t nb, int64_t fmt, const Acts& a, int64_t r0, int64_t R, float* acc) {
  const int64_t bb = block_bytes(fmt);
  const int32_t zero = code_zero(fmt);
  std::fill(acc, acc + R * COLS, 0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = tile + b * bb;
    for (int c = 0; c < COLS; ++c) {
      uint32_t u[8];
      float d, m;
      unpack(blk, fmt, c, u);
      scales(tile, fmt, b, c, d, m);
      int32_t w[QK];  // the column's codes less their zero, input j's the byte j % 4 of chunk j / 4
      for (int j = 0; j < QK; ++j) w[j] = static_cast<int32_t>((u[j / 4] >> (8 * (j % 4))) & 0xFF) - zero;
      for (int64_t r = 0; r < R; ++r) {
        const int8_t* q = a.codes(r0 + r, b);
        int64_t i = a.at(r0 + r, b);
        int32_t v = 0;
        for (int j = 0; j < QK; ++j) v += w[j] * q[j];
        float& s = acc[r * COLS + c];
        s = std::fma(static_cast<float>(v), d * a.d[i], s);
        if (with_min(fmt)) s = std::fma(m, a.dsum[i], s);
      }
    }
  }
}

// acc (rows x 16, R <= ROWS) for one tile of a K-quant, rows r0..r0+R-1: the portable path, a column at a time
inline void ktile_portable(const uint8_t* tile, int64_t nb, int64_t fmt, const Acts& a, int64_t r0, int64_t R, float* acc) {
  const int64_t bb = block_bytes(fmt), per = QK_K / QK, spans = nb / per;
  const int32_t zero = code_zero(fmt);
  for (int c = 0; c < COLS; ++c) {
    float s[ROWS] = {};
    for (int64_t sb = 0; sb < spans; ++sb) {
      int32_t V[ROWS] = {}, M[ROWS] = {};
      for (int64_t b = sb * per; b < (sb + 1) * per; ++b) {
        uint32_t u[8], s0, s1;
        unpack(tile + b * bb, fmt, c, u);
        kscales(tile, fmt, b, c, s0, s1);
        int32_t w[QK];
        for (int j = 0; j < QK; ++j) w[j] = static_cast<int32_t>((u[j / 4] >> (8 * (j % 4))) & 0xFF) - zero;
        for (int64_t r = 0; r < R; ++r) {
          const int8_t* q = a.codes(r0 + r, b);
          int32_t h[2] = {0, 0};
          for (int j = 0; j < QK; ++j) h[j / 16] += w[j] * q[j];
          if (fmt == Q6_K) {
            V[r] += static_cast<int32_t>(s0) * h[0] + static_cast<int32_t>(s1) * h[1];
          } else {
            V[r] += static_cast<int32_t>(s0) * (h[0] + h[1]);
            M[r] += static_cast<int32_t>(s1) * a.sum[a.at(r0 + r, b)];
          }
        }
      }
      float D, Dmin;
      supers(tile, nb, fmt, sb, c, D, Dmin);
      for (int64_t r = 0; r < R; ++r) {
        const float dx = a.d[a.span_at(r0 + r, sb)];
        s[r] = std::fma(static_cast<float>(V[r]), D * dx, s[r]);
        if (k_min(fmt)) s[r] = std::fma(-static_cast<float>(M[r]), Dmin * dx, s[r]);
      }
    }
    for (int64_t r = 0; r < R; ++r) acc[r * COLS + c] = s[r];
  }
}

// The cache lines of a block PREFETCH blocks ahead (a step reads every weight once, from memory: this keeps
// loads in flight while a block is computed; a prefetch past the weight's end is harmless)
inline void prefetch(const uint8_t* p, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(p + line, 0, 3);
}

#if SPECULA_X86
#define SPECULA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SPECULA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))

// How many chunks' products one int16 lane of _mm256_maddubs_epi16 (a pair of products per lane) can add up
// before it is widened to int32, exactly (|q| <= 127): 4-bit codes 8 (8 x 2 x 15 x 127 = 30480 < 2^15), 5-bit 4
// (31496), Q6_K's 6-bit 2 (32004; its halves of 4 chunks have their own scales), Q8_0's signed codes 1 (32258)
constexpr int narrow_chunks(int64_t fmt) { return fmt == Q8_0 ? 1 : fmt == Q6_K ? 2 : five_bit(fmt) ? 4 : 8; }

// AVX2: a row's integer sums of a block over 8 columns (u: the block's codes, q: the row's 32 codes), inputs 0-15 into
// v[0] and 16-31 into v[1], each pair of products added as int16 for up to narrow_chunks(fmt) chunks, then widened
template <int64_t fmt>
SPECULA_AVX2 inline __attribute__((always_inline)) void half_sums(const __m256i* u, const int8_t* q, __m256i* v) {
  const __m256i ones = _mm256_set1_epi16(1);
  v[0] = v[1] = _mm256_setzero_si256();
  constexpr int G = narrow_chunks(fmt);
  for (int c0 = 0; c0 < 8; c0 += G) {
    __m256i n = _mm256_setzero_si256();
    for (int c = c0; c < c0 + G; ++c) {
      int32_t four;
      std::memcpy(&four, q + 4 * c, 4);
      __m256i x = _mm256_set1_epi32(four);
      __m256i pairs = fmt == Q8_0 ? _mm256_maddubs_epi16(_mm256_abs_epi8(u[c]), _mm256_sign_epi8(x, u[c]))
                                  : _mm256_maddubs_epi16(u[c], x);
      n = c == c0 ? pairs : _mm256_add_epi16(n, pairs);
    }
    v[c0 / 4] = _mm256_add_epi32(v[c0 / 4], _mm256_madd_epi16(n, ones));
  }
}

// AVX2, a legacy format: a tile as two halves of 8 columns, up to 4 rows at a time
template <int R, int64_t fmt>
SPECULA_AVX2 void tile_avx2(const uint8_t* tile, int64_t nb, const Acts& a, int64_t r0, float* acc) {
  const int64_t bb = block_bytes(fmt);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int h = 0; h < 2; ++h) {
    __m256 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i u[8];
      if (h == 0) prefetch(tile + (b + PREFETCH) * bb, bb);
      unpack(tile + b * bb, fmt, h, u);
      if constexpr (fmt == Q8_0)  // signed codes: |q| * sign(x, q), no byte pair overflows int16
        for (int c = 0; c < 8; ++c) u[c] = _mm256_xor_si256(u[c], flip);
      __m256 dw, mw;
      scales(tile, fmt, b, h, dw, mw);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256i v[2];
        half_sums<fmt>(u, a.codes(r0 + r, b), v);
        int64_t i = a.at(r0 + r, b);
        __m256i t = _mm256_add_epi32(v[0], v[1]);
        constexpr int32_t zero = fmt == Q8_0 ? 0 : code_zero(fmt);  // Q8_0: signed codes here
        if constexpr (zero != 0) t = _mm256_sub_epi32(t, _mm256_set1_epi32(zero * a.sum[i]));
        s[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw, _mm256_set1_ps(a.d[i])), s[r]);
        if constexpr (with_min(fmt)) s[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.dsum[i]), s[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc + r * COLS + 8 * h, s[r]);
  }
}

// AVX2, a K-quant: a tile as two halves of 8 columns, up to 4 rows at a time, a super-block's integer sums weighted by
// their blocks' scales before its two float operations
template <int R, int64_t fmt>
SPECULA_AVX2 void ktile_avx2(const uint8_t* tile, int64_t nb, const Acts& a, int64_t r0, float* acc) {
  const int64_t bb = block_bytes(fmt), per = QK_K / QK, spans = nb / per;
  for (int h = 0; h < 2; ++h) {
    __m256 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < spans; ++sb) {
      __m256i V[R], mins[4];  // mins: Q4_K/Q5_K's minimums of blocks 2p and 2p + 1 as two int16 a lane
      for (int r = 0; r < R; ++r) V[r] = _mm256_setzero_si256();
      for (int g = 0; g < per; ++g) {
        const int64_t b = sb * per + g;
        __m256i u[8], s0, s1;
        if (h == 0) prefetch(tile + (b + PREFETCH) * bb, bb);
        unpack(tile + b * bb, fmt, h, u);
        kscales(tile, fmt, b, h, s0, s1);
        if constexpr (k_min(fmt)) mins[g / 2] = g % 2 ? _mm256_or_si256(mins[g / 2], _mm256_slli_epi32(s1, 16)) : s1;
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          __m256i v[2];
          half_sums<fmt>(u, a.codes(r0 + r, b), v);
          const int64_t i = a.at(r0 + r, b);
          if constexpr (fmt == Q6_K) {
            __m256i h0 = _mm256_add_epi32(v[0], _mm256_set1_epi32(a.zeros[2 * i]));
            __m256i h1 = _mm256_add_epi32(v[1], _mm256_set1_epi32(a.zeros[2 * i + 1]));
            V[r] = _mm256_add_epi32(V[r], _mm256_add_epi32(_mm256_mullo_epi32(h0, s0), _mm256_mullo_epi32(h1, s1)));
          } else {
            V[r] = _mm256_add_epi32(V[r], _mm256_mullo_epi32(_mm256_add_epi32(v[0], v[1]), s0));
          }
        }
      }
      __m256 D, Dmin;
      supers(tile, nb, fmt, sb, h, D, Dmin);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 dx = _mm256_set1_ps(a.d[a.span_at(r0 + r, sb)]);
        s[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(V[r]), _mm256_mul_ps(D, dx), s[r]);
        if constexpr (k_min(fmt)) {
          const int32_t* sums = a.pairs_at(r0 + r, sb);
          __m256i m = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(sums[0]));
          for (int p = 1; p < 4; ++p) m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[p], _mm256_set1_epi32(sums[p])));
          s[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(Dmin, dx), s[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc + r * COLS + 8 * h, s[r]);
  }
}

// acc + the dot products of u's 16 lanes of 4 unsigned bytes with the 4 signed bytes at q, broadcast from memory within
// the instruction (GCC leaves the broadcast a separate instruction otherwise)
SPECULA_AVX512 inline __attribute__((always_inline)) __m512i dot4(__m512i acc, __m512i u, const int8_t* q) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(q)));
  return acc;
}

// AVX-512 with VNNI, a legacy format: 16 columns a register, up to 8 rows at a time
template <int R, int64_t fmt>
SPECULA_AVX512 void tile_avx512(const uint8_t* tile, int64_t nb, const Acts& a, int64_t r0, float* acc) {
  const int64_t bb = block_bytes(fmt);
  constexpr int32_t zero = code_zero(fmt);
  __m512 s[R];
  for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i u[8];  // unsigned codes (Q8_0's q + 128)
    prefetch(tile + (b + PREFETCH) * bb, bb);
    unpack(tile + b * bb, fmt, 0, u);
    __m512 dw, mw;
    scales(tile, fmt, b, 0, dw, mw);
    // the rows' integer sums side by side, chunk by chunk (independent chains in flight together); with
    // few rows each sum as two chains of four (exact: integers), so that the chains' latency is hidden
    constexpr bool SPLIT = R <= 4;
    __m512i t[R], t1[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {  // from the codes' zero times the row's sum: v = sum (c - zero) q
      t[r] = _mm512_set1_epi32(-zero * a.sum[a.at(r0 + r, b)]);
      t1[r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int8_t* q = a.codes(r0 + r, b) + 4 * c;
        if (SPLIT && c >= 4) t1[r] = dot4(t1[r], u[c], q);
        else t[r] = dot4(t[r], u[c], q);
      }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t i = a.at(r0 + r, b);
      if constexpr (SPLIT) t[r] = _mm512_add_epi32(t[r], t1[r]);
      s[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[r]), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[i])), s[r]);
      if constexpr (with_min(fmt)) s[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.dsum[i]), s[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + r * COLS, s[r]);
}

// Q4_K/Q5_K super-block sb's minimums, blocks 2p and 2p + 1 as two int16 a lane of mins[p] (read after its blocks' sums:
// they need no register while the sums do)
template <int64_t fmt>
SPECULA_AVX512 inline __attribute__((always_inline)) void min_pairs(const uint8_t* tile, int64_t sb, __m512i* mins) {
  constexpr int64_t per = QK_K / QK;
  __m512i lo, hi, unused;
  for (int p = 0; p < 4; ++p) {
    kscales(tile, fmt, sb * per + 2 * p, 0, unused, lo);
    kscales(tile, fmt, sb * per + 2 * p + 1, 0, unused, hi);
    mins[p] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
  }
}

// A super-block's float operations for a row (AVX-512 and AMX alike): s + V (D dx), less M (Dmin dx) where the format
// has minimums, M the sum of its blocks' minimums times their codes' sums (two int16 of each a lane of `mins` and of
// `sums`: blocks 2p and 2p + 1)
template <int64_t fmt>
SPECULA_AVX512 inline __attribute__((always_inline)) __m512 span_sum(__m512 s, __m512i V, __m512 D, __m512 Dmin, float dx,
                                                                    const __m512i* mins, const int32_t* sums) {
  const __m512 x = _mm512_set1_ps(dx);
  s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(V), _mm512_mul_ps(D, x), s);
  if constexpr (k_min(fmt)) {
    __m512i m = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) m = _mm512_dpwssd_epi32(m, mins[p], _mm512_set1_epi32(sums[p]));
    s = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(Dmin, x), s);
  }
  return s;
}

// AVX-512 with VNNI, a K-quant: 16 columns a register, up to 8 rows at a time; each block's integer sums weighted by its
// integer scales into the super-block's (exact), then two float operations a super-block (the per-block float
// operations would share the dot products' two execution ports on Zen 4: scripts/row_limit.py)
template <int R, int64_t fmt>
SPECULA_AVX512 void ktile_avx512(const uint8_t* tile, int64_t nb, const Acts& a, int64_t r0, float* acc) {
  const int64_t bb = block_bytes(fmt), per = QK_K / QK, spans = nb / per;
  constexpr bool SPLIT = R <= 4;  // two chains of four chunks a row, so that few rows' chains hide their latency
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + r * COLS, _mm512_setzero_ps());
  for (int64_t sb = 0; sb < spans; ++sb) {
    __m512i V[R], mins[4];
    for (int r = 0; r < R; ++r) V[r] = _mm512_setzero_si512();
    for (int g = 0; g < per; ++g) {
      const int64_t b = sb * per + g;
      __m512i u[8], s0, s1, t[R], t1[R];
      prefetch(tile + (b + PREFETCH) * bb, bb);
      unpack(tile + b * bb, fmt, 0, u);
      kscales(tile, fmt, b, 0, s0, s1);
      if constexpr (fmt == Q6_K) {  // each half of 16 inputs with its own scale: v = sum (c - 32) q
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) t[r] = _mm512_set1_epi32(a.zeros[2 * a.at(r0 + r, b) + half]);
#pragma GCC unroll 4
          for (int c = 4 * half; c < 4 * half + 4; ++c)
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) t[r] = dot4(t[r], u[c], a.codes(r0 + r, b) + 4 * c);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) V[r] = _mm512_add_epi32(V[r], _mm512_mullo_epi32(t[r], half ? s1 : s0));
        }
      } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) t[r] = t1[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c)
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            if (SPLIT && c >= 4) t1[r] = dot4(t1[r], u[c], a.codes(r0 + r, b) + 4 * c);
            else t[r] = dot4(t[r], u[c], a.codes(r0 + r, b) + 4 * c);
          }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) V[r] = _mm512_add_epi32(V[r], _mm512_mullo_epi32(SPLIT ? _mm512_add_epi32(t[r], t1[r]) : t[r], s0));
      }
    }
    if constexpr (k_min(fmt)) min_pairs<fmt>(tile, sb, mins);
    __m512 D, Dmin;
    supers(tile, nb, fmt, sb, 0, D, Dmin);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      _mm512_storeu_ps(acc + r * COLS, span_sum<fmt>(_mm512_loadu_ps(acc + r * COLS), V[r], D, Dmin, a.d[a.span_at(r0 + r, sb)],
                                                     mins, a.pairs_at(r0 + r, sb)));
  }
}

// AMX needs a compiler that knows its instructions (GCC 11, clang 12); with an older one the path is left out
#if __has_include(<amxtileintrin.h>) || __has_include(<amxintrin.h>)
#define SPECULA_HAS_AMX 1
#define SPECULA_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c,amx-tile,amx-int8")))

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {0};
  uint16_t colsb[16] = {0};
  uint8_t rows[16] = {0};
};

// tmm0-3: 16 int32 sums of four blocks per row; tmm4-5: a block's 32 int8 inputs per row; tmm6-7: a
// block's codes, 8 rows of 16 columns x 4 inputs (a chunk each); of `rows` rows (up to 16)
SPECULA_AMX inline void amx_configure(int64_t rows) {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.rows[t] = rows, cfg.colsb[t] = COLS * 4;
  for (int t = 4; t < 6; ++t) cfg.rows[t] = rows, cfg.colsb[t] = QK;
  for (int t = 6; t < 8; ++t) cfg.rows[t] = QK / 4, cfg.colsb[t] = CHUNK;
  // the whole configuration as the instruction's operand (GCC 12's _tile_loadconfig names only its first
  // 8 bytes, so the stores of the rest may be dropped)
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}

SPECULA_AMX inline void amx_release() { _tile_release(); }

constexpr bool amx_takes(int64_t fmt) { return fmt != Q6_K; }  // Q6_K's halves have their own scales

// The integer sums of G blocks b0.. (G <= 4) for the configured rows from r0 into sums (G x 16 x 16), each
// block its own tile instruction.
template <int64_t fmt, int G>
SPECULA_AMX void amx_sums(const uint8_t* tile, int64_t b0, const Acts& a, int64_t r0, int32_t* sums) {
  const int64_t bb = block_bytes(fmt);
  alignas(64) uint8_t codes[4][8 * CHUNK];
  const uint8_t* src[4];
  for (int g = 0; g < G; ++g) {
    const uint8_t* blk = tile + (b0 + g) * bb;
    src[g] = blk;  // Q8_0's q + 128 as stored
    if constexpr (fmt != Q8_0) {
      __m512i u[8];
      unpack(blk, fmt, 0, u);
      for (int c = 0; c < 8; ++c) _mm512_store_si512(codes[g] + c * CHUNK, u[c]);
      src[g] = codes[g];
    }
  }
  // GCC's tile intrinsics paste their tile numbers into the assembly text: they take literal numbers only, hence a
  // macro. Block g sums into tile g from inputs in tiles 4/6 or 5/7 by turns (a block's loads overlap the last's
  // products); a block's rows lie side by side (stride QK).
#define SPECULA_AMX_BLOCK(g, in, w)                              \
  if constexpr (G > g) {                                        \
    _tile_zero(g);                                              \
    _tile_loadd(in, a.codes(r0, b0 + g), QK);                   \
    _tile_loadd(w, src[g], CHUNK);                              \
    _tile_dpbsud(g, in, w);                                     \
  }
  SPECULA_AMX_BLOCK(0, 4, 6)
  SPECULA_AMX_BLOCK(1, 5, 7)
  SPECULA_AMX_BLOCK(2, 4, 6)
  SPECULA_AMX_BLOCK(3, 5, 7)
#undef SPECULA_AMX_BLOCK
  _tile_stored(0, sums, COLS * 4);
  if constexpr (G > 1) _tile_stored(1, sums + AMX_ROWS * COLS, COLS * 4);
  if constexpr (G > 2) _tile_stored(2, sums + 2 * AMX_ROWS * COLS, COLS * 4);
  if constexpr (G > 3) _tile_stored(3, sums + 3 * AMX_ROWS * COLS, COLS * 4);
}

// AMX, a legacy format: up to 16 rows, four blocks at a time; then, row by row and block by block in order, the same
// float arithmetic as AVX-512
template <int64_t fmt>
SPECULA_AMX void tile_amx(const uint8_t* tile, int64_t nb, const Acts& a, int64_t r0, int64_t R, float* acc) {
  constexpr int32_t zero = code_zero(fmt);
  alignas(64) int32_t sums[4 * AMX_ROWS * COLS];
  for (int64_t r = 0; r < R; ++r) _mm512_storeu_ps(acc + r * COLS, _mm512_setzero_ps());
  for (int64_t b0 = 0; b0 < nb; b0 += 4) {
    const int64_t G = std::min<int64_t>(4, nb - b0);
    if (G == 4) amx_sums<fmt, 4>(tile, b0, a, r0, sums);
    else if (G == 3) amx_sums<fmt, 3>(tile, b0, a, r0, sums);
    else if (G == 2) amx_sums<fmt, 2>(tile, b0, a, r0, sums);
    else amx_sums<fmt, 1>(tile, b0, a, r0, sums);
    __m512 dw[4], mw[4];
    for (int64_t g = 0; g < G; ++g) scales(tile, fmt, b0 + g, 0, dw[g], mw[g]);
    for (int64_t r = 0; r < R; ++r) {
      __m512 s = _mm512_loadu_ps(acc + r * COLS);
      for (int64_t g = 0; g < G; ++g) {
        int64_t i = a.at(r0 + r, b0 + g);
        __m512i v = _mm512_load_si512(sums + (g * AMX_ROWS + r) * COLS);
        if constexpr (zero != 0) v = _mm512_sub_epi32(v, _mm512_set1_epi32(zero * a.sum[i]));
        s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(dw[g], _mm512_set1_ps(a.d[i])), s);
        if constexpr (with_min(fmt)) s = _mm512_fmadd_ps(mw[g], _mm512_set1_ps(a.dsum[i]), s);
      }
      _mm512_storeu_ps(acc + r * COLS, s);
    }
  }
}

// AMX, Q4_K or Q5_K: up to 16 rows, four blocks at a time (half a super-block); each block's sums weighted by its
// integer scales into the super-block's, then the same float operations a super-block as AVX-512's
template <int64_t fmt>
SPECULA_AMX void ktile_amx(const uint8_t* tile, int64_t nb, const Acts& a, int64_t r0, int64_t R, float* acc) {
  static_assert(k_min(fmt), "Q6_K's halves have their own scales: AVX-512 takes it");
  const int64_t per = QK_K / QK;
  alignas(64) int32_t sums[4 * AMX_ROWS * COLS];
  alignas(64) int32_t V[AMX_ROWS * COLS];
  for (int64_t r = 0; r < R; ++r) _mm512_storeu_ps(acc + r * COLS, _mm512_setzero_ps());
  for (int64_t b0 = 0; b0 < nb; b0 += 4) {  // nb: whole super-blocks
    amx_sums<fmt, 4>(tile, b0, a, r0, sums);
    __m512i sc[4], mn;
    for (int g = 0; g < 4; ++g) kscales(tile, fmt, b0 + g, 0, sc[g], mn);
    const bool first = b0 % per == 0;
    for (int64_t r = 0; r < R; ++r) {
      __m512i v = first ? _mm512_setzero_si512() : _mm512_load_si512(V + r * COLS);
      for (int g = 0; g < 4; ++g)
        v = _mm512_add_epi32(v, _mm512_mullo_epi32(_mm512_load_si512(sums + (g * AMX_ROWS + r) * COLS), sc[g]));
      _mm512_store_si512(V + r * COLS, v);
    }
    if ((b0 + 4) % per) continue;
    const int64_t sb = b0 / per;
    __m512i mins[4];
    min_pairs<fmt>(tile, sb, mins);
    __m512 D, Dmin;
    supers(tile, nb, fmt, sb, 0, D, Dmin);
    for (int64_t r = 0; r < R; ++r)
      _mm512_storeu_ps(acc + r * COLS, span_sum<fmt>(_mm512_loadu_ps(acc + r * COLS), _mm512_load_si512(V + r * COLS), D, Dmin,
                                                     a.d[a.span_at(r0 + r, sb)], mins, a.pairs_at(r0 + r, sb)));
  }
}

#else
#define SPECULA_HAS_AMX 0
#endif

// Whether this CPU has AMX-INT8 and Linux lets this process use the tile registers.
inline bool amx_usable() {
  if (!SPECULA_HAS_AMX) return false;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = edx & (1u << 24), int8 = edx & (1u << 25);
  if (!tile || !int8) return false;
#ifdef SYS_arch_prctl
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
  return false;
#endif
}

inline Path best_path() {
  static const Path best = [] {
    __builtin_cpu_init();
    if (amx_usable() && __builtin_cpu_supports("avx512vnni")) return AMX;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni"))
      return AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return AVX2;
    return PORTABLE;
  }();
  return best;
}

// quantize() with 16 inputs a vector: the same operations on each input (an exact maximum over the span, one division
// and one reciprocal per span, a product and a rounding half to even per input, exact integer sums), so the same
// codes, scales and sums as the loop's. bf16 and fp32 inputs; fp16 takes the loop.
template <typename T>
SPECULA_AVX512 void quantize_avx512(const T* x, int64_t u0, int64_t u1, Acts& a) {
  const int64_t per = a.per();
  for (int64_t u = u0; u < u1; ++u) {
    int64_t r, sp;
    const T* xs = a.span_of(x, u, r, sp);
    __m512 m = _mm512_setzero_ps();
    for (int64_t j = 0; j < a.span; j += 16) m = _mm512_max_ps(m, _mm512_abs_ps(simd::load<__m512>(xs + j)));
    const __m512 s = _mm512_set1_ps(a.scale(r, sp, _mm512_reduce_max_ps(m)));
    constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (int64_t g = 0; g < per; ++g) {
      const T* xb = xs + g * QK;
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(simd::load<__m512>(xb), s), nearest));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(simd::load<__m512>(xb + 16), s), nearest));
      int8_t* q = a.codes(r, sp * per + g);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
      a.put(r, sp * per + g, _mm512_reduce_add_epi32(q0), _mm512_reduce_add_epi32(q1));
    }
  }
}

// quantize() on AVX2: 8 inputs a vector, the same operations on each input as the loop's (an exact maximum, one
// division and one reciprocal per span, a product and a rounding half to even per input, exact integer sums), so the
// same codes, scales and sums. bf16 and fp32 inputs; fp16 takes the loop.
SPECULA_AVX2 inline int32_t sum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

template <typename T>
SPECULA_AVX2 void quantize_avx2(const T* x, int64_t u0, int64_t u1, Acts& a) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // the packs' 4-byte groups back in input order
  const int64_t per = a.per();
  for (int64_t u = u0; u < u1; ++u) {
    int64_t r, sp;
    const T* xs = a.span_of(x, u, r, sp);
    __m256 m = _mm256_setzero_ps();
    for (int64_t j = 0; j < a.span; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, simd::load<__m256>(xs + j)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const __m256 s = _mm256_set1_ps(a.scale(r, sp, _mm_cvtss_f32(h)));
    constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (int64_t g = 0; g < per; ++g) {
      const T* xb = xs + g * QK;
      __m256i q[4];
      for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(simd::load<__m256>(xb + 8 * j), s), nearest));
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.codes(r, sp * per + g)), _mm256_permutevar8x32_epi32(bytes, order));
      a.put(r, sp * per + g, sum8(_mm256_add_epi32(q[0], q[1])), sum8(_mm256_add_epi32(q[2], q[3])));
    }
  }
}

#else  // not x86-64: the portable path only

template <int R, int64_t fmt>
void tile_avx2(const uint8_t*, int64_t, const Acts&, int64_t, float*) {}
template <int R, int64_t fmt>
void ktile_avx2(const uint8_t*, int64_t, const Acts&, int64_t, float*) {}
template <int R, int64_t fmt>
void tile_avx512(const uint8_t*, int64_t, const Acts&, int64_t, float*) {}
template <int R, int64_t fmt>
void ktile_avx512(const uint8_t*, int64_t, const Acts&, int64_t, float*) {}
#define SPECULA_HAS_AMX 0
inline Path best_path() { return PORTABLE; }

#endif

#if !SPECULA_HAS_AMX  // a build without AMX never calls these
inline void amx_configure(int64_t) {}
inline void amx_release() {}
constexpr bool amx_takes(int64_t) { return false; }
template <int64_t fmt>
void tile_amx(const uint8_t*, int64_t, const Acts&, int64_t, int64_t, float*) {}
template <int64_t fmt>
void ktile_amx(const uint8_t*, int64_t, const Acts&, int64_t, int64_t, float*) {}
#endif

inline Path& forced() {
  static Path p = AUTO;
  return p;
}

// The path products take: the best this CPU has, or a slower one forced (tests); a path the CPU lacks
// is refused.
inline Path path() { return forced() == AUTO ? best_path() : forced(); }

// p: a path to force, AUTO for the best, -1 to ask which is in use
inline int64_t set_path(int64_t p) {
  if (p == -1) return path();
  TORCH_CHECK(p >= AUTO && p <= AMX, "unknown kernel path ", p);
  TORCH_CHECK(p == AUTO || p <= best_path(), "this CPU cannot run kernel path ", p);
  forced() = static_cast<Path>(p);
  return path();
}

template <int R, int64_t fmt>
void run_tile(Path p, const uint8_t* tile, int64_t nb, const Acts& a, int64_t r0, float* acc) {
  constexpr bool K = k_quant(fmt);
  if (p >= AVX512) {
    if constexpr (K) ktile_avx512<R, fmt>(tile, nb, a, r0, acc);
    else tile_avx512<R, fmt>(tile, nb, a, r0, acc);
  } else if (p == AVX2) {
    if constexpr (R > 4) {
      run_tile<4, fmt>(p, tile, nb, a, r0, acc);
      run_tile<R - 4, fmt>(p, tile, nb, a, r0 + 4, acc + 4 * COLS);
    } else if constexpr (K) {
      ktile_avx2<R, fmt>(tile, nb, a, r0, acc);
    } else {
      tile_avx2<R, fmt>(tile, nb, a, r0, acc);
    }
  } else if (K) {
    ktile_portable(tile, nb, fmt, a, r0, R, acc);
  } else {
    tile_portable(tile, nb, fmt, a, r0, R, acc);
  }
}

template <int R>
void run_tile(Path p, const uint8_t* tile, int64_t nb, int64_t fmt, const Acts& a, int64_t r0, float* acc) {
  with_format(fmt, [&](auto f) { run_tile<R, decltype(f)::value>(p, tile, nb, a, r0, acc); });
}

inline void rows_of_tile(Path p, const uint8_t* tile, int64_t nb, int64_t fmt, const Acts& a, int64_t r0, int64_t n, float* acc) {
  switch (n) {
    case 1: return run_tile<1>(p, tile, nb, fmt, a, r0, acc);
    case 2: return run_tile<2>(p, tile, nb, fmt, a, r0, acc);
    case 3: return run_tile<3>(p, tile, nb, fmt, a, r0, acc);
    case 4: return run_tile<4>(p, tile, nb, fmt, a, r0, acc);
    case 5: return run_tile<5>(p, tile, nb, fmt, a, r0, acc);
    case 6: return run_tile<6>(p, tile, nb, fmt, a, r0, acc);
    case 7: return run_tile<7>(p, tile, nb, fmt, a, r0, acc);
    default: return run_tile<8>(p, tile, nb, fmt, a, r0, acc);
  }
}

// One weight of several parts stacked along the output (fused q/k/v), each in its own format:
// parts (P, 3) int64 rows of (format, output columns, byte offset into `packed`).
struct Parts {
  std::vector<int64_t> fmt, cols, at, first_tile, first_col;
  int64_t total_tiles = 0, total_cols = 0;
};

inline Parts read_parts(const at::Tensor& parts, int64_t k, int64_t packed_bytes) {
  TORCH_CHECK(parts.dim() == 2 && parts.size(1) == 3 && parts.scalar_type() == at::kLong, "parts: (P, 3) int64");
  TORCH_CHECK(k % QK == 0, "the input size ", k, " is not a multiple of ", QK);
  auto pc = parts.contiguous();
  const int64_t* p = pc.data_ptr<int64_t>();
  Parts out;
  for (int64_t i = 0; i < pc.size(0); ++i) {
    int64_t fmt = p[3 * i], cols = p[3 * i + 1], at = p[3 * i + 2];
    TORCH_CHECK(known(fmt), "unknown block format ", fmt);
    TORCH_CHECK(!k_quant(fmt) || k % QK_K == 0, "a K-quant's input size ", k, " is not a multiple of ", QK_K);
    TORCH_CHECK(at >= 0 && at + tiles(cols) * tile_bytes(fmt, k / QK) <= packed_bytes, "a part past the packed weight");
    out.fmt.push_back(fmt);
    out.cols.push_back(cols);
    out.at.push_back(at);
    out.first_tile.push_back(out.total_tiles);
    out.first_col.push_back(out.total_cols);
    out.total_tiles += tiles(cols);
    out.total_cols += cols;
  }
  return out;
}

// The input size a packed weight was made for, from its first part's bytes (a tile holds nb blocks of the
// format, and a K-quant's super-block scales every QK_K / QK of them): what read_parts then checks.
inline int64_t input_size(const at::Tensor& parts, int64_t packed_bytes) {
  TORCH_CHECK(parts.dim() == 2 && parts.size(0) > 0 && parts.size(1) == 3 && parts.scalar_type() == at::kLong, "parts: (P, 3) int64");
  auto pc = parts.contiguous();
  const int64_t* p = pc.data_ptr<int64_t>();
  const int64_t fmt = p[0], cols = p[1], at = p[2], end = pc.size(0) > 1 ? p[5] : packed_bytes;
  TORCH_CHECK(known(fmt) && cols > 0 && 0 <= at && at < end, "a part past the packed weight");
  const int64_t per = QK_K / QK;  // blocks per super-block
  const int64_t nb = (end - at) / tiles(cols) * per / (per * block_bytes(fmt) + super_bytes(fmt));
  return nb * QK;
}

// Activations of at least this many blocks are quantized by the product's threads together (a share each, then a
// barrier); fewer (a single step's row) by the calling thread before them, where a barrier costs more than it saves
constexpr int64_t TEAM_QUANTIZES = 64;
constexpr int64_t ROW_CHUNK = 64;  // rows a thread takes through its tiles before the next rows (prompts)

// A tile's sums for m rows (acc: rows of COLS) -> its `cols` outputs from column col0 of y's rows (n wide),
// each plus its bias, rounded once to y's dtype (the own products' last step, blocks' and tiles' alike)
template <typename O>
inline void store_rows(const float* acc, int64_t m, int64_t cols, const float* bias, int64_t col0, O* y, int64_t n) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float v = acc[r * COLS + c];
      if (bias) v += bias[col0 + c];
      y[r * n + col0 + c] = static_cast<O>(v);
    }
}

// x's spans u0..u1-1 quantized into `a` on this CPU's path
template <typename T>
void quantize_spans(const T* x, int64_t u0, int64_t u1, Acts& a) {
#if SPECULA_X86
  if constexpr (std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, float>) {
    if (path() >= AVX512) return quantize_avx512(x, u0, u1, a);
    if (path() == AVX2) return quantize_avx2(x, u0, u1, a);
  }
#endif
  quantize(x, u0, u1, a);
}

// x's share `part` of `parts` (0-based) quantized into each of the activations a product uses
template <typename T>
void quantize_share(const T* x, int64_t part, int64_t parts, Acts* const* acts, int n) {
  for (int i = 0; i < n; ++i) {
    const int64_t units = acts[i]->units();
    quantize_spans(x, units * part / parts, units * (part + 1) / parts, *acts[i]);
  }
}

template <typename T, typename O>
void product(const T* x, int64_t rows, int64_t k, const uint8_t* packed, const Parts& parts, const float* bias, O* y) {
  // x quantized per block of 32 for the legacy formats' parts and per super-block of 256 for the K-quants' (each the
  // calling thread's, kept between calls: no allocation once its buffers are large enough)
  thread_local Acts kept_blocks, kept_spans;
  Acts &blocks32 = kept_blocks, &spans256 = kept_spans;
  Acts* used[2];
  int n_used = 0;
  const bool any_k = std::any_of(parts.fmt.begin(), parts.fmt.end(), k_quant);
  const bool any_legacy = !std::all_of(parts.fmt.begin(), parts.fmt.end(), k_quant);
  if (any_legacy) blocks32.shape(rows, k, QK), used[n_used++] = &blocks32;
  if (any_k) spans256.shape(rows, k, QK_K), used[n_used++] = &spans256;
  const int64_t nb = k / QK, n = parts.total_cols;
  const Path p = path();
  const bool amx = p == AMX && rows >= AMX_FROM;
  const int64_t step = amx ? AMX_ROWS : ROWS;
  // tiles begin..end-1 for every row
  auto tiles_of = [&](int64_t begin, int64_t end) {
    alignas(64) float acc[AMX_ROWS * COLS];
    int64_t configured = 0;  // the rows the tiles are configured for (tile registers are each thread's own)
    for (int64_t c0 = 0; c0 < rows; c0 += ROW_CHUNK) {
      int64_t c1 = std::min(rows, c0 + ROW_CHUNK);
      for (int64_t gt = begin; gt < end; ++gt) {
        size_t part = std::upper_bound(parts.first_tile.begin(), parts.first_tile.end(), gt) - parts.first_tile.begin() - 1;
        int64_t fmt = parts.fmt[part], t = gt - parts.first_tile[part];
        const uint8_t* tile = packed + parts.at[part] + t * tile_bytes(fmt, nb);
        const Acts& a = k_quant(fmt) ? spans256 : blocks32;
        int64_t cols = std::min(COLS, parts.cols[part] - t * COLS), col0 = parts.first_col[part] + t * COLS;
        for (int64_t r0 = c0; r0 < c1; r0 += step) {
          int64_t m = std::min(step, c1 - r0);
          if (amx && amx_takes(fmt)) {
            if (m != configured) amx_configure(configured = m);
            if (fmt == Q4_0) tile_amx<Q4_0>(tile, nb, a, r0, m, acc);
            else if (fmt == Q4_1) tile_amx<Q4_1>(tile, nb, a, r0, m, acc);
            else if (fmt == Q5_0) tile_amx<Q5_0>(tile, nb, a, r0, m, acc);
            else if (fmt == Q5_1) tile_amx<Q5_1>(tile, nb, a, r0, m, acc);
            else if (fmt == Q8_0) tile_amx<Q8_0>(tile, nb, a, r0, m, acc);
            else if (fmt == Q4_K) ktile_amx<Q4_K>(tile, nb, a, r0, m, acc);
            else ktile_amx<Q5_K>(tile, nb, a, r0, m, acc);
          } else {
            for (int64_t r1 = r0; r1 < r0 + m; r1 += ROWS)  // AVX-512 takes 8 rows at a time
              rows_of_tile(p, tile, nb, fmt, a, r1, std::min(ROWS, r0 + m - r1), acc + (r1 - r0) * COLS);
          }
          store_rows(acc, m, cols, bias, col0, y + r0 * n, n);
        }
      }
    }
    if (configured) amx_release();
  };
  const int64_t blocks = rows * nb, total = parts.total_tiles;
  const bool parallel = at::get_num_threads() > 1 && !at::in_parallel_region() && total > 1;
  const bool team = parallel && blocks >= TEAM_QUANTIZES;
  if (!team) quantize_share(x, 0, 1, used, n_used);
  if (!parallel) return tiles_of(0, total);
  // One team: with many blocks (several rows, a prompt's) each thread quantizes a share of them and, once all are
  // (the barrier), takes its share of the tiles, as at::parallel_for would split them
#pragma omp parallel
  {
    const int64_t team_size = omp_get_num_threads(), tid = omp_get_thread_num();
    if (team) {
      quantize_share(x, tid, team_size, used, n_used);
#pragma omp barrier
    }
    const int64_t chunk = (total + team_size - 1) / team_size, begin = tid * chunk;
    if (begin < total) {
      at::internal::ThreadIdGuard tid_guard(tid);
      c10::ParallelGuard guard(true);
      tiles_of(begin, std::min(total, begin + chunk));
    }
  }
}

// y = x @ W^T (+ bias): x (rows, k) in bf16, fp16 or fp32; y in x's dtype, or fp32 when `out_float`.
inline at::Tensor mm(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& parts_t,
                     const c10::optional<at::Tensor>& bias, bool out_float) {
  TORCH_CHECK(x_in.dim() == 2, "x: (rows, inputs)");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "packed: contiguous uint8");
  auto x = x_in.contiguous();
  int64_t rows = x.size(0), k = x.size(1);
  Parts parts = read_parts(parts_t, k, packed.numel());
  at::Tensor b32;
  if (bias) {
    TORCH_CHECK(bias->numel() == parts.total_cols, "a bias per output");
    b32 = bias->to(at::kFloat).contiguous();
  }
  auto y = at::empty({rows, parts.total_cols}, x.options().dtype(out_float ? at::kFloat : x.scalar_type()));
  if (rows == 0) return y;
  const float* bp = bias ? b32.data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "blocks_mm", [&] {
    if (out_float)
      product<scalar_t, float>(x.data_ptr<scalar_t>(), rows, k, packed.data_ptr<uint8_t>(), parts, bp, y.data_ptr<float>());
    else
      product<scalar_t, scalar_t>(x.data_ptr<scalar_t>(), rows, k, packed.data_ptr<uint8_t>(), parts, bp, y.data_ptr<scalar_t>());
  });
  return y;
}

// The tiled layout's bytes for n rows of row_bytes bytes of the file in format fmt (0 for a row that is not whole
// blocks: pack_op names it)
inline int64_t row_blocks(int64_t row_bytes, int64_t fmt) { return row_bytes / file_bytes(fmt) * file_inputs(fmt) / QK; }

inline int64_t packed_bytes(int64_t n, int64_t row_bytes, int64_t fmt) {
  TORCH_CHECK(known(fmt), "unknown block format ", fmt);
  if (row_bytes % file_bytes(fmt)) return 0;
  return tiles(n) * tile_bytes(fmt, row_blocks(row_bytes, fmt));
}

// Asks Linux to back [p, p + bytes) with huge pages (2 MB) where it can, before its first touch: a step reads every
// packed weight once, from memory, and with 4 KB pages its reads miss the TLB every few blocks
inline void huge_pages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t HUGE = 2 << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + HUGE - 1) & ~(HUGE - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(HUGE - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint: refused, nothing changes
#else
  (void)p, (void)bytes;
#endif
}

// raws[i] (n_i, bytes per row) uint8, the file's rows in format fmts[i] -> their tiled layouts one after the other
// in one tensor (a fused product's parts: no copy to join them)
inline at::Tensor pack_parts_op(const std::vector<at::Tensor>& raws, at::IntArrayRef fmts) {
  TORCH_CHECK(!raws.empty() && raws.size() == fmts.size(), "a format per part");
  std::vector<at::Tensor> kept;
  int64_t total = 0;
  for (size_t i = 0; i < raws.size(); ++i) {
    TORCH_CHECK(known(fmts[i]), "unknown block format ", fmts[i]);
    TORCH_CHECK(raws[i].dim() == 2 && raws[i].scalar_type() == at::kByte, "raw: (rows, bytes) uint8");
    kept.push_back(raws[i].contiguous());
    const int64_t fb = file_bytes(fmts[i]);
    TORCH_CHECK(kept.back().size(1) % fb == 0, "a row of ", kept.back().size(1), " bytes is not whole blocks of ", fb);
    total += packed_bytes(kept.back().size(0), kept.back().size(1), fmts[i]);
  }
  auto out = at::empty({total}, kept[0].options());
  huge_pages(out.data_ptr(), total);
  int64_t at_byte = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    const at::Tensor& r = kept[i];
    const int64_t n = r.size(0);
    pack(r.data_ptr<uint8_t>(), n, row_blocks(r.size(1), fmts[i]), fmts[i], out.data_ptr<uint8_t>() + at_byte);
    at_byte += packed_bytes(n, r.size(1), fmts[i]);
  }
  return out;
}

// raw (n, bytes per row) uint8, the file's rows -> the tiled layout
inline at::Tensor pack_op(const at::Tensor& raw, int64_t fmt) { return pack_parts_op({raw}, {fmt}); }

}  // namespace blocks
