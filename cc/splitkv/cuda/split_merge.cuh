// The split-KV protocol on the device (the CPU's is cpu/attention_tile.h: the same partials
// and merge, batch-invariant mode's fold (SplitFold) aside; its counter simply counts
// arrivals). A tile's counter word holds two counts:
// bits 0-15 the splits that finished their main loop ("in"), bits 16-31 those whose partial
// is published (num_splits <= 65535, which the launcher enforces).
//  1. as its main loop ends, thread 0 of every CTA of a tile counts it in (CountSplitIn, a
//     relaxed atomicAdd whose round trip overlaps the epilogue); the CTA that counts in last
//     (it sees num_splits - 1 before it) will merge;
//  2. every CTA writes its partial (normalised fp32 output and {max, sum_exp} in natural-log
//     units) at PartialIndex(token, head, split_idx) in the workspace; the others then
//     publish it (a CTA barrier, then a release add of 1 << 16 by thread 0, no wait);
//  3. the merging CTA waits (acquire loads) until the other num_splits - 1 have published,
//     stores 0 back (nothing else touches the word in this launch: zero at rest) and merges
//     the partials in fixed split order, so outputs are bitwise repeatable.
// The merging CTA never waits on a CTA that has not finished its main loop, so the wait ends.
// A dirty counter (nonzero at launch start: foreign bytes, a launch that died part-way) is
// never trusted (DESIGN.md invariant 8): every nonzero start hands at least one CTA of the tile
// a ticket that a zero start cannot (TicketImpossible); that CTA records it in the
// workspace's status record (ReportDirtyCounter) and does not merge, and a merging CTA stops
// waiting once any record exists, so the launch always ends. Its outputs are then invalid:
// the next call reports the record and zeroes the region (launchers.h).
// Counting in before the epilogue takes the count's round trip, and the release's wait for
// the CTA's partial stores, off the last CTA's path (one acquire-release add after the
// partials cost it both).
// Offsets come only from workspace_layout.h (through the plan the launcher made).
#ifndef SPLITKV_CUDA_SPLIT_MERGE_CUH_
#define SPLITKV_CUDA_SPLIT_MERGE_CUH_

#include <cstdint>

#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/cuda/ptx.cuh"
#include "cc/splitkv/cuda/tile_config.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
#define SPLITKV_NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}

// A butterfly: every lane ends with the same, run-to-run identical sum.
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// kElems consecutive floats times `scale`, as T, at dst (vectorised when `vec`).
template <typename T, int kElems>
__device__ __forceinline__ void StoreRow(T* dst, const float (&o)[kElems], float scale, bool vec) {
  if (vec) {
    uint32_t packed[kElems / 2];
#pragma unroll
    for (int e = 0; e < kElems / 2; ++e) packed[e] = PackPair<T>(o[2 * e] * scale, o[2 * e + 1] * scale);
    if constexpr (kElems == 2) {
      *reinterpret_cast<uint32_t*>(dst) = packed[0];
    } else if constexpr (kElems == 4) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
    } else {
#pragma unroll
      for (int e = 0; e < kElems / 8; ++e) {
        *reinterpret_cast<uint4*>(dst + 8 * e) =
            make_uint4(packed[4 * e], packed[4 * e + 1], packed[4 * e + 2], packed[4 * e + 3]);
      }
    }
  } else {
#pragma unroll
    for (int e = 0; e < kElems; ++e) dst[e] = FromFloat<T>(o[e] * scale);
  }
}

