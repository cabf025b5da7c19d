// A small vector vocabulary: the same operations on one float, on 8 lanes (AVX2 with FMA) and on 16 lanes
// (AVX-512), so that an elementwise operation is written once, as a template over the register type, and gives
// every element the same bits in a vector lane, in a narrower vector or in a loop's scalar remainder (the library
// is built with -ffp-contract=off: nothing is fused but the explicit fma).
//
//   V splat<V>(float)            V load<V>(const float* | const c10::BFloat16* | const c10::Half*)
//   store(float* | BFloat16*, V) add sub mul div fma(a, b, c) neg                clamp(x, lo, hi): NaN passes through
//   round_even(x): to an integer in the current rounding mode (nearbyint)        pow2(n): 2^n for integral n
//
// And integer lanes of 32 bits, as many as the float register's (I: uint32_t, __m256i, __m512i), each 4 bytes in
// memory order or two halves of 16 bits:
//   I load<I>(const uint8_t*): 4 width<I> bytes                                  I bytes<I>(b): every byte b
//   bit_and bit_or(a, b)         shl16 shr16(a, n): each half shifted by n < 16, the bits past it dropped
//   I widen<I>(const uint8_t* | const int8_t*): width<I> bytes, each zero- or sign-extended to its lane
//   V to_float(I): each lane's int32 as a float (exact below 2^24)
//
// Operations written on it: exp_fixed (Cephes' expf polynomial, about 1 ulp), tanh_fixed, and the MLP's gated
// activations (silu_gate, gelu_gate); blocks.h's unpacking of a block's codes and its scales. `width<V>` is its lanes.
//
// On x86-64 each vector operation carries its instructions' target, whatever the build's own: a function of that
// target (blocks.h's, chosen by the CPU at run time) may use it. SIMD_HAS_8 and SIMD_HAS_16 say that the build's own
// target has them, for code without a target of its own.

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace simd {

template <typename V>
inline V splat(float x);

// one float: the scalar forms, in the operand orders the vector forms keep
template <>
inline float splat<float>(float x) { return x; }
inline float add(float a, float b) { return a + b; }
inline float sub(float a, float b) { return a - b; }
inline float mul(float a, float b) { return a * b; }
inline float div(float a, float b) { return a / b; }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float neg(float a) { return -a; }
inline float clamp(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }
inline float round_even(float x) { return std::nearbyint(x); }
inline float pow2(float n) {
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}
template <typename V>
inline V load(const float* p);
template <>
inline float load<float>(const float* p) { return *p; }
template <typename V>
inline V load(const c10::BFloat16* p);
template <>
inline float load<float>(const c10::BFloat16* p) { return static_cast<float>(*p); }
template <typename V>
inline V load(const c10::Half* p);
template <>
inline float load<float>(const c10::Half* p) { return c10::detail::fp16_ieee_to_fp32_value(p->x); }
inline void store(float* p, float v) { *p = v; }
inline void store(c10::BFloat16* p, float v) { *p = static_cast<c10::BFloat16>(v); }
template <typename V>
constexpr int width = sizeof(V) / 4;  // lanes of 32 bits

// one lane of integers: a uint32_t (its bytes in memory order, the first the lowest)
template <typename I>
inline I load(const uint8_t* p);
template <>
inline uint32_t load<uint32_t>(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
template <typename I>
inline I bytes(uint8_t b);
template <>
inline uint32_t bytes<uint32_t>(uint8_t b) { return b * 0x01010101u; }
inline uint32_t bit_and(uint32_t a, uint32_t b) { return a & b; }
inline uint32_t bit_or(uint32_t a, uint32_t b) { return a | b; }
inline uint32_t shl16(uint32_t a, int n) { return ((a << n) & 0xFFFFu) | (((a >> 16) << n) & 0xFFFFu) << 16; }
inline uint32_t shr16(uint32_t a, int n) { return (a & 0xFFFFu) >> n | ((a >> 16) >> n) << 16; }
template <typename I>
inline I widen(const uint8_t* p);
template <typename I>
inline I widen(const int8_t* p);
template <>
inline uint32_t widen<uint32_t>(const uint8_t* p) { return *p; }
template <>
inline uint32_t widen<uint32_t>(const int8_t* p) { return static_cast<uint32_t>(int32_t{*p}); }
inline float to_float(uint32_t a) { return static_cast<float>(static_cast<int32_t>(a)); }

#ifdef __x86_64__
// the instructions each width's operations take (the half load F16C too, the 16-bit shifts AVX512BW)
#define SIMD_AVX2 __attribute__((target("avx2,fma")))
#define SIMD_F16C __attribute__((target("avx2,fma,f16c")))
#define SIMD_AVX512 __attribute__((target("avx512f")))
#define SIMD_AVX512BW __attribute__((target("avx512f,avx512bw")))

#if defined(__AVX2__) && defined(__FMA__)
#define SIMD_HAS_8 1
#endif
template <>
SIMD_AVX2 inline __m256 splat<__m256>(float x) { return _mm256_set1_ps(x); }
SIMD_AVX2 inline __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
SIMD_AVX2 inline __m256 sub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
SIMD_AVX2 inline __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
SIMD_AVX2 inline __m256 div(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
SIMD_AVX2 inline __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
SIMD_AVX2 inline __m256 neg(__m256 a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
// max(lo, x) then min(hi, .): each returns its second operand where one is NaN, as std::max(x, lo) and std::min(., hi) do
SIMD_AVX2 inline __m256 clamp(__m256 x, float lo, float hi) {
  return _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), x));
}
SIMD_AVX2 inline __m256 round_even(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_CUR_DIRECTION); }
SIMD_AVX2 inline __m256 pow2(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
template <>
SIMD_AVX2 inline __m256 load<__m256>(const float* p) { return _mm256_loadu_ps(p); }
template <>
SIMD_AVX2 inline __m256 load<__m256>(const c10::BFloat16* p) {  // widened exactly: the bits moved up
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
template <>
SIMD_F16C inline __m256 load<__m256>(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SIMD_AVX2 inline void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// c10::BFloat16's rounding: to nearest, ties to even, a NaN as 0x7FC0
SIMD_AVX2 inline void store(c10::BFloat16* p, __m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7FFF));
  __m256i h = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  h = _mm256_blendv_epi8(h, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
template <>
SIMD_AVX2 inline __m256i load<__m256i>(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
template <>
SIMD_AVX2 inline __m256i bytes<__m256i>(uint8_t b) { return _mm256_set1_epi8(static_cast<char>(b)); }
SIMD_AVX2 inline __m256i bit_and(__m256i a, __m256i b) { return _mm256_and_si256(a, b); }
SIMD_AVX2 inline __m256i bit_or(__m256i a, __m256i b) { return _mm256_or_si256(a, b); }
SIMD_AVX2 inline __m256i shl16(__m256i a, int n) { return _mm256_slli_epi16(a, n); }
SIMD_AVX2 inline __m256i shr16(__m256i a, int n) { return _mm256_srli_epi16(a, n); }
template <>
SIMD_AVX2 inline __m256i widen<__m256i>(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
template <>
SIMD_AVX2 inline __m256i widen<__m256i>(const int8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
SIMD_AVX2 inline __m256 to_float(__m256i a) { return _mm256_cvtepi32_ps(a); }

#if defined(__AVX512F__)
#define SIMD_HAS_16 1
#endif
template <>
SIMD_AVX512 inline __m512 splat<__m512>(float x) { return _mm512_set1_ps(x); }
SIMD_AVX512 inline __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
SIMD_AVX512 inline __m512 sub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
SIMD_AVX512 inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
SIMD_AVX512 inline __m512 div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
SIMD_AVX512 inline __m512 fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
SIMD_AVX512 inline __m512 neg(__m512 a) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int32_t>(0x80000000u))));
}
SIMD_AVX512 inline __m512 clamp(__m512 x, float lo, float hi) {
  return _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x));
}
SIMD_AVX512 inline __m512 round_even(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_CUR_DIRECTION); }
SIMD_AVX512 inline __m512 pow2(__m512 n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
}
template <>
SIMD_AVX512 inline __m512 load<__m512>(const float* p) { return _mm512_loadu_ps(p); }
template <>
SIMD_AVX512 inline __m512 load<__m512>(const c10::BFloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
template <>
SIMD_AVX512 inline __m512 load<__m512>(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
SIMD_AVX512 inline void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
SIMD_AVX512 inline void store(c10::BFloat16* p, __m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
  __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  h = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), h, _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(h));
}
template <>
SIMD_AVX512 inline __m512i load<__m512i>(const uint8_t* p) { return _mm512_loadu_si512(p); }
template <>
SIMD_AVX512 inline __m512i bytes<__m512i>(uint8_t b) { return _mm512_set1_epi8(static_cast<char>(b)); }
SIMD_AVX512 inline __m512i bit_and(__m512i a, __m512i b) { return _mm512_and_si512(a, b); }
SIMD_AVX512 inline __m512i bit_or(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
SIMD_AVX512BW inline __m512i shl16(__m512i a, int n) { return _mm512_slli_epi16(a, n); }
SIMD_AVX512BW inline __m512i shr16(__m512i a, int n) { return _mm512_srli_epi16(a, n); }
template <>
SIMD_AVX512 inline __m512i widen<__m512i>(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <>
SIMD_AVX512 inline __m512i widen<__m512i>(const int8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SIMD_AVX512 inline __m512 to_float(__m512i a) { return _mm512_cvtepi32_ps(a); }
#endif

// e^x from +, *, fma and rounding only, clamped to [-87, 88] (a NaN passes through)
template <typename V>
inline V exp_fixed(V x) {
  x = clamp(x, -87.0f, 88.0f);
  V n = round_even(mul(x, splat<V>(1.44269504088896341f)));
  V r = fma(n, splat<V>(-0.693359375f), x);
  r = fma(n, splat<V>(2.12194440e-4f), r);
  V p = splat<V>(1.9875691500e-4f);
  p = fma(p, r, splat<V>(1.3981999507e-3f));
  p = fma(p, r, splat<V>(8.3334519073e-3f));
  p = fma(p, r, splat<V>(4.1665795894e-2f));
  p = fma(p, r, splat<V>(1.6666665459e-1f));
  p = fma(p, r, splat<V>(5.0000001201e-1f));
  p = add(fma(p, mul(r, r), r), splat<V>(1.0f));
  return mul(p, pow2(n));
}

// tanh as 1 - 2 / (1 + e^2z) (about 1e-7 off near 0, where it is small)
template <typename V>
inline V tanh_fixed(V z) {
  const V one = splat<V>(1.0f);
  return sub(one, div(splat<V>(2.0f), add(one, exp_fixed(add(z, z)))));
}

// silu(gate) * up: gate / (1 + e^-gate) * up
template <typename V>
inline V silu_gate(V g, V u) {
  return mul(div(g, add(splat<V>(1.0f), exp_fixed(neg(g)))), u);
}

// GELU (tanh) of gate times up: 0.5 g (1 + tanh(y)) = g / (1 + e^-2y), y = sqrt(2/pi) (g + 0.044715 g^3) (no
// cancellation where tanh nears -1)
template <typename V>
inline V gelu_gate(V g, V u) {
  V y = mul(splat<V>(0.7978845608028654f), add(g, mul(splat<V>(0.044715f), mul(mul(g, g), g))));
  return mul(div(g, add(splat<V>(1.0f), exp_fixed(neg(add(y, y))))), u);
}

// out[j] = op(g[j], u[j]) for j in [from, to): 16 lanes at a time, then 8, then one (only one where !vectors);
// every element the same bits whichever of them takes it
template <typename T, typename Op>
inline void gated_span(const T* g, const T* u, T* out, int64_t from, int64_t to, bool vectors, Op op) {
  int64_t j = from;
  if (vectors) {
#ifdef SIMD_HAS_16
    for (; j + 16 <= to; j += 16) store(out + j, op(load<__m512>(g + j), load<__m512>(u + j)));
#endif
#ifdef SIMD_HAS_8
    for (; j + 8 <= to; j += 8) store(out + j, op(load<__m256>(g + j), load<__m256>(u + j)));
#endif
  }
  for (; j < to; ++j) store(out + j, op(load<float>(g + j), load<float>(u + j)));
}

}  // namespace simd
