// The workspace layout: the one place that computes byte offsets in a splitkv workspace.
//
// A workspace is a caller-owned byte buffer, zeroed once when it is made, reused by every
// launch (paged and ragged alike). Its layout, for a call with `num_splits` splits:
//
//   [0, kCounterRegionBytes)            counter region: uint32 split counters (semaphores),
//                                       one per work tile; zero at rest.
//   [softmax_offset, +softmax_bytes)    softmax stats: float2 {max, sum_exp} per
//                                       (split_idx, q token, qo head); `max` is the largest
//                                       scaled logit (natural-log units), `sum_exp` is
//                                       sum_j exp(logit_j - max) over the split's keys.
//   [scratch_offset, +scratch_bytes)    scratch: float32 partial output, normalised by its
//                                       split's sum_exp, per (split_idx, q token, qo head, d).
//
// Invariants (../shared/DESIGN.md): the counter region is always bytes [0, kCounterRegionBytes)
// whatever the call (nothing whose size depends on the call is placed before it); each
// launch leaves every counter 0; the softmax and scratch regions may hold anything at launch
// start. With num_splits == 1 a call needs neither softmax stats nor scratch (the output is
// written directly) and no counters.
//
// Header-only, no dependencies beyond <cstdint>: it is included by the C++ core, the CUDA
// kernels and the Python bindings alike. All sizes are int64 bytes.
#ifndef SPLITKV_WORKSPACE_LAYOUT_H_
#define SPLITKV_WORKSPACE_LAYOUT_H_

#include <cstdint>

namespace splitkv {

// Bytes [0, kCounterRegionBytes) of every workspace hold the split counters.
inline constexpr int64_t kCounterRegionBytes = int64_t{8} << 20;  // 8 MiB
// One counter is a uint32.
inline constexpr int64_t kCounterBytes = 4;
// Counters available to one launch.
inline constexpr int64_t kMaxCounters = kCounterRegionBytes / kCounterBytes;
// The workspace base must be this aligned (bytes); every region starts on this alignment.
inline constexpr int64_t kWorkspaceAlignment = 256;
// Bytes of softmax stats per (split, q token, qo head): float2 {max, sum_exp}.
inline constexpr int64_t kSoftmaxStatBytes = 8;
// Bytes of scratch per element of a partial output (float32).
inline constexpr int64_t kScratchElementBytes = 4;

constexpr int64_t AlignUp(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// The problem dimensions the layout depends on. Shared by paged and ragged calls.
struct LayoutShape {
  int64_t total_q = 0;       // query tokens in the call (sum of q_len over requests)
  int64_t num_qo_heads = 0;  // query/output heads
  int64_t head_dim = 0;      // elements per head
};

// Byte ranges of the three regions for one call. Offsets are from the workspace base.
struct WorkspaceLayout {
  int64_t counter_offset = 0;
  int64_t counter_bytes = 0;
  int64_t softmax_offset = 0;
  int64_t softmax_bytes = 0;
  int64_t scratch_offset = 0;
  int64_t scratch_bytes = 0;
  int64_t required_bytes = 0;  // bytes the call needs: the end of the last region
};

// The layout of a call with `num_splits` splits (num_splits >= 1).
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

// Bytes a call with `num_splits` splits needs (a whole workspace: counters included).
constexpr int64_t RequiredWorkspaceBytes(const LayoutShape& shape, int64_t num_splits) {
  return ComputeWorkspaceLayout(shape, num_splits).required_bytes;
}

// Element index of a partial (split_idx, q token, qo head) in the softmax-stat region (in
// float2 units) and, times head_dim, in the scratch region (in float units).
constexpr int64_t PartialIndex(const LayoutShape& shape, int64_t split_idx, int64_t q_token,
                               int64_t qo_head) {
  return (split_idx * shape.total_q + q_token) * shape.num_qo_heads + qo_head;
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

}  // namespace splitkv

#endif  // SPLITKV_WORKSPACE_LAYOUT_H_