// kElems floats (a multiple of 2; 8-byte aligned), plain or bypassing L1 (`kCoherent`: data
// another CTA wrote during this launch).
template <int kElems, bool kCoherent>
__device__ __forceinline__ void LoadFloats(float (&v)[kElems], const float* src) {
  if constexpr (kElems % 4 == 0) {
#pragma unroll
    for (int e = 0; e < kElems; e += 4) {
      const float4 x = kCoherent ? __ldcg(reinterpret_cast<const float4*>(src + e))
                                 : *reinterpret_cast<const float4*>(src + e);
      v[e] = x.x, v[e + 1] = x.y, v[e + 2] = x.z, v[e + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < kElems; e += 2) {
      const float2 x = kCoherent ? __ldcg(reinterpret_cast<const float2*>(src + e))
                                 : *reinterpret_cast<const float2*>(src + e);
      v[e] = x.x, v[e + 1] = x.y;
    }
  }
}

template <int kElems>
__device__ __forceinline__ void StoreFloats(float* dst, const float (&v)[kElems], float scale) {
  if constexpr (kElems % 4 == 0) {
#pragma unroll
    for (int e = 0; e < kElems; e += 4) {
      *reinterpret_cast<float4*>(dst + e) =
          make_float4(v[e] * scale, v[e + 1] * scale, v[e + 2] * scale, v[e + 3] * scale);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kElems; e += 2) *reinterpret_cast<float2*>(dst + e) = make_float2(v[e] * scale, v[e + 1] * scale);
  }
}

// The attention sink's part in a finished row (DESIGN.md Semantics): the row has max logit
// `m` and sum of exp(logit - m) `l` (seen: RowSeen, below). Returns `keep`, the factor applied
// to the row's l-normalised output (1 when p.sinks is null), and sets `lse` (left as given when
// p.sinks is null; the sink when the row saw no key). The sink adds exp(sink) to the
// denominator once; both terms are taken relative to max(m, sink), so a sink far above or
// below the logits neither overflows nor gives NaN. Called only where a row's final result
// is written (unsplit, the merge, the wgmma prefill), never for a partial; `keep` multiplies
// the normalised row, so a one-split row and a merged one get the same bits.
__device__ __forceinline__ float SinkKeep(const AttentionKernelParams& p, int32_t head, float m, float l, bool seen,
                                          float& lse) {
  if (p.sinks == nullptr) return 1.0f;
  const float sink = p.sinks[head];
  if (!seen) {
    lse = sink;  // no key: out 0, lse = the sink
    return 0.0f;
  }
  const float top = fmaxf(m, sink);
  const float keys = l * exp2f((m - top) * kLog2e);
  const float total = keys + exp2f((sink - top) * kLog2e);
  lse = top + logf(total);
  return __fdiv_rn(keys, total);  // 1 exactly for a sink of -inf (keys == total)
}

// Where row `row` of a tile (rows pack token-major, then the group's heads) writes.
struct RowTarget {
  int32_t token;  // index into q / out / lse
  int32_t head;   // qo head
};

__device__ __forceinline__ RowTarget TileRowTarget(const AttentionKernelParams& p, int32_t token_begin,
                                                   int32_t kv_head, int32_t row) {
  const int32_t t = row / p.group_size;
  return {token_begin + t, kv_head * p.group_size + (row - t * p.group_size)};
}

// Whether a row (or a split of it, or a merged row) with sum of exp `l` saw a key: l != 0.
// A NaN sum, from a NaN or infinite q or k (a NaN logit, or +inf's exp(inf - inf)), counts
// as seen, so the NaN reaches the row's output and LSE as in the float64 reference rather
// than the row being written as one that saw no key (out 0, LSE -inf); a finite row's test
// is the same as `l > 0` (l >= 0), so its bits do not change.
__device__ __forceinline__ bool RowSeen(float l) { return l != 0.0f; }

// One finished row: the output (one split) or this split's partial. `o` is the lane's
// kHeadDim / 32 elements, unnormalised, with row max `m` and sum of exp `l` (l == 0: no key).
template <typename T, int kHeadDim>
__device__ __forceinline__ void WriteRowResult(const AttentionKernelParams& p, RowTarget at, int32_t split_idx,
                                               float (&o)[kHeadDim / 32], float m, float l) {
  constexpr int kElems = kHeadDim / 32;
  const int lane = threadIdx.x % 32;
  const bool seen = RowSeen(l);
  const float inv = seen ? 1.0f / l : 0.0f;
  if (!seen) {
    // Written as zeros, not 0 * o: o may hold 0 * NaN from keys only other rows see.
#pragma unroll
    for (int e = 0; e < kElems; ++e) o[e] = 0.0f;
  }
  if (p.num_splits == 1) {
    float scale = inv, lse = seen ? m + logf(l) : SPLITKV_NEG_INF;
    if (p.sinks != nullptr) {
      // (o / l) x keep, in the merge's order, so one split and a merged row get the same bits.
      scale = SinkKeep(p, at.head, m, l, seen, lse);
#pragma unroll
      for (int e = 0; e < kElems; ++e) o[e] *= inv;
    }
    T* dst = static_cast<T*>(p.out) + at.token * p.out_stride_token + at.head * p.out_stride_head + lane * kElems;
    StoreRow<T, kElems>(dst, o, scale, p.out_vec);
    if (lane == 0 && p.lse != nullptr) {
      p.lse[static_cast<int64_t>(at.token) * p.layout_shape.num_qo_heads + at.head] = lse;
    }
  } else {
    const int64_t index = PartialIndex(p.layout_shape, p.num_splits, split_idx, at.token, at.head);
    StoreFloats<kElems>(p.partials + index * kHeadDim + lane * kElems, o, inv);
    if (lane == 0) {
      *reinterpret_cast<float2*>(p.stats + 2 * index) = make_float2(seen ? m : SPLITKV_NEG_INF, l);
    }
  }
}

__device__ __forceinline__ uint32_t* TileCounter(const AttentionKernelParams& p, int32_t request, int32_t kv_head,
                                                 int32_t q_tile) {
  return p.counters + TileCounterIndex(request, kv_head, q_tile, p.num_kv_heads, p.max_q_tiles);
}

inline constexpr uint32_t kPublishedOne = 1u << 16;

// Whether a zero counter could have handed out `ticket` (the word before this CTA's add):
// from zero, arrivals (bits 0-15) run 0 .. num_splits - 1 and never trail the published count
// (bits 16-31). A nonzero start a + (p << 16) always shows: a >= 1 gives the last arrival
// a + num_splits - 1 >= num_splits (a wrap past 65535 passes 65535 >= num_splits on the
// way); a == 0 and p >= 1 gives the first arrival p published over 0 arrivals.
__device__ __forceinline__ bool TicketImpossible(uint32_t ticket, int32_t num_splits) {
  const uint32_t arrived = ticket & (kPublishedOne - 1u);
  return arrived >= static_cast<uint32_t>(num_splits) || ticket / kPublishedOne > arrived;
}

// Records the first impossible ticket of the launch (later ones keep the first): the status
// record's {code, counter index, ticket}, then the same in the host mirror, code last and
// fenced, so a host that sees the code sees the rest.
inline __device__ void ReportDirtyCounter(const AttentionKernelParams& p, const uint32_t* counter,
                                         uint32_t ticket) {
  if (atomicCAS(p.status, 0u, kStatusDirtyCounter) != 0u) return;
  const auto index = static_cast<uint32_t>(counter - p.counters);
  p.status[1] = index;
  p.status[2] = ticket;
  if (p.status_host != nullptr) {
    volatile uint32_t* host = p.status_host;
    host[1] = index;
    host[2] = ticket;
    __threadfence_system();
    host[0] = kStatusDirtyCounter;
  }
}

// Step 1, called by every thread once the CTA's main loop is done: thread 0 counts the CTA
// in and gets the word before its add (the ticket; 0 for the other threads).
__device__ __forceinline__ uint32_t CountSplitIn(const AttentionKernelParams& p, int32_t request, int32_t kv_head,
                                                 int32_t q_tile) {
  return threadIdx.x == 0 ? AtomicAddRelaxedGpu(TileCounter(p, request, kv_head, q_tile), 1u) : 0u;
}

// A merged row as the final output (WriteRowResult's one-split semantics): `merged` is the
// lane's kElems elements, sum_s (w_s / total) * partial_s with w_s = sum_exp_s *
// exp(max_s - global_max), and `total` the weights' sum (0: no split saw a key). Weighing
// by w_s / total rather than scaling the sum by 1 / total makes one non-empty split give back
// its partial exactly (w / w == 1), the bits a one-split launch writes for that row.
template <typename T, int kElems>
__device__ __forceinline__ void StoreMergedRow(const AttentionKernelParams& p, RowTarget at,
                                               const float (&merged)[kElems], float global_max, float total) {
  const int lane = threadIdx.x % 32;
  const bool seen = RowSeen(total);
  float lse = seen ? global_max + logf(total) : SPLITKV_NEG_INF;
  const float keep = SinkKeep(p, at.head, global_max, total, seen, lse);  // the sink enters once, here
  T* dst = static_cast<T*>(p.out) + at.token * p.out_stride_token + at.head * p.out_stride_head + lane * kElems;
  if (seen) {
    StoreRow<T, kElems>(dst, merged, keep, p.out_vec);
  } else {
    const float zeros[kElems] = {};  // +0, as a one-split launch writes a row with no key
    StoreRow<T, kElems>(dst, zeros, 1.0f, p.out_vec);
  }
  if (lane == 0 && p.lse != nullptr) {
    p.lse[static_cast<int64_t>(at.token) * p.layout_shape.num_qo_heads + at.head] = lse;
  }
}

// A split's share of the merged row: w / total, 0 when no split saw a key (total == 0; a
// NaN total, RowSeen, gives every split a NaN share).
__device__ __forceinline__ float MergeShare(float weight, float total) {
  return RowSeen(total) ? __fdiv_rn(weight, total) : 0.0f;
}

// A split's weight from its stats {max, sum_exp} (natural log), against the splits' max (of
// the seen splits); both merge paths below use it and MergeAdd, so they give the same bits.
// An empty split weighs 0. A seen split with a finite sum has a finite max <= global_max; a
// NaN sum (RowSeen) gives NaN whatever the maxima (-inf - -inf included).
__device__ __forceinline__ float SplitWeight(float2 st, float global_max) {
  return RowSeen(st.y) ? st.y * exp2f((st.x - global_max) * kLog2e) : 0.0f;
}

// One split's part of a merged element: merged + share x part, one rounding.
__device__ __forceinline__ float MergeAdd(float merged, float share, float part) { return fmaf(share, part, merged); }

// Batch-invariant merge: a left fold over a row's non-empty splits in split order, so a
// kernel that reduces a tile's splits one after another (the wgmma prefill) merges as it
// goes, with the same float operations as a merging CTA folding the workspace's partials.
// The state is the merged max and sum_exp (natural log) and the merged row: after one
// split its normalised partial itself (so a row that one split saw gets the one-split bits);
// after more, the partials weighed by sum_exp x exp(max - merged max), divided by the sum at
// the end (FoldScale). No division sits on the fold's dependency chain.
struct SplitFold {
  float m = -__builtin_huge_valf();  // -inf (SPLITKV_NEG_INF is device code only)
  float l = 0.0f;
  int n = 0;  // splits folded
};
// A split's factors against the merged max before it, m_prev: the merged max after it (m),
// the old merged row's factor (alpha) and the split's weight (wb). Explicit roundings (no
// contraction the compiler might choose differently where this is inlined): every caller's
// bits must agree.
struct FoldFactors {
  float m, alpha, wb;
};
__device__ __forceinline__ FoldFactors SplitFoldFactors(float m_prev, float2 st) {
  const float m = fmaxf(m_prev, st.x);
  return {m, exp2f(__fmul_rn(__fsub_rn(m_prev, m), kLog2e)),
          __fmul_rn(st.y, exp2f(__fmul_rn(__fsub_rn(st.x, m), kLog2e)))};
}
// Folds a non-empty split whose factors against f.m are `ff` into `f`: each merged element
// becomes FoldElement(element, wa, wb, partial, first); `first` for the first split. Only the
// sum is a chain from split to split: the factors can be computed ahead. A first split
// takes its stats from its factors (against -inf its max is m and its weight, sum x exp2(0),
// is its sum).
__device__ __forceinline__ bool FoldSplitWith(SplitFold& f, const FoldFactors& ff, float& wa, float& wb) {
  if (f.n == 0) {
    f.m = ff.m, f.l = ff.wb, f.n = 1, wa = 0.0f, wb = 1.0f;
    return true;
  }
  wb = ff.wb;
  wa = f.n == 1 ? __fmul_rn(f.l, ff.alpha) : ff.alpha;  // the first partial is normalised: weigh it by its sum
  f.l = __fmaf_rn(f.l, ff.alpha, wb);
  f.m = ff.m;
  ++f.n;
  return false;
}
// The same, one split at a time (the wgmma prefill, as each split ends).
__device__ __forceinline__ bool FoldSplit(SplitFold& f, float2 st, float& wa, float& wb) {
  return FoldSplitWith(f, SplitFoldFactors(f.m, st), wa, wb);
}
// A warp's 32 splits at once (the merging CTAs): lane u holds split u's stats (st.y == 0: no
// split, or an empty one) and gets its factors against the merged max before it, the max of
// f.m and the earlier non-empty splits' maxima (a prefix max: exact, so the same value as
// FoldSplit's running max). Folding the splits in lane order with FoldSplitWith then gives
// FoldSplit's bits while the exponentials run side by side: a 32-split decode row's fold
// was ~3 us as one chain of FoldSplit steps on the H200 (1 x 32768, session 22).
__device__ __forceinline__ FoldFactors WarpFoldFactors(const SplitFold& f, float2 st, int lane) {
  float scan = RowSeen(st.y) ? st.x : SPLITKV_NEG_INF;  // inclusive prefix max over non-empty lanes
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const float below = __shfl_up_sync(0xffffffffu, scan, d);
    if (lane >= d) scan = fmaxf(scan, below);
  }
  const float before = __shfl_up_sync(0xffffffffu, scan, 1);
  return SplitFoldFactors(fmaxf(f.m, lane == 0 ? SPLITKV_NEG_INF : before), st);
}
// Lane u's factors, for every lane.
__device__ __forceinline__ FoldFactors ShuffleFactors(const FoldFactors& ff, int u) {
  return {__shfl_sync(0xffffffffu, ff.m, u), __shfl_sync(0xffffffffu, ff.alpha, u),
          __shfl_sync(0xffffffffu, ff.wb, u)};
}
__device__ __forceinline__ float FoldElement(float merged, float wa, float wb, float part, bool first) {
  return first ? part : __fmaf_rn(part, wb, __fmul_rn(merged, wa));
}
// What the folded row is multiplied by to give the merged row: 1 after one split (it is the
// partial), else 1 / sum_exp.
__device__ __forceinline__ float FoldScale(const SplitFold& f) { return f.n <= 1 ? 1.0f : 1.0f / f.l; }

