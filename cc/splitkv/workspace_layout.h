// The workspace layout: the one place that computes byte offsets in a splitkv workspace.
//
// A workspace is a caller-owned byte buffer, zeroed once when it is made, reused by every
// launch (paged and ragged alike). Its layout, for a call with `num_splits` splits:
//
//   [0, kCounterRegionBytes)            counter region: uint32 split counters (semaphores),
//                                       one per work tile, then the status record (its
//                                       last kStatusBytes); zero at rest.
//   [softmax_offset, +softmax_bytes)    softmax stats: float2 {max, sum_exp} per
//                                       (split_idx, q token, qo head); `max` is the largest
//                                       scaled logit (natural-log units), `sum_exp` is
//                                       sum_j exp(logit_j - max) over the split's keys.
//   [scratch_offset, +scratch_bytes)    scratch: float32 partial output, normalised by its
//                                       split's sum_exp, per (split_idx, q token, qo head, d).
//
// In both, the split index runs fastest (then head_dim in scratch; PartialIndex), so one
// row's partials, and a GQA group's rows of one token, are one contiguous run that the
// merging CTA fetches with one copy.
//
// A one-split call over an fp8 cache may instead hold a 16-bit copy of its K/V past the
// counter region (StagedKvLayout, below).
//
// Invariants (README.md, "The workspace contract"): the counter region is always bytes [0, kCounterRegionBytes)
// whatever the call (nothing whose size depends on the call is placed before it); each
// launch leaves every counter 0; the softmax and scratch regions may hold anything at launch
// start. With num_splits == 1 a call needs neither softmax stats nor scratch (the output is
// written directly) and no counters.
//
// Ownership and sizing (for a C++ caller): the caller allocates the workspace, zeroes it
// once, keeps it alive while any launch using it may run, and frees it; splitkv never
// allocates, frees or re-zeroes it. It lives where the call runs: host memory for
// Backend::kCpu, device memory of the current device for Backend::kCuda (cudaMalloc gives
// the alignment; zero it once with cudaMemset). A buffer of RequiredWorkspaceBytes(shape,
// s) bytes lets every call with at most shape.total_q query tokens, shape.num_qo_heads
// heads and shape.head_dim use up to s splits; the planner never picks more than 64. A
// smaller buffer (down to kCounterRegionBytes) still works: the planner lowers num_splits
// to what fits, and only a forced num_splits that does not fit is refused.
//
// Header-only, no dependencies beyond <cstdint>: it is included by the C++ core, the CUDA
// kernels and the Python bindings alike. All sizes are int64 bytes. PartialIndex,
// TileCounterIndex and RequiredCounters are the backends' addressing; callers need only
// the constants, LayoutShape, ComputeWorkspaceLayout and RequiredWorkspaceBytes.
#ifndef SPLITKV_WORKSPACE_LAYOUT_H_
#define SPLITKV_WORKSPACE_LAYOUT_H_

#include <cstdint>

