// The online softmax of one key block in the wgmma prefill's register layout, shared by the
// wgmma prefill (prefill_sm90.cuh) and the decode kernel's batch-invariant wgmma-order path
// (decode_kernel.cuh kWgmmaOrder): one home for the float operations a batch-invariant row
// goes through, so the two kernels cannot drift apart (their products round alike:
// tools/gpu/mma_bits_probe.cu).
//
// Layout: a thread holds rows g = lane / 4 and g + 8 of its warp's 16, and in each 8-key
// accumulator tile c the columns 2 (lane % 4) and + 1: s[4 c + 2 i + e] is row i's key
// 8 c + 2 (lane % 4) + e of the block (a wgmma m64nN accumulator per warp, or mma.sync
// m16n8 tiles side by side).
#ifndef SPLITKV_CUDA_BLOCK_SOFTMAX_CUH_
#define SPLITKV_CUDA_BLOCK_SOFTMAX_CUH_

#include <cstdint>
#include <type_traits>

#include "cc/splitkv/cuda/ptx.cuh"          // FastExp2, PackPair
#include "cc/splitkv/cuda/split_merge.cuh"  // kLog2e, SPLITKV_NEG_INF

namespace splitkv::cuda {

// The logit scales of a call: without a soft cap and with sm_scale > 0 the max is taken over
// the raw logits and the scale enters each exponent through one fused multiply-add,
// exp2(s * scale_log2 - max), as FlashAttention-3 does; a soft cap (or a scale <= 0, whose
// max is not the raw max) turns every logit into log2 units first and the exponent's factor
// (exp_scale) is 1.
struct SoftmaxScales {
  float cap, cap_scale, cap_log2, scale_log2, exp_scale;
  __device__ __forceinline__ SoftmaxScales(float sm_scale, float soft_cap)
      : cap(soft_cap),
        cap_scale(soft_cap > 0.0f ? sm_scale / soft_cap : 0.0f),
        cap_log2(soft_cap * kLog2e),
        scale_log2(sm_scale * kLog2e),
        exp_scale(soft_cap > 0.0f || scale_log2 <= 0.0f ? 1.0f : scale_log2) {}  // members in order
};

// A probability stays below 2^kLazyRescaleLog2 against a stale running max (the lazy
// rescale of the default decode and prefill: a row's max is raised only when a block's max
// passes it by more than this, so most blocks leave the output accumulator as it is).
inline constexpr float kLazyRescaleLog2 = 8.0f;

// The pieces of BlockSoftmax, each one float operation sequence, for a caller that runs
// them on part of a block (the decode kernel's wgmma-order path: a warp exponentiates its
// quarter of the keys, then every thread sums the whole block's probabilities).
//
// One row's running max from its block max `block_max` (the raw max over the block's
// logits, quad-reduced), and alpha; returns the reference the exponents subtract.
__device__ __forceinline__ float UpdateRowMax(float block_max, const SoftmaxScales& sc, float& row_max,
                                              float& alpha) {
  const float m = fmaxf(row_max, block_max * sc.exp_scale);  // -inf stays -inf
  const float m_ref = m == SPLITKV_NEG_INF ? 0.0f : m;       // a row with no key yet: p = 0
  alpha = FastExp2(row_max - m_ref);
  row_max = m;
  return m_ref;
}
// UpdateRowMax with a lazily raised max (kLazy BlockSoftmax): the running max moves only
// where the block's passes it by more than kLazyRescaleLog2 (or the row had none), else
// alpha is exactly 1 and the exponents subtract the stale max, so the probabilities stay
// below 2^kLazyRescaleLog2. Not for batch-invariant rows: where a max moves depends on the
// blocks before, which a split boundary restarts.
__device__ __forceinline__ float UpdateRowMaxLazy(float block_max, const SoftmaxScales& sc, float& row_max,
                                                  float& alpha) {
  const float m = fmaxf(row_max, block_max * sc.exp_scale);
  // -inf - -inf is NaN: no comparison holds, the row keeps -inf (no key seen yet).
  if (m - row_max > kLazyRescaleLog2) return UpdateRowMax(block_max, sc, row_max, alpha);
  alpha = 1.0f;
  return row_max == SPLITKV_NEG_INF ? 0.0f : row_max;
}
// A logit's probability against the row's reference.
__device__ __forceinline__ float ExpLogit(float s, const SoftmaxScales& sc, float m_ref) {
  return FastExp2(fmaf(s, sc.exp_scale, -m_ref));
}
// The running sum after a block whose four chains summed to sum[0..3].
__device__ __forceinline__ float FoldBlockSum(float row_sum, float alpha, const float (&sum)[4]) {
  return row_sum * alpha + ((sum[0] + sum[1]) + (sum[2] + sum[3]));
}
// Row i's block sum from the whole block's probabilities s (BlockSoftmax's layout), in
// BlockSoftmax's chains and order.
template <int kSRegs>
__device__ __forceinline__ float AddBlockSum(const float (&s)[kSRegs], int i, float alpha, float row_sum) {
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int c = 0; c < kSRegs / 4; ++c) {
#pragma unroll
    for (int e = 0; e < 2; ++e) sum[(2 * c + e) % 4] += s[4 * c + 2 * i + e];
  }
  return FoldBlockSum(row_sum, alpha, sum);
}
// The cap / scale transform and the mask of logits s: kSRegs / 4 column tiles of 8 keys from
// key j0 (a whole block, or a warp's slice of one).
template <int kSRegs>
__device__ __forceinline__ void PrepareLogits(float (&s)[kSRegs], int j0, int lane, const SoftmaxScales& sc,
                                              const bool (&row_valid)[2], const int (&row_lo)[2],
                                              const int (&row_hi)[2]) {
  constexpr int kKeys = kSRegs * 2;
  if (sc.cap > 0.0f) {
#pragma unroll
    for (int e = 0; e < kSRegs; ++e) s[e] = sc.cap_log2 * tanhf(s[e] * sc.cap_scale);
  } else if (sc.scale_log2 <= 0.0f) {
#pragma unroll
    for (int e = 0; e < kSRegs; ++e) s[e] *= sc.scale_log2;
  }
  // Mask only blocks that some row of this warp does not see whole, and test a row's first
  // visible key only where some row's lies inside the block: a causal tile's last blocks
  // (every block of a short prompt's tiles) need only the last, one compare and one select
  // a logit. Rows outside the tile (row_lo = row_hi = 0) are masked whole either way. The
  // bounds are taken relative to this thread's first key, so each test is against a
  // compile-time column (H200, 64 x 256 causal: docs/perf_log.md 2026-12-04).
  bool lo_inside = false, hi_inside = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    lo_inside |= row_valid[i] && row_lo[i] > j0;
    hi_inside |= row_valid[i] && row_hi[i] < j0 + kKeys;
  }
  const bool test_lo = __any_sync(0xffffffffu, lo_inside);
  if (test_lo || __any_sync(0xffffffffu, hi_inside)) {
    const int j_lane = j0 + (lane & 3) * 2;  // key of this thread's column 0
    const int lo[2] = {row_lo[0] - j_lane, row_lo[1] - j_lane};
    const int hi[2] = {row_hi[0] - j_lane, row_hi[1] - j_lane};
    auto mask = [&](auto lower_tag) {
#pragma unroll
      for (int c = 0; c < kSRegs / 4; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = c * 8 + (e & 1);  // key j_lane + k
          const int i = e >> 1;
          if ((decltype(lower_tag)::value && k < lo[i]) || k >= hi[i]) s[4 * c + e] = SPLITKV_NEG_INF;
        }
      }
    };
    if (test_lo) {
      mask(std::true_type{});
    } else {
      mask(std::false_type{});
    }
  }
}