// Whether MergeFromShared can merge this tile: at most 32 splits, and one row's partials (every
// split of it) fit in `scratch_bytes` of shared memory; for the batch-invariant fold, the whole
// tile's. The register path's fold fetches a batch of rows with their stats in one round trip,
// and chunks of rows, one copy after another, lost to it: H200, 1 x 65536 at group 8 (32
// splits, 2 chunks) +3.3 % (docs/perf_log.md 2026-12-04 session 34).
template <int kHeadDim>
__device__ __forceinline__ bool FitsSharedMerge(const AttentionKernelParams& p, int32_t tile_rows,
                                                int32_t scratch_bytes) {
  const int64_t rows = p.invariant_split_keys > 0 ? tile_rows : 1;
  return p.num_splits <= 32 && int64_t{p.num_splits} * rows * kHeadDim * 4 <= scratch_bytes;
}

// One row of MergeFromShared: its splits' partials at `rows` ([split][kHeadDim] floats, in
// shared memory once `bar` completes phase `phase`), merged into its output and LSE.
template <typename T, int kHeadDim>
__device__ __forceinline__ void MergeSharedRow(const AttentionKernelParams& p, RowTarget at, const float* rows,
                                               uint64_t* bar, uint32_t phase) {
  constexpr int kElems = kHeadDim / 32;
  const int lane = threadIdx.x % 32;
  const int num_splits = p.num_splits;
  const auto* stats = reinterpret_cast<const float2*>(p.stats);
  const float2 st = lane < num_splits
                        ? __ldcg(stats + PartialIndex(p.layout_shape, num_splits, lane, at.token, at.head))
                        : make_float2(SPLITKV_NEG_INF, 0.0f);
  if (p.invariant_split_keys > 0) {  // batch-invariant: the fold (SplitFold), factors side by side
    SplitFold f;
    const FoldFactors lane_ff = WarpFoldFactors(f, st, lane);  // num_splits <= 32 (FitsSharedMerge)
    const uint32_t live = __ballot_sync(0xffffffffu, RowSeen(st.y));  // lanes past num_splits hold sum 0
    float merged[kElems] = {};
    MbarrierWait(bar, phase);
    // As the weighted merge below: four splits' rows are fetched before they are folded.
    for (int s0 = 0; s0 < num_splits; s0 += 4) {
      float part[4][kElems];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        LoadFloats<kElems, false>(part[u], rows + min(s0 + u, num_splits - 1) * kHeadDim + lane * kElems);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const FoldFactors ff = ShuffleFactors(lane_ff, (s0 + u) & 31);
        if (!((live >> (s0 + u)) & 1u)) continue;  // past num_splits (s0 + u <= 31), or empty
        float wa, wb;
        const bool first = FoldSplitWith(f, ff, wa, wb);
#pragma unroll
        for (int e = 0; e < kElems; ++e) merged[e] = FoldElement(merged[e], wa, wb, part[u][e], first);
      }
    }
    const float scale = FoldScale(f);
#pragma unroll
    for (int e = 0; e < kElems; ++e) merged[e] *= scale;
    StoreMergedRow<T, kElems>(p, at, merged, f.m, f.l);
    return;
  }
  const float global_max = WarpMax(RowSeen(st.y) ? st.x : SPLITKV_NEG_INF);
  const float weight = SplitWeight(st, global_max);
  const float total = WarpSum(weight);
  const float share = MergeShare(weight, total);
  MbarrierWait(bar, phase);
  // -0 + x == x for every x (+0 + -0 would be +0): one split's -0 elements stay -0.
  float merged[kElems];
