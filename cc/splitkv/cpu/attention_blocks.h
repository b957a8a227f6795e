// Vector block kernels of the CPU backend, written in the build's `Simd` (simd.h: AVX-512
// or AVX2+FMA; the baseline build has none): attention_tile.h runs them for head_dim a
// multiple of the vector width. They keep the generic path's state (acc, row_max, row_sum
// per query row) and its masking rules, so the tile's epilogue and the split-counter
// protocol stay shared.
//
// Two shapes of work:
// - Few rows (decode, <= kDirectMaxRows): lanes run along head_dim; K and V rows are read
//   in place (float32) or widened in registers (bfloat16, float16), never copied. Decode is
//   bound by memory, so the next block's rows are prefetched.
// - Many rows (prefill): lanes run along query rows. Q is transposed once per tile; scores
//   are broadcast(k[j][e]) x Q^T[e][rows] and outputs broadcast(v[j][e]) x P^T[j][rows], so
//   K and V need no transpose (only a copy of each 64-key block into one contiguous
//   buffer), and the online softmax is element-wise across rows. In the AVX-512 build,
//   bfloat16 scores use the BF16 dot product (exact products, float32 sums).
#ifndef SPLITKV_CPU_ATTENTION_BLOCKS_H_
#define SPLITKV_CPU_ATTENTION_BLOCKS_H_

#include "cc/splitkv/cpu/simd.h"

