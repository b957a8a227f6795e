// The vector operations the CPU block kernels (attention_blocks.h) are written in, one
// `Simd` per kernel build: 16 float lanes with mask registers in the AVX-512 build, 8 lanes
// with blend masks in the AVX2+FMA (+F16C) build; the baseline build has none and keeps the
// generic loops of attention_tile.h. Each also says how many accumulators its register file
// holds, as the sizes of the kernels' register blocks.
#ifndef SPLITKV_CPU_SIMD_H_
#define SPLITKV_CPU_SIMD_H_

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cc/splitkv/cpu/dtype.h"
#include "cc/splitkv/cpu/exp_poly.h"
#include "cc/splitkv/cpu/isa.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define SPLITKV_CPU_HAS_BLOCK_KERNELS 1
#include <immintrin.h>

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {

struct Simd {
  using V = __m512;
  using M = __mmask16;
  using VI = __m512i;
  static constexpr int kLanes = 16;
  // Row-lane kernels: up to 4 chunks of rows in registers; keys (scores) or output
  // elements (P.V) per block: 4 x 4 or 8 x 2 accumulators of 32 registers.
  static constexpr int kMaxChunks = 4;
  static constexpr int BlockWidth(int chunks) { return chunks >= 3 ? 4 : 8; }
  // Few-row kernels: output chunks per row in registers (4 rows x 4 chunks).
  static constexpr int kDirectChunks = 4;

  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }

  // kLanes elements of a K or V row as float32 (exact for every input type).
  static V Widen(const float* p) { return _mm512_loadu_ps(p); }
  static V Widen(const BFloat16* p) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  static V Widen(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

  static float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
  static float ReduceNanMax(V v) {
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) return std::numeric_limits<float>::quiet_NaN();
    return _mm512_reduce_max_ps(v);
  }
  // Lane-wise max that keeps a NaN from either side (NanMax in attention_tile.h).
  static V NanMax(V a, V b) {
    return _mm512_mask_add_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), a, b);
  }
  // ExpNonPositive (attention_tile.h) per lane: the same reduction and polynomial
  // (exp_poly.h); scalef applies 2^n. A NaN passes through; below -87 (and -inf) gives 0.
  static V Exp(V x) {
    const V clamped = _mm512_max_ps(Set1(kExpLowest), x);  // returns x when either is NaN
    const V n = _mm512_roundscale_ps(Mul(clamped, Set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V r = Fma(n, Set1(kLn2Low), _mm512_fnmadd_ps(n, Set1(kLn2High), clamped));
    const V poly = ExpPolynomial<Simd>(r);
    const M underflow = _mm512_cmp_ps_mask(x, Set1(kExpLowest), _CMP_LT_OQ);
    return _mm512_maskz_mov_ps(static_cast<M>(~underflow), _mm512_scalef_ps(poly, n));
  }

  // Lanes j0 + [0, kLanes) that fall in [lo, hi).
  static M LaneRange(int64_t j0, int64_t lo, int64_t hi) {
    const int64_t a = std::clamp<int64_t>(lo - j0, 0, kLanes);
    const int64_t b = std::clamp<int64_t>(hi - j0, 0, kLanes);
    if (b <= a) return 0;
    const uint32_t upto_b = b == kLanes ? 0xffffu : (1u << b) - 1u;
    return static_cast<M>(upto_b & ~((1u << a) - 1u));
  }
  static VI LoadInt(const int32_t* p) { return _mm512_loadu_si512(p); }
  // Lanes whose [lo, hi) holds key.
  static M Sees(int32_t key, VI lo, VI hi) {
    const VI k = _mm512_set1_epi32(key);
    return _mm512_cmpge_epi32_mask(k, lo) & _mm512_cmplt_epi32_mask(k, hi);
  }
  static M IsNegInf(V v) { return _mm512_cmp_ps_mask(v, Set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ); }
  static M Not(M m) { return static_cast<M>(~m); }
  static V Select(M m, V if_true, V if_false) { return _mm512_mask_mov_ps(if_false, m, if_true); }
  static V KeepIf(M m, V x) { return _mm512_maskz_mov_ps(m, x); }
  // m ? a * b + c : c per lane.
  static V MaskedFma(M m, V a, V b, V c) { return _mm512_mask3_fmadd_ps(a, b, c, m); }
};

}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPLITKV_CPU_HAS_BLOCK_KERNELS 1
#include <immintrin.h>

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {

struct Simd {
  using V = __m256;
  using M = __m256;  // all-ones lanes where true
  using VI = __m256i;
  static constexpr int kLanes = 8;
  // 16 registers: 2 chunks of rows x 4 keys (or output elements), or 1 x 8.
  static constexpr int kMaxChunks = 2;
  static constexpr int BlockWidth(int chunks) { return chunks >= 2 ? 4 : 8; }
  static constexpr int kDirectChunks = 2;

  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }

  static V Widen(const float* p) { return _mm256_loadu_ps(p); }
  static V Widen(const BFloat16* p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
  static V Widen(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

  static float ReduceAdd(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float ReduceNanMax(V v) {
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) return std::numeric_limits<float>::quiet_NaN();
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static V NanMax(V a, V b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), Add(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static V Exp(V x) {
    const V clamped = _mm256_max_ps(Set1(kExpLowest), x);  // returns x when either is NaN
    const V n = _mm256_round_ps(Mul(clamped, Set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V r = Fma(n, Set1(kLn2Low), _mm256_fnmadd_ps(n, Set1(kLn2High), clamped));
    const V poly = ExpPolynomial<Simd>(r);
    // 2^n by the exponent field: n >= -126 after the clamp, so the scale stays normal.
    const V scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    const V underflow = _mm256_cmp_ps(x, Set1(kExpLowest), _CMP_LT_OQ);
    return _mm256_andnot_ps(underflow, Mul(poly, scale));
  }

  static M LaneRange(int64_t j0, int64_t lo, int64_t hi) {
    const VI lane = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(j0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const VI below_lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(lo)), lane);
    const VI below_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(hi)), lane);
    return _mm256_castsi256_ps(_mm256_andnot_si256(below_lo, below_hi));
  }
  static VI LoadInt(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static M Sees(int32_t key, VI lo, VI hi) {
    const VI k = _mm256_set1_epi32(key);
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(lo, k), _mm256_cmpgt_epi32(hi, k)));
  }
  static M IsNegInf(V v) { return _mm256_cmp_ps(v, Set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ); }
  static M Not(M m) { return _mm256_xor_ps(m, _mm256_castsi256_ps(_mm256_set1_epi32(-1))); }
  static V Select(M m, V if_true, V if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  static V KeepIf(M m, V x) { return _mm256_and_ps(m, x); }
  static V MaskedFma(M m, V a, V b, V c) { return _mm256_blendv_ps(c, Fma(a, b, c), m); }
};

}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu

#endif  // ISA
#endif  // SPLITKV_CPU_SIMD_H_