#pragma unroll
  for (int e = 0; e < kElems; ++e) merged[e] = -0.0f;
  // Four splits' weights and rows are fetched before their sums, so the shuffle and
  // shared-load latencies overlap (one at a time: 0.9 us for 31 splits on the H200, 0.65
  // this way). An empty split (weight 0) contributes nothing, as in the register path.
  for (int s0 = 0; s0 < num_splits; s0 += 4) {
    float w[4], part[4][kElems];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      w[u] = __shfl_sync(0xffffffffu, share, (s0 + u) & 31);
      LoadFloats<kElems, false>(part[u], rows + min(s0 + u, num_splits - 1) * kHeadDim + lane * kElems);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (s0 + u >= num_splits || w[u] == 0.0f) continue;
#pragma unroll
      for (int e = 0; e < kElems; ++e) merged[e] = MergeAdd(merged[e], w[u], part[u][e]);
    }
  }
  StoreMergedRow<T, kElems>(p, at, merged, global_max, total);
}

// Step 3's sums from shared memory (sm_90): the copy engine brings the tile's partial rows
// into `scratch`, completing on `bar`, while the warps load the stats and weigh the splits.
// The split index runs fastest in the workspace (PartialIndex), so a query token's group of
// rows, every split of each, is one contiguous run: one bulk copy per token, landing as
// [row][split][kHeadDim] floats. On the H200 the last CTA's register loads of 31 partials
// took 2.6 us (1 x 32k), one copy per split 1.1 us to issue, one per token 0.3. Rows that do
// not all fit (32 splits of a group of 8 at head_dim 128: 128 KiB) come in chunks of as many
// rows as fit, one after another on the barrier's next phase, where they took the register
// path: H200, 1 x 32768 at group 8 41.9 -> 39.4 us, group 16 48.8 -> 44.0, fp8 group 8 28.1
// -> 25.9 (the invariant fold keeps the register path there: FitsSharedMerge). The sums are
// the same, in the same order, so the result is bitwise that of the register path. Needs
// FitsSharedMerge; thread 0 has set up `bar` and fenced the proxies.
template <typename T, int kHeadDim>
__device__ void MergeFromShared(const AttentionKernelParams& p, int32_t kv_head, int32_t token_begin,
                                int32_t tile_rows, float* scratch, int32_t scratch_bytes, uint64_t* bar) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_splits = p.num_splits, group = p.group_size;
  const int row_floats = num_splits * kHeadDim;
  // As many rows as fit (>= 1: FitsSharedMerge), whole rounds of the warps' rows where there
  // are several chunks: a warp folds its rows one after another, so 6 + 2 rows would give two
  // warps 3 where the register path gives each 2.
  const int fit = scratch_bytes / (row_floats * 4);
  constexpr int kWarps = kThreads / 32;
  const int chunk_rows = fit >= tile_rows ? tile_rows : fit >= kWarps ? fit / kWarps * kWarps : fit;
  for (int r0 = 0, phase = 0; r0 < tile_rows; r0 += chunk_rows, phase ^= 1) {
    const int r1 = min(tile_rows, r0 + chunk_rows);
    if (r0 > 0) {
      // Every warp has read the last chunk (warp 0, which has a row in each, waited for its
      // copies) before the copy engine overwrites it.
      FenceProxyAsyncShared();
      __syncthreads();
    }
    if (warp == 0) {
      if (lane == 0) MbarrierArriveExpectTx(bar, static_cast<uint32_t>((r1 - r0) * row_floats) * 4);
      __syncwarp();
      // One copy per token's rows in [r0, r1): consecutive qo heads of a token are adjacent.
      for (int t = r0 / group + lane; t * group < r1; t += 32) {
        const int a = max(r0, t * group), b = min(r1, (t + 1) * group);
        const int64_t index =
            PartialIndex(p.layout_shape, num_splits, 0, token_begin + t, kv_head * group + a - t * group);
        BulkCopyToShared(scratch + (a - r0) * row_floats, p.partials + index * kHeadDim,
                         static_cast<uint32_t>((b - a) * row_floats) * 4, bar);
      }
    }
    for (int row = r0 + warp; row < r1; row += kWarps) {
      MergeSharedRow<T, kHeadDim>(p, TileRowTarget(p, token_begin, kv_head, row), scratch + (row - r0) * row_floats,
                                  bar, phase);
    }
  }
}