namespace splitkv {

// Bytes [0, kCounterRegionBytes) of every workspace hold the split counters.
inline constexpr int64_t kCounterRegionBytes = int64_t{8} << 20;  // 8 MiB
// One counter is a uint32.
inline constexpr int64_t kCounterBytes = 4;
// The last kStatusBytes of the counter region are the workspace's status record, uint32
// words {code, counter index, value, 0}, zero at rest like the counters. A CUDA launch that
// meets a counter in a state the split protocol cannot leave (bytes someone else wrote, a
// launch that died part-way) records the first such counter there (code kStatusDirtyCounter,
// the counter's index, the value a split found on arriving) instead of trusting it; the next
// call on the workspace reports it and zeroes the region (launchers.h).
inline constexpr int64_t kStatusBytes = 256;
inline constexpr int64_t kStatusOffset = kCounterRegionBytes - kStatusBytes;
inline constexpr int64_t kStatusWords = 4;
inline constexpr uint32_t kStatusDirtyCounter = 1;
// The status record's last word is a CPU launch's claim on the workspace: set (atomically,
// from 0) to kStatusInUseClaim for the launch's duration, so a second launch on the same
// workspace at the same time is refused instead of sharing its counters and scratch (CUDA
// launches never touch it). Any other nonzero value is bytes someone else wrote: a launch
// treats it as a dirty region (zeroed and refused), never as a claim that would lock the
// workspace until reset.
inline constexpr int64_t kStatusInUseWord = kStatusBytes / 4 - 1;
inline constexpr uint32_t kStatusInUseClaim = 0x53504B56;  // arbitrary: unlikely in stray bytes
// Counters available to one launch (2097088, the words before the status record): a call with
// num_splits > 1 needs one per work tile (request x kv head x query tile), else it is refused
// or planned with fewer splits.
inline constexpr int64_t kMaxCounters = kStatusOffset / kCounterBytes;
// The workspace base must be this aligned (bytes); every region starts on this alignment.
inline constexpr int64_t kWorkspaceAlignment = 256;
// Bytes of softmax stats per (split, q token, qo head): float2 {max, sum_exp}.
inline constexpr int64_t kSoftmaxStatBytes = 8;
// Bytes of scratch per element of a partial output (float32).
inline constexpr int64_t kScratchElementBytes = 4;

constexpr int64_t AlignUp(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// The problem dimensions the layout depends on (all >= 0). Shared by paged and ragged
// calls: the same numbers as the params' total_q, num_qo_heads and head_dim.
struct LayoutShape {
  int64_t total_q = 0;       // query tokens in the call (sum of q_len over requests)
  int64_t num_qo_heads = 0;  // query/output heads
  int64_t head_dim = 0;      // elements per head
};

// Byte ranges of the three regions for one call. Offsets are from the workspace base;
// counter_offset is always 0 and counter_bytes kCounterRegionBytes; with num_splits == 1
// softmax_bytes and scratch_bytes are 0 and required_bytes is kCounterRegionBytes.
struct WorkspaceLayout {
  int64_t counter_offset = 0;
  int64_t counter_bytes = 0;
  int64_t softmax_offset = 0;
  int64_t softmax_bytes = 0;
  int64_t scratch_offset = 0;
  int64_t scratch_bytes = 0;
  int64_t required_bytes = 0;  // bytes the call needs: the end of the last region
};

// The layout of a call with `num_splits` splits (num_splits >= 1; shape fields >= 0). Pure
// arithmetic, no checks: the sizes must fit int64 (the Python wrapper refuses inputs whose
// softmax and scratch bytes together reach 2^62; the planner counts them in 128 bits,
// split_plan.cc TooLargeToCount). Usable in constant expressions.
constexpr WorkspaceLayout ComputeWorkspaceLayout(const LayoutShape& shape, int64_t num_splits) {
  WorkspaceLayout layout;
  layout.counter_offset = 0;
  layout.counter_bytes = kCounterRegionBytes;
  const int64_t partials = num_splits > 1 ? num_splits * shape.total_q * shape.num_qo_heads : 0;
  layout.softmax_offset = AlignUp(kCounterRegionBytes, kWorkspaceAlignment);
  layout.softmax_bytes = partials * kSoftmaxStatBytes;
  layout.scratch_offset = AlignUp(layout.softmax_offset + layout.softmax_bytes, kWorkspaceAlignment);
  layout.scratch_bytes = partials * shape.head_dim * kScratchElementBytes;
  layout.required_bytes = AlignUp(layout.scratch_offset + layout.scratch_bytes, kWorkspaceAlignment);
  return layout;
}

// Bytes a call with `num_splits` splits needs (a whole workspace: counters included), a
// multiple of kWorkspaceAlignment: ComputeWorkspaceLayout(shape, num_splits).required_bytes.
// Example: total_q 8, 32 qo heads, head_dim 128, 4 splits: 8 MiB + 8 KiB softmax stats +
// 512 KiB scratch = 8921088 bytes.
constexpr int64_t RequiredWorkspaceBytes(const LayoutShape& shape, int64_t num_splits) {
  return ComputeWorkspaceLayout(shape, num_splits).required_bytes;
}

// Element index of a partial (q token, qo head, split_idx) of a call with `num_splits`
// splits in the softmax-stat region (in float2 units) and, times head_dim, in the scratch
// region (in float units).
constexpr int64_t PartialIndex(const LayoutShape& shape, int64_t num_splits, int64_t split_idx, int64_t q_token,
                               int64_t qo_head) {
  return (q_token * shape.num_qo_heads + qo_head) * num_splits + split_idx;
}

// A work tile is (request, kv head, query tile of rows); its counter index in the counter
// region. Tiles of one call are numbered densely with an upper bound on query tiles per
// request, so the index needs no per-request data on the host.
constexpr int64_t TileCounterIndex(int64_t request, int64_t kv_head, int64_t q_tile,
                                   int64_t num_kv_heads, int64_t max_q_tiles) {
  return (request * num_kv_heads + kv_head) * max_q_tiles + q_tile;
}

// Counters a call needs: one per work tile when num_splits > 1, none otherwise.
constexpr int64_t RequiredCounters(int64_t batch_size, int64_t num_kv_heads, int64_t max_q_tiles,
                                   int64_t num_splits) {
  return num_splits > 1 ? batch_size * num_kv_heads * max_q_tiles : 0;
}

// Staged K/V: a call over an fp8 (e4m3) cache that runs with num_splits == 1 writes no
// softmax stats and no partials, so the CUDA backend's Hopper prefill may use the bytes where
// they would start for a 16-bit copy of the K and V rows the call reads (exact: every e4m3
// value is a float16 and a bfloat16 value), then run its 16-bit wgmma kernel over that copy.
// The counter region is untouched. `rows` is how many K rows (and as many V rows) the copy
// holds, each `row_bytes` long (num_kv_heads * head_dim * 2); a paged call also stages
// `table_entries` int32 page ids for the copy. A workspace shorter than required_bytes gets no
// copy: the call runs the fp8 kernel over the cache itself (slower, same contract).
struct StagedKvLayout {
  int64_t k_offset = 0;
  int64_t v_offset = 0;
  int64_t table_offset = 0;
  int64_t required_bytes = 0;  // bytes the call needs: the end of the last region
};

constexpr StagedKvLayout ComputeStagedKvLayout(int64_t rows, int64_t row_bytes, int64_t table_entries) {
  StagedKvLayout layout;
  layout.k_offset = ComputeWorkspaceLayout(LayoutShape{}, 1).scratch_offset;
  layout.v_offset = AlignUp(layout.k_offset + rows * row_bytes, kWorkspaceAlignment);
  layout.table_offset = AlignUp(layout.v_offset + rows * row_bytes, kWorkspaceAlignment);
  layout.required_bytes = AlignUp(layout.table_offset + table_entries * 4, kWorkspaceAlignment);
  return layout;
}

}  // namespace splitkv

#endif  // SPLITKV_WORKSPACE_LAYOUT_H_