#ifdef SPLITKV_CPU_HAS_BLOCK_KERNELS

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/splitkv/cpu/dtype.h"
#include "cc/splitkv/cpu/isa.h"

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {
namespace blocks {

inline constexpr int64_t kBlock = 64;         // keys per block (the split granularity too)
inline constexpr int64_t kDirectMaxRows = 8;  // tiles with more rows take the row-lane kernels
inline constexpr int64_t kL = Simd::kLanes;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using V = Simd::V;
using M = Simd::M;
using VI = Simd::VI;

// Per-thread buffers, reused across tasks. The kernels hold one thread_local Scratch, and
// GCC specialises them on it: an element access `s.qt[i]` in a loop then re-derives the
// variable's address (__tls_get_addr, a call in a shared library) for every element. Loops
// over elements therefore index a local pointer to the buffer's data. Written the other way,
// the transposes in RunKeysRowLanes took 2/3 of a tiny prefill's launch (16 queries x 16
// keys, 4 heads, head_dim 64: 37 us a call; docs/perf_log.md, session 56).
struct Scratch {
  Vector<float> qt, st, ot, keys, values, stat;  // stat: row_max, row_sum, rescale (x rows_pad)
  Vector<int32_t> lo, hi;                      // visible keys of each row lane
  Vector<uint32_t> qt2, keys2;                 // bfloat16 pairs (AVX-512 BF16 scores)
  Vector<const uint32_t*> kp2;
  Vector<const float*> kp, vp;
  const void* pf_k[kBlock];  // rows of the next block, to prefetch
  const void* pf_v[kBlock];
};

// ---------------------------------------------------------------------------------------
// Few rows: lanes along head_dim.

// scores[r * kBlock + j] = q_r . k_j for R rows (q row-major, d % kL == 0); prefetches
// the first pf_count rows of pf_k / pf_v along the way.
template <int R, typename T>
inline void ScoreRowsDirect(const float* q, int64_t d, const T* const* kp, int64_t nb, float* scores,
                            const void* const* pf_k, const void* const* pf_v, int64_t pf_count) {
  const int64_t row_bytes = d * static_cast<int64_t>(sizeof(T));
  for (int64_t j = 0; j < nb; ++j) {
    if (j < pf_count) {
      for (int64_t b = 0; b < row_bytes; b += 64) {
        _mm_prefetch(static_cast<const char*>(pf_k[j]) + b, _MM_HINT_T0);
        _mm_prefetch(static_cast<const char*>(pf_v[j]) + b, _MM_HINT_T0);
      }
    }
    V acc[R];
    for (int r = 0; r < R; ++r) acc[r] = Simd::Zero();
    const T* k = kp[j];
    for (int64_t e = 0; e < d; e += kL) {
      const V kv = Simd::Widen(k + e);
      for (int r = 0; r < R; ++r) acc[r] = Simd::Fma(Simd::Load(q + r * d + e), kv, acc[r]);
    }
    for (int r = 0; r < R; ++r) scores[r * kBlock + j] = Simd::ReduceAdd(acc[r]);
  }
}

// acc[r][e0 + kL c + .] += sum_{j in [jlo, jhi)} p[r * kBlock + j] v_j[...] for R rows and
// CE chunks of kL output elements. The block's sum is formed apart and added once, as the
// row sums are: added key by key into a running sum of millions of keys, float32 lost the
// keys' share (4 % off at 2^22 keys in one split; attention_tile.h AccumulateRows).
template <int R, int CE, typename T>
inline void AccumulateRowsDirect(const float* p, const T* const* vp, int64_t jlo, int64_t jhi, float* acc,
                                 int64_t d, int64_t e0) {
  V a[R][CE];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < CE; ++c) a[r][c] = Simd::Zero();
  }
  for (int64_t j = jlo; j < jhi; ++j) {
    V v[CE];
    for (int c = 0; c < CE; ++c) v[c] = Simd::Widen(vp[j] + e0 + kL * c);
    for (int r = 0; r < R; ++r) {
      const V pj = Simd::Set1(p[r * kBlock + j]);
      for (int c = 0; c < CE; ++c) a[r][c] = Simd::Fma(pj, v[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < CE; ++c) {
      float* const out = acc + r * d + e0 + kL * c;
      Simd::Store(out, Simd::Add(Simd::Load(out), a[r][c]));
    }
  }
}

template <int R, typename T>
inline void AccumulateRowsDirectAllChunks(const float* p, const T* const* vp, int64_t jlo, int64_t jhi,
                                          float* acc, int64_t d) {
  constexpr int kCE = Simd::kDirectChunks;
  int64_t e0 = 0;
  for (; e0 + kCE * kL <= d; e0 += kCE * kL) AccumulateRowsDirect<R, kCE>(p, vp, jlo, jhi, acc, d, e0);
  switch ((d - e0) / kL) {  // < kCE chunks left
    case 3: AccumulateRowsDirect<R, 3>(p, vp, jlo, jhi, acc, d, e0); break;
    case 2: AccumulateRowsDirect<R, 2>(p, vp, jlo, jhi, acc, d, e0); break;
    case 1: AccumulateRowsDirect<R, 1>(p, vp, jlo, jhi, acc, d, e0); break;
    default: break;
  }
}

template <typename T>
inline void ScoreRowsDirectAny(int64_t r_count, const float* q, int64_t d, const T* const* kp, int64_t nb,
                               float* scores, const void* const* pf_k, const void* const* pf_v,
                               int64_t pf_count) {
  switch (r_count) {
    case 4: return ScoreRowsDirect<4>(q, d, kp, nb, scores, pf_k, pf_v, pf_count);
    case 3: return ScoreRowsDirect<3>(q, d, kp, nb, scores, pf_k, pf_v, pf_count);
    case 2: return ScoreRowsDirect<2>(q, d, kp, nb, scores, pf_k, pf_v, pf_count);
    default: return ScoreRowsDirect<1>(q, d, kp, nb, scores, pf_k, pf_v, pf_count);
  }
}

template <typename T>
inline void AccumulateRowsDirectAny(int64_t r_count, const float* p, const T* const* vp, int64_t jlo,
                                    int64_t jhi, float* acc, int64_t d) {
  switch (r_count) {
    case 4: return AccumulateRowsDirectAllChunks<4>(p, vp, jlo, jhi, acc, d);
    case 3: return AccumulateRowsDirectAllChunks<3>(p, vp, jlo, jhi, acc, d);
    case 2: return AccumulateRowsDirectAllChunks<2>(p, vp, jlo, jhi, acc, d);
    default: return AccumulateRowsDirectAllChunks<1>(p, vp, jlo, jhi, acc, d);
  }
}

// The online softmax of one row over its visible keys [jlo, jhi) of a block of nb keys;
// the probabilities replace the scores (0 outside [jlo, jhi)). Returns false when the row
// has no finite logit yet (all weights 0, as in the generic path).
inline bool SoftmaxRowDirect(float* score, int64_t nb, int64_t jlo, int64_t jhi, float sm_scale, float cap,
                             float& row_max, float& row_sum, float* acc, int64_t d) {
  // The soft cap (a libm call) gets its own pass, so the main loops stay free of calls.
  if (cap > 0.0f) {
    for (int64_t j = jlo; j < jhi; ++j) score[j] = cap * std::tanh(score[j] * sm_scale / cap);
  }
  const V scale = Simd::Set1(cap > 0.0f ? 1.0f : sm_scale);
  const V neg_inf = Simd::Set1(kNegInf);
  V m = neg_inf;
  for (int64_t j0 = 0; j0 < nb; j0 += kL) {
    const V x = Simd::Select(Simd::LaneRange(j0, jlo, jhi), Simd::Mul(Simd::Load(score + j0), scale), neg_inf);
    Simd::Store(score + j0, x);
    m = Simd::NanMax(m, x);
  }
  const float block_max = Simd::ReduceNanMax(m);
  const float new_max = (row_max < block_max || block_max != block_max) ? block_max : row_max;
  if (new_max == kNegInf) {
    for (int64_t j0 = 0; j0 < nb; j0 += kL) Simd::Store(score + j0, Simd::Zero());
    return false;
  }
  const float rescale = std::exp(row_max - new_max);
  if (rescale != 1.0f) {
    const V rs = Simd::Set1(rescale);
    for (int64_t e = 0; e < d; e += kL) Simd::Store(acc + e, Simd::Mul(Simd::Load(acc + e), rs));
  }
  const V mx = Simd::Set1(new_max);
  V sum = Simd::Zero();
  for (int64_t j0 = 0; j0 < nb; j0 += kL) {
    const V p = Simd::KeepIf(Simd::LaneRange(j0, jlo, jhi), Simd::Exp(Simd::Sub(Simd::Load(score + j0), mx)));
    Simd::Store(score + j0, p);
    sum = Simd::Add(sum, p);
  }
  row_max = new_max;
  row_sum = row_sum * rescale + Simd::ReduceAdd(sum);
  return true;
}

// ---------------------------------------------------------------------------------------
// Many rows: lanes along query rows (rows_pad rp = kL x chunks).

// st[jj * rp + lanes] = sum_e k_{jj}[e] qt[e * rp + lanes] for JB keys and C chunks of rows.
template <int C, int JB>
inline void ScoreBlockT(const float* qt, int64_t rp, const float* const* kp, int64_t d, float* st) {
  V acc[JB][C];
  for (int jj = 0; jj < JB; ++jj) {
    for (int c = 0; c < C; ++c) acc[jj][c] = Simd::Zero();
  }
  for (int64_t e = 0; e < d; ++e) {
    V q[C];
    for (int c = 0; c < C; ++c) q[c] = Simd::Load(qt + e * rp + kL * c);
    for (int jj = 0; jj < JB; ++jj) {
      const V k = Simd::Set1(kp[jj][e]);
      for (int c = 0; c < C; ++c) acc[jj][c] = Simd::Fma(q[c], k, acc[jj][c]);
    }
  }
  for (int jj = 0; jj < JB; ++jj) {
    for (int c = 0; c < C; ++c) Simd::Store(st + jj * rp + kL * c, acc[jj][c]);
  }
}

template <int C>
inline void ScoreBlockTAllKeys(const float* qt, int64_t rp, const float* const* kp, int64_t nb, int64_t d,
                               float* st) {
  constexpr int kJB = Simd::BlockWidth(C);
  int64_t j = 0;
  for (; j + kJB <= nb; j += kJB) ScoreBlockT<C, kJB>(qt, rp, kp + j, d, st + j * rp);
  for (; j < nb; ++j) ScoreBlockT<C, 1>(qt, rp, kp + j, d, st + j * rp);
}

#ifdef __AVX512BF16__
// ScoreBlockT for bfloat16 q and k with AVX-512 BF16 dot products, two head_dim elements
// per instruction: qt2[e2 * rp + lane] holds the pair (q[e], q[e + 1]) with e = 2 e2, and a
// key row's pairs are its own memory order. Products of two bfloat16 are exact in float32,
// and sums stay float32, so this matches the float32 path to rounding.
template <int C, int JB>
inline void ScoreBlockTBf16(const uint32_t* qt2, int64_t rp, const uint32_t* const* kp, int64_t pairs,
                            float* st) {
  __m512 acc[JB][C];
  for (int jj = 0; jj < JB; ++jj) {
    for (int c = 0; c < C; ++c) acc[jj][c] = _mm512_setzero_ps();
  }
  for (int64_t e2 = 0; e2 < pairs; ++e2) {
    __m512bh q[C];
    for (int c = 0; c < C; ++c) q[c] = (__m512bh)_mm512_loadu_si512(qt2 + e2 * rp + 16 * c);
    for (int jj = 0; jj < JB; ++jj) {
      const __m512bh k = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(kp[jj][e2]));
      for (int c = 0; c < C; ++c) acc[jj][c] = _mm512_dpbf16_ps(acc[jj][c], q[c], k);
    }
  }
  for (int jj = 0; jj < JB; ++jj) {
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(st + jj * rp + 16 * c, acc[jj][c]);
  }
}

template <int C>
inline void ScoreBlockTBf16AllKeys(const uint32_t* qt2, int64_t rp, const uint32_t* const* kp, int64_t nb,
                                   int64_t pairs, float* st) {
  constexpr int kJB = Simd::BlockWidth(C);
  int64_t j = 0;
  for (; j + kJB <= nb; j += kJB) ScoreBlockTBf16<C, kJB>(qt2, rp, kp + j, pairs, st + j * rp);
  for (; j < nb; ++j) ScoreBlockTBf16<C, 1>(qt2, rp, kp + j, pairs, st + j * rp);
}

// VDPBF16PS treats denormal inputs as 0 and flushes denormal results to 0, whatever MXCSR
// says: a denormal q or k (its product with a large one can be a large logit) or a product
// below 2^-126 would be lost, where the float32 path keeps it. Exponent fields (biased, 1..255)
// of the smallest nonzero element: 0 when one is denormal, 255 when all are zero.
inline int MinExponentBf16(const uint16_t* x, int64_t n) {
  const __m512i magnitude_mask = _mm512_set1_epi16(0x7fff);
  __m512i lowest = _mm512_set1_epi16(255);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i magnitude = _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude_mask);
    const __mmask32 zero = _mm512_cmpeq_epi16_mask(magnitude, _mm512_setzero_si512());
    const __m512i exponent = _mm512_mask_mov_epi16(_mm512_srli_epi16(magnitude, 7), zero, _mm512_set1_epi16(255));
    lowest = _mm512_min_epu16(lowest, exponent);
  }
  uint16_t lanes[32];
  _mm512_storeu_si512(lanes, lowest);
  int result = 255;
  for (const uint16_t lane : lanes) result = std::min<int>(result, lane);
  for (; i < n; ++i) {
    const int magnitude = x[i] & 0x7fff;
    if (magnitude != 0) result = std::min(result, magnitude >> 7);
  }
  return result;
}