// Steps 2 (after the CTA wrote its partials) and 3. Every thread of the CTA calls it, with
// the ticket CountSplitIn gave it. `scratch` (nullptr: none) is shared memory the CTA no
// longer needs, `scratch_bytes` long, 16-byte aligned; kernels that run only on sm_90 pass it
// so a tile that fits merges from shared memory (MergeFromShared).
template <typename T, int kHeadDim>
__device__ void ArriveAndMerge(const AttentionKernelParams& p, int32_t request, int32_t kv_head, int32_t q_tile,
                               int32_t token_begin, int32_t tile_rows, uint32_t ticket, float* scratch = nullptr,
                               int32_t scratch_bytes = 0) {
  __shared__ int last_arrival;
  __shared__ uint64_t merge_full;
  const bool shared_merge = scratch != nullptr && FitsSharedMerge<kHeadDim>(p, tile_rows, scratch_bytes);
  // The copy engine may rewrite bytes this CTA last accessed through the generic proxy.
  if (shared_merge) FenceProxyAsyncShared();
  // The barrier orders every thread's partial stores before thread 0's release (the pattern
  // of CUTLASS's GenericBarrier); on the merging CTA, thread 0's acquire and the barrier
  // below order the other CTAs' partials before this CTA's reads.
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* counter = TileCounter(p, request, kv_head, q_tile);
    const uint32_t others = static_cast<uint32_t>(p.num_splits) - 1u;
    const bool dirty = TicketImpossible(ticket, p.num_splits);
    if (dirty) ReportDirtyCounter(p, counter, ticket);
    bool last = !dirty && (ticket & (kPublishedOne - 1u)) == others;
    if (last) {
      // On a dirty start the count may never reach `others` (or pass it early): some CTA of
      // this tile then holds an impossible ticket and records it, which ends the wait.
      while (LoadAcquireGpu(counter) / kPublishedOne != others) {
        if (LoadRelaxedGpu(p.status) != 0u) {
          last = false;
          break;
        }
      }
    }
    if (last) {
      atomicExch(counter, 0u);
      if (shared_merge) {
        FenceProxyAsyncGlobal();  // the acquired partials are read by the copy engine
        MbarrierInit(&merge_full, 1);
        FenceMbarrierInit();
      }
    } else {
      RedAddReleaseGpu(counter, kPublishedOne);
    }
    last_arrival = last;
  }
  __syncthreads();
  if (!last_arrival) return;
  if (shared_merge) {
    MergeFromShared<T, kHeadDim>(p, kv_head, token_begin, tile_rows, scratch, scratch_bytes, &merge_full);
    return;
  }

  constexpr int kElems = kHeadDim / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_splits = p.num_splits;
  const auto* stats = reinterpret_cast<const float2*>(p.stats);
  // kBatch partials' loads are issued together, before their weights are known (every split
  // writes its partial, zeros when it saw no key), and the first batch together with the
  // stats, so a 16-split tile's merge costs one L2 round trip (loads four at a time after the
  // weights left the last CTA of a 31-split tile merging for 7 us on the H200). The sum still
  // runs in split order, so outputs stay bitwise repeatable. 16 splits at head_dim 128, not
  // 32: 128 floats a lane in flight made every head_dim 128 kernel that includes this merge
  // spill (ptxas: 255 registers and ~300 bytes of spill stores at 2 CTAs an SM, 672 at 3;
  // at 16, none but 4 bytes at 3). H200, same bits, us: 1 x 32768 at group 8 (this path
  // then; MergeFromShared's row chunks serve it now) 42.3 -> 41.3, invariant 1 x 131072 (64
  // splits, still this path) 137.6 -> 133.5, the rest -0.9..+0.1 %.
  // Head_dim 256 keeps 16 (8 frees its registers too, but cost 1 x 131072 1.1 %),
  // docs/perf_log.md 2026-12-04 session 34.
  constexpr int kBatch = kElems <= 2 ? 32 : 16;
  for (int row = warp; row < tile_rows; row += kThreads / 32) {
    const RowTarget at = TileRowTarget(p, token_begin, kv_head, row);
    auto load_batch = [&](float (&part)[kBatch][kElems], int first_split, int count) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (u < count) {
          const int64_t index = PartialIndex(p.layout_shape, num_splits, first_split + u, at.token, at.head);
          LoadFloats<kElems, true>(part[u], p.partials + index * kHeadDim + lane * kElems);
        }
      }
    };
    if (p.invariant_split_keys > 0) {  // batch-invariant: the fold (SplitFold), kBatch at a time
      SplitFold f;
      float merged[kElems] = {};
      float part[kBatch][kElems];
      for (int base = 0; base < num_splits; base += kBatch) {
        const int count = min(kBatch, num_splits - base);
        // Lane u holds split base + u's stats (kBatch <= 32), fetched with the batch's rows.
        const float2 lane_st = lane < count
                                   ? __ldcg(stats + PartialIndex(p.layout_shape, num_splits, base + lane, at.token, at.head))
                                   : make_float2(SPLITKV_NEG_INF, 0.0f);
        load_batch(part, base, count);
        const FoldFactors lane_ff = WarpFoldFactors(f, lane_st, lane);  // against the batches before
        const uint32_t live = __ballot_sync(0xffffffffu, RowSeen(lane_st.y));  // lanes >= count hold sum 0
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const FoldFactors ff = ShuffleFactors(lane_ff, u);
          if (!((live >> u) & 1u)) continue;
          float wa, wb;
          const bool first = FoldSplitWith(f, ff, wa, wb);
#pragma unroll
          for (int e = 0; e < kElems; ++e) merged[e] = FoldElement(merged[e], wa, wb, part[u][e], first);
        }
      }
      const float scale = FoldScale(f);