// Block logits s (keys j0 .. j0 + kBlockN) -> probabilities in place (fp32); updates the row
// max (log2 units) and this thread's share of the row sum, and sets alpha, the factor the
// output so far must be scaled by. Keys outside a row's [row_lo, row_hi) are masked by
// select, so a NaN logit never survives. One path for every scale (a second copy of the loop
// body spilled in the prefill). The max is a tree and the sum four chains, shortening what
// sits between a block's S and its P V (ncu on the H200, 1 x 16k causal: 689 instructions a
// warp per block against FlashAttention-3's 496). kLazy: the running max is raised lazily
// (UpdateRowMaxLazy), so alpha is 1 on most blocks and the caller may skip the rescale.
template <int kSRegs, int kBlockN, bool kLazy = false>
__device__ __forceinline__ void BlockSoftmax(float (&s)[kSRegs], int j0, int lane, const SoftmaxScales& sc,
                                             const bool (&row_valid)[2], const int (&row_lo)[2],
                                             const int (&row_hi)[2], float (&row_max)[2], float (&row_sum)[2],
                                             float (&alpha)[2]) {
  static_assert(kSRegs * 2 == kBlockN, "a thread's logits cover the block");
  PrepareLogits(s, j0, lane, sc, row_valid, row_lo, row_hi);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // This thread's kSRegs / 2 logits of row i, s[4 c + 2 i + e], reduced pairwise.
    constexpr int kPairs = kSRegs / 4;
    static_assert(kPairs == 8 || kPairs == 16, "the max tree below");
    float t[kPairs];
#pragma unroll
    for (int c = 0; c < kPairs; ++c) t[c] = fmaxf(s[4 * c + 2 * i], s[4 * c + 2 * i + 1]);
    if constexpr (kPairs == 16) {
#pragma unroll
      for (int c = 0; c < 8; ++c) t[c] = fmaxf(t[c], t[c + 8]);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) t[c] = fmaxf(t[c], t[c + 4]);
    float m = fmaxf(fmaxf(t[0], t[2]), fmaxf(t[1], t[3]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float m_ref =
        kLazy ? UpdateRowMaxLazy(m, sc, row_max[i], alpha[i]) : UpdateRowMax(m, sc, row_max[i], alpha[i]);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < kPairs; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pr = ExpLogit(s[4 * c + 2 * i + e], sc, m_ref);
        s[4 * c + 2 * i + e] = pr;
        sum[(2 * c + e) % 4] += pr;
      }
    }
    row_sum[i] = FoldBlockSum(row_sum[i], alpha[i], sum);
  }
}

// Probabilities as the P V A operand (the mma.sync m16n8k16 A fragment, which wgmma's
// register A takes too): two adjacent 8-key accumulator tiles are one 16-key fragment.
template <typename T, int kSRegs>
__device__ __forceinline__ void PackProbabilities(const float (&s)[kSRegs], uint32_t (&a)[kSRegs / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kSRegs / 8; ++kk) {
    a[kk][0] = PackPair<T>(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = PackPair<T>(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = PackPair<T>(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = PackPair<T>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_BLOCK_SOFTMAX_CUH_