// Whether products of elements with these smallest exponent fields stay exact in the BF16
// dot product: no denormal input, and every nonzero product >= 2^-100, so that a flushed
// partial sum (< 2^-126) is below the float32 path's own rounding of such products.
inline bool Bf16DotExact(int q_min_exponent, int k_min_exponent) {
  return q_min_exponent >= 1 && k_min_exponent >= 1 && q_min_exponent + k_min_exponent - 254 >= -100;
}
#endif  // __AVX512BF16__

// ot[(e0 + ee) * rp + lanes] = ot * rescale + sum_j v_j[e0 + ee] pt[j * rp + lanes], for EB
// output elements and C chunks of rows. Masked: a lane adds key j only if lo <= kb + j < hi,
// so an invisible key's value (even NaN) never meets a zero weight. The block's sum is formed
// apart and added once (see AccumulateRowsDirect).
template <int C, int EB, bool kMasked>
inline void AccumulateBlockT(const float* pt, int64_t rp, const float* const* vp, int64_t nb, int64_t e0,
                             float* ot, const float* rescale, const int32_t* lo, const int32_t* hi, int64_t kb) {
  V acc[EB][C];
  for (int c = 0; c < C; ++c) {
    for (int ee = 0; ee < EB; ++ee) acc[ee][c] = Simd::Zero();
  }
  VI lo_v[C], hi_v[C];
  if constexpr (kMasked) {
    for (int c = 0; c < C; ++c) {
      lo_v[c] = Simd::LoadInt(lo + kL * c);
      hi_v[c] = Simd::LoadInt(hi + kL * c);
    }
  }
  for (int64_t j = 0; j < nb; ++j) {
    V p[C];
    for (int c = 0; c < C; ++c) p[c] = Simd::Load(pt + j * rp + kL * c);
    const float* v = vp[j] + e0;
    if constexpr (kMasked) {
      M sees[C];
      for (int c = 0; c < C; ++c) sees[c] = Simd::Sees(static_cast<int32_t>(kb + j), lo_v[c], hi_v[c]);
      for (int ee = 0; ee < EB; ++ee) {
        const V vb = Simd::Set1(v[ee]);
        for (int c = 0; c < C; ++c) acc[ee][c] = Simd::MaskedFma(sees[c], p[c], vb, acc[ee][c]);
      }
    } else {
      for (int ee = 0; ee < EB; ++ee) {
        const V vb = Simd::Set1(v[ee]);
        for (int c = 0; c < C; ++c) acc[ee][c] = Simd::Fma(p[c], vb, acc[ee][c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    const V rs = Simd::Load(rescale + kL * c);
    for (int ee = 0; ee < EB; ++ee) {
      float* const out = ot + (e0 + ee) * rp + kL * c;
      Simd::Store(out, Simd::Add(Simd::Mul(Simd::Load(out), rs), acc[ee][c]));
    }
  }
}

template <int C, bool kMasked>
inline void AccumulateBlockTAllDims(const float* pt, int64_t rp, const float* const* vp, int64_t nb, int64_t d,
                                    float* ot, const float* rescale, const int32_t* lo, const int32_t* hi,
                                    int64_t kb) {
  constexpr int kEB = Simd::BlockWidth(C);  // divides d (d % kL == 0)
  for (int64_t e0 = 0; e0 < d; e0 += kEB) {
    AccumulateBlockT<C, kEB, kMasked>(pt, rp, vp, nb, e0, ot, rescale, lo, hi, kb);
  }
}

// Runs the row-lane kernels on groups of up to Simd::kMaxChunks chunks of rows.
template <typename Fn>
inline void ForChunkGroups(int64_t chunks, const Fn& fn) {
  for (int64_t c0 = 0; c0 < chunks; c0 += Simd::kMaxChunks) {
    const int64_t n = std::min<int64_t>(Simd::kMaxChunks, chunks - c0);
    switch (n) {
      case 4: if constexpr (Simd::kMaxChunks >= 4) fn(c0, std::integral_constant<int, 4>()); break;
      case 3: if constexpr (Simd::kMaxChunks >= 3) fn(c0, std::integral_constant<int, 3>()); break;
      case 2: fn(c0, std::integral_constant<int, 2>()); break;
      default: fn(c0, std::integral_constant<int, 1>()); break;
    }
  }
}

// Copies nb key (or value) rows as float32 into one contiguous block, for the row-lane
// kernels' broadcasts: float32 rows are copied too, since rows of a token-major tensor sit
// a power of two apart (num_kv_heads x head_dim x 4 bytes) and would share a few L1 sets.
template <typename T>
inline const float* const* RowsAsFloat(const T* const* src, int64_t nb, int64_t d, Vector<float>& buf,
                                       Vector<const float*>& ptrs) {
  for (int64_t j = 0; j < nb; ++j) {
    float* dst = &buf[j * d];
    for (int64_t e = 0; e < d; e += kL) Simd::Store(dst + e, Simd::Widen(src[j] + e));
    ptrs[j] = dst;
  }
  return ptrs.data();
}

// ---------------------------------------------------------------------------------------
// Drivers: keys [key_begin, key_end) of one split against the tile's rows. q: float32 rows
// (row-major, d); row_lo/row_hi: visible keys of each row; acc/row_max/row_sum: the online
// softmax state, as the generic path keeps it.

struct RowState {
  const float* q;
  const int64_t* row_lo;
  const int64_t* row_hi;
  int64_t rows, d;
  float sm_scale, cap;
  float* acc;
  float* row_max;
  float* row_sum;
};

template <typename T, typename Kv>
void RunKeysDirect(const Kv& kv, int64_t key_begin, int64_t key_end, const RowState& st, Scratch& s) {
  const int64_t d = st.d;
  s.st.resize(kDirectMaxRows * kBlock);
  const T* kp[kBlock];
  const T* vp[kBlock];
  for (int64_t kb = key_begin; kb < key_end; kb += kBlock) {
    const int64_t nb = std::min(kBlock, key_end - kb);
    for (int64_t j = 0; j < nb; ++j) {
      kp[j] = kv.Key(kb + j);
      vp[j] = kv.Value(kb + j);
    }
    // Decode is bound by memory, and pages come in any order, so the hardware prefetcher
    // loses the stream at every page: the first row group asks for the next block's rows.
    const int64_t next = std::min(kBlock, key_end - kb - nb);
    for (int64_t j = 0; j < next; ++j) {
      s.pf_k[j] = kv.Key(kb + nb + j);
      s.pf_v[j] = kv.Value(kb + nb + j);
    }
    float* const scores = s.st.data();  // a local pointer, not s.st[]: see Scratch
    for (int64_t j = nb; j < (nb + kL - 1) / kL * kL; ++j) {
      for (int64_t r = 0; r < st.rows; ++r) scores[r * kBlock + j] = 0.0f;
    }
    for (int64_t r0 = 0; r0 < st.rows; r0 += 4) {
      const int64_t n = std::min<int64_t>(4, st.rows - r0);
      ScoreRowsDirectAny(n, st.q + r0 * d, d, kp, nb, &s.st[r0 * kBlock], s.pf_k, s.pf_v, r0 == 0 ? next : 0);
    }
    int64_t lo[kDirectMaxRows], hi[kDirectMaxRows];
    bool live[kDirectMaxRows];
    for (int64_t r = 0; r < st.rows; ++r) {
      lo[r] = std::clamp(st.row_lo[r] - kb, int64_t{0}, nb);
      hi[r] = std::clamp(st.row_hi[r] - kb, int64_t{0}, nb);
      // A row whose logits are all -inf so far still takes its weights (all 0) times the
      // visible values: a non-finite value must reach it as in the generic path.
      live[r] = lo[r] < hi[r];
      if (live[r]) {
        SoftmaxRowDirect(&s.st[r * kBlock], nb, lo[r], hi[r], st.sm_scale, st.cap, st.row_max[r], st.row_sum[r],
                         st.acc + r * d, d);
      }
    }
    // P.V: rows with the same visible keys share each value row's load; a row sums only its
    // own visible keys.
    for (int64_t r0 = 0; r0 < st.rows;) {
      int64_t n = 1;
      while (n < 4 && r0 + n < st.rows && lo[r0 + n] == lo[r0] && hi[r0 + n] == hi[r0] &&
             live[r0 + n] == live[r0]) {
        ++n;
      }
      if (live[r0]) AccumulateRowsDirectAny(n, &s.st[r0 * kBlock], vp, lo[r0], hi[r0], st.acc + r0 * d, d);
      r0 += n;
    }
  }
}

// `bf16_dot_allowed`: false in batch-invariant mode, where whether the BF16 dot product
// applies (it depends on every row's q) must not change a row's scores.
template <typename T, typename Kv>
void RunKeysRowLanes(const Kv& kv, int64_t key_begin, int64_t key_end, const RowState& st, Scratch& s,
                     bool bf16_dot_allowed) {
  const int64_t d = st.d;
  const int64_t chunks = (st.rows + kL - 1) / kL;
  const int64_t rp = chunks * kL;
#ifdef __AVX512BF16__
  constexpr bool kBf16Dot = std::is_same_v<T, BFloat16>;
#else
  constexpr bool kBf16Dot = false;
#endif
  const int64_t pairs = d / 2;
  // float32 Q^T, made on first use: bfloat16 tiles take it only for keys (or a q) the BF16
  // dot product would not keep exact (Bf16DotExact).
  bool qt_ready = false;
  auto ensure_qt = [&] {
    if (qt_ready) return;
    s.qt.assign(d * rp, 0.0f);
    float* const qt = s.qt.data();  // a local pointer, not s.qt[]: see Scratch
    for (int64_t r = 0; r < st.rows; ++r) {
      for (int64_t e = 0; e < d; ++e) qt[e * rp + r] = st.q[r * d + e];
    }
    qt_ready = true;
  };
  [[maybe_unused]] int q_min_exponent = 0;  // of the tile's q, for Bf16DotExact
  if constexpr (kBf16Dot) {
    // q came from bfloat16, so its float32 copy's upper halves are the original values.
    s.qt2.assign(pairs * rp, 0u);
    uint32_t* const qt2 = s.qt2.data();
    for (int64_t r = 0; r < st.rows; ++r) {
      for (int64_t e2 = 0; e2 < pairs; ++e2) {
        qt2[e2 * rp + r] =
            (FloatToBits(st.q[r * d + 2 * e2]) >> 16) | (FloatToBits(st.q[r * d + 2 * e2 + 1]) & 0xffff0000u);
      }
    }
#ifdef __AVX512BF16__
    q_min_exponent = MinExponentBf16(reinterpret_cast<const uint16_t*>(s.qt2.data()), 2 * pairs * rp);
#endif
    s.keys2.resize(kBlock * pairs);
    s.kp2.resize(kBlock);
  }
  s.st.resize(kBlock * rp);
  s.ot.assign(d * rp, 0.0f);
  s.stat.resize(3 * rp);
  float* max_v = &s.stat[0];
  float* sum_v = &s.stat[rp];
  float* rescale_v = &s.stat[2 * rp];
  std::fill(max_v, max_v + rp, kNegInf);
  std::fill(sum_v, sum_v + rp, 0.0f);
  s.lo.assign(rp, 0);
  s.hi.assign(rp, 0);  // padding lanes see nothing
  int32_t* const lo = s.lo.data();
  int32_t* const hi = s.hi.data();
  for (int64_t r = 0; r < st.rows; ++r) {
    lo[r] = static_cast<int32_t>(st.row_lo[r]);
    hi[r] = static_cast<int32_t>(st.row_hi[r]);
  }
  s.keys.resize(kBlock * d);
  s.values.resize(kBlock * d);
  s.kp.resize(kBlock);
  s.vp.resize(kBlock);
  const T* kp_src[kBlock];
  const T* vp_src[kBlock];
  const V neg_inf = Simd::Set1(kNegInf);

  for (int64_t kb = key_begin; kb < key_end; kb += kBlock) {
    const int64_t nb = std::min(kBlock, key_end - kb);
    for (int64_t j = 0; j < nb; ++j) {
      kp_src[j] = kv.Key(kb + j);
      vp_src[j] = kv.Value(kb + j);
    }
    const float* const* kp = nullptr;
    bool bf16_dot = false;  // this block's scores from the BF16 dot product
#ifdef __AVX512BF16__
    if constexpr (kBf16Dot) {
      if (bf16_dot_allowed && q_min_exponent >= 1) {
        // Copied as they are into one block (rows of the source share L1 sets, see RowsAsFloat).
        for (int64_t j = 0; j < nb; ++j) {
          uint32_t* dst = &s.keys2[j * pairs];
          const auto* src = reinterpret_cast<const uint32_t*>(kp_src[j]);
          int64_t e2 = 0;
          for (; e2 + 16 <= pairs; e2 += 16) _mm512_storeu_si512(dst + e2, _mm512_loadu_si512(src + e2));
          for (; e2 < pairs; ++e2) dst[e2] = src[e2];
          s.kp2[j] = dst;
        }
        const int k_min_exponent = MinExponentBf16(reinterpret_cast<const uint16_t*>(s.keys2.data()), nb * d);
        bf16_dot = Bf16DotExact(q_min_exponent, k_min_exponent);
      }
    }
#endif
    if (!bf16_dot) {
      ensure_qt();
      kp = RowsAsFloat(kp_src, nb, d, s.keys, s.kp);
    }
    // Rows of a token-major K/V sit far apart, out of the hardware prefetcher's reach: ask
    // for the next block's rows now, to arrive while this block computes.
    const int64_t next = std::min(kBlock, key_end - kb - nb);
    for (int64_t j = 0; j < next; ++j) {
      const char* k = reinterpret_cast<const char*>(kv.Key(kb + nb + j));
      const char* v = reinterpret_cast<const char*>(kv.Value(kb + nb + j));
      for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(T)); b += 64) {
        _mm_prefetch(k + b, _MM_HINT_T1);
        _mm_prefetch(v + b, _MM_HINT_T1);
      }
    }
    // Does every real row see the whole block? Then no lane needs a mask.
    bool full = true;
    for (int64_t r = 0; r < st.rows; ++r) full = full && st.row_lo[r] <= kb && kb + nb <= st.row_hi[r];

    ForChunkGroups(chunks, [&](int64_t c0, auto c_count) {
      constexpr int kC = decltype(c_count)::value;
#ifdef __AVX512BF16__
      if (bf16_dot) {
        ScoreBlockTBf16AllKeys<kC>(s.qt2.data() + kL * c0, rp, s.kp2.data(), nb, pairs, s.st.data() + kL * c0);
        return;
      }
#endif
      ScoreBlockTAllKeys<kC>(s.qt.data() + kL * c0, rp, kp, nb, d, s.st.data() + kL * c0);
    });

    // Online softmax, element-wise across row lanes. The soft cap (a libm call) gets its own
    // pass, so the main loops stay free of calls.
    float* const stp = s.st.data();
    if (st.cap > 0.0f) {
      for (int64_t i = 0; i < nb * rp; ++i) stp[i] = st.cap * std::tanh(stp[i] * st.sm_scale / st.cap);
    }
    const V scale = Simd::Set1(st.cap > 0.0f ? 1.0f : st.sm_scale);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t lane0 = kL * c;
      const VI lo_v = Simd::LoadInt(&s.lo[lane0]);
      const VI hi_v = Simd::LoadInt(&s.hi[lane0]);
      V m = neg_inf;
      for (int64_t j = 0; j < nb; ++j) {
        float* sj = stp + j * rp + lane0;
        V x = Simd::Mul(Simd::Load(sj), scale);
        if (!full) x = Simd::Select(Simd::Sees(static_cast<int32_t>(kb + j), lo_v, hi_v), x, neg_inf);
        Simd::Store(sj, x);
        m = Simd::NanMax(m, x);
      }
      const V old_max = Simd::Load(max_v + lane0);
      const V new_max = Simd::NanMax(old_max, m);
      // A lane with no finite logit yet keeps weight 0 and scale 1 (exp(-inf - -inf) is NaN).
      const M empty = Simd::IsNegInf(new_max);
      const V rescale = Simd::Select(empty, Simd::Set1(1.0f), Simd::Exp(Simd::Sub(old_max, new_max)));
      const M live = Simd::Not(empty);
      V sum = Simd::Zero();
      for (int64_t j = 0; j < nb; ++j) {
        float* sj = stp + j * rp + lane0;
        const V p = Simd::KeepIf(live, Simd::Exp(Simd::Sub(Simd::Load(sj), new_max)));
        Simd::Store(sj, p);
        sum = Simd::Add(sum, p);
      }
      Simd::Store(max_v + lane0, new_max);
      Simd::Store(sum_v + lane0, Simd::Fma(Simd::Load(sum_v + lane0), rescale, sum));
      Simd::Store(rescale_v + lane0, rescale);
    }

    const float* const* vp = RowsAsFloat(vp_src, nb, d, s.values, s.vp);
    ForChunkGroups(chunks, [&](int64_t c0, auto c_count) {
      constexpr int kC = decltype(c_count)::value;
      const int64_t lane0 = kL * c0;
      if (full) {
        AccumulateBlockTAllDims<kC, false>(s.st.data() + lane0, rp, vp, nb, d, s.ot.data() + lane0,
                                           rescale_v + lane0, nullptr, nullptr, kb);
      } else {
        AccumulateBlockTAllDims<kC, true>(s.st.data() + lane0, rp, vp, nb, d, s.ot.data() + lane0,
                                          rescale_v + lane0, &s.lo[lane0], &s.hi[lane0], kb);
      }
    });
  }

  const float* const ot = s.ot.data();
  for (int64_t r = 0; r < st.rows; ++r) {
    for (int64_t e = 0; e < d; ++e) st.acc[r * d + e] = ot[e * rp + r];
    st.row_max[r] = max_v[r];
    st.row_sum[r] = sum_v[r];
  }
}

// Runs the block kernels on keys [key_begin, key_end) if they apply (d % kL == 0).
// `invariant` (batch_invariant): every tile takes the row-lane kernels without the BF16 dot
// product, whose arithmetic per row lane does not depend on the other rows (the direct
// kernels reduce across head_dim lanes instead: other bits for the same row).
template <typename T, typename Kv>
bool RunKeys(const Kv& kv, int64_t key_begin, int64_t key_end, const RowState& st, bool invariant) {
  if (st.d % kL != 0) return false;
  thread_local Scratch s;
  if (st.rows <= kDirectMaxRows && !invariant) {
    RunKeysDirect<T>(kv, key_begin, key_end, st, s);
  } else {
    RunKeysRowLanes<T>(kv, key_begin, key_end, st, s, !invariant);
  }
  return true;
}

}  // namespace blocks
}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_HAS_BLOCK_KERNELS
#endif  // SPLITKV_CPU_ATTENTION_BLOCKS_H_