#pragma unroll
      for (int e = 0; e < kElems; ++e) merged[e] *= scale;
      StoreMergedRow<T, kElems>(p, at, merged, f.m, f.l);
      continue;
    }
    // Lane k holds the stats of splits k, k + 32, ...; the first group's stay in registers.
    const float2 first = lane < num_splits
                             ? __ldcg(stats + PartialIndex(p.layout_shape, num_splits, lane, at.token, at.head))
                             : make_float2(SPLITKV_NEG_INF, 0.0f);
    float part[kBatch][kElems];
    load_batch(part, 0, min(kBatch, num_splits));
    float global_max = RowSeen(first.y) ? first.x : SPLITKV_NEG_INF;
    for (int s = lane + 32; s < num_splits; s += 32) {
      const float2 st = __ldcg(stats + PartialIndex(p.layout_shape, num_splits, s, at.token, at.head));
      if (RowSeen(st.y)) global_max = fmaxf(global_max, st.x);
    }
    global_max = WarpMax(global_max);
    // The weights' total first (lane k sums splits k, k + 32, ...; then a butterfly), so
    // each split's share w / total is known before the sums below.
    auto weight_of = [&](int split) {
      const float2 st = split == lane ? first
                                      : __ldcg(stats + PartialIndex(p.layout_shape, num_splits, split, at.token, at.head));
      return SplitWeight(st, global_max);
    };
    // No test of global_max against -inf here: a row whose seen splits all have a NaN sum
    // and a max of -inf (every logit NaN) must still merge to NaN (SplitWeight); a row that
    // no split saw sums weights of 0 and is written as zeros all the same.
    float total = 0.0f;
    for (int s = lane; s < num_splits; s += 32) total += weight_of(s);
    total = WarpSum(total);
    // -0 + x == x for every x (+0 + -0 would be +0): one split's -0 elements stay -0.
    float merged[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) merged[e] = -0.0f;
    for (int base = 0; RowSeen(total) && base < num_splits; base += 32) {
      const int count = min(32, num_splits - base);
      const float share = lane < count ? MergeShare(weight_of(base + lane), total) : 0.0f;
      for (int k0 = 0; k0 < count; k0 += kBatch) {
        if (base + k0 > 0) load_batch(part, base + k0, count - k0);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const float w = __shfl_sync(0xffffffffu, share, (k0 + u) & 31);
          if (k0 + u >= count || w == 0.0f) continue;  // an empty split contributes nothing
#pragma unroll
          for (int e = 0; e < kElems; ++e) merged[e] = MergeAdd(merged[e], w, part[u][e]);
        }
      }
    }
    StoreMergedRow<T, kElems>(p, at, merged, global_max, total);
  }
}

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_SPLIT_MERGE_CUH_
