// One work tile of the CPU backend in batch-invariant mode (AttentionOptions::batch_invariant).
//
// A row's result is fixed by its own visible keys alone: split s of every row covers the
// absolute keys [s * P, (s + 1) * P) (split_plan.h InvariantSplitKeyRange, P the plan's
// invariant_split_keys), each split runs the online softmax over 64-key blocks at absolute
// positions with arithmetic that does not depend on the tile's other rows (RunTileKeys with
// invariant = true), and MergeInvariantRow combines the row's non-empty splits in split
// order. How that work is spread over tasks changes no bit, so the planner may choose it
// from the batch, the thread count and the workspace:
// - split tasks (plan.num_splits > 1): task s of a tile runs split s, writes the partial to
//   the workspace and counts in; the tile's last task merges. A tile with fewer splits than
//   the launch leaves the others' tasks idle (they do not count in: the tile's counter waits
//   for its own splits only).
// - in-task splits (plan.num_splits == 1, or a tile with more splits than the launch, or
//   with one): the tile's first task runs its splits one after another into a per-thread
//   buffer and merges them itself; no counter, no workspace.
#ifndef SPLITKV_CPU_INVARIANT_TILE_H_
#define SPLITKV_CPU_INVARIANT_TILE_H_

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cc/splitkv/cpu/attention_tile.h"
#include "cc/splitkv/cpu/isa.h"
#include "cc/splitkv/split_plan.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {

// Combines one row's split partials in split order: with w_s = sum_exp_s * exp(max_s - M)
// (M the largest max) and total = sum_s w_s, out = sum_s (w_s / total) * partial_s and lse =
// M + log(total). A split whose sum_exp is 0 (no visible key) is skipped, so a row's result
// is the same whatever number of empty splits the launch gives it; a row with one non-empty
// split gets that partial exactly (w / total == 1). stat(s) and partial(s) read split s.
// A skipped split whose keys were visible but all of logit -inf (an overflowed scaled
// logit) holds NaN where a visible value was not finite (0 x inf): that NaN still reaches
// out, as in the default merge and the float64 reference; every other bit is unchanged.
template <typename Stat, typename Partial>
inline void MergeInvariantRow(int64_t num_splits, int64_t d, const Stat& stat, const Partial& partial, float* out,
                              float& lse) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float global_max = kNegInf;
  bool any = false;
  for (int64_t sp = 0; sp < num_splits; ++sp) {
    const SoftmaxStat st = stat(sp);
    if (st.sum_exp != 0.0f) global_max = any ? NanMax(global_max, st.max) : st.max, any = true;
  }
  // NaN a skipped split passes on (see above); a split with no visible key holds 0 there.
  auto pass_nan_of_skipped = [&] {
    for (int64_t sp = 0; sp < num_splits; ++sp) {
      if (stat(sp).sum_exp != 0.0f) continue;
      const float* p = partial(sp);
      for (int64_t e = 0; e < d; ++e) {
        if (p[e] != p[e]) out[e] = p[e];
      }
    }
  };
  if (!any) {
    for (int64_t e = 0; e < d; ++e) out[e] = 0.0f;
    lse = kNegInf;
    pass_nan_of_skipped();
    return;
  }
  float total = 0.0f;
  for (int64_t sp = 0; sp < num_splits; ++sp) {
    const SoftmaxStat st = stat(sp);
    if (st.sum_exp != 0.0f) total += st.sum_exp * std::exp(st.max - global_max);
  }
  bool first = true;
  for (int64_t sp = 0; sp < num_splits; ++sp) {
    const SoftmaxStat st = stat(sp);
    if (st.sum_exp == 0.0f) continue;
    const float c = st.sum_exp * std::exp(st.max - global_max) / total;
    const float* p = partial(sp);
    if (first) {
      for (int64_t e = 0; e < d; ++e) out[e] = c * p[e];
    } else {
      for (int64_t e = 0; e < d; ++e) out[e] = std::fma(c, p[e], out[e]);
    }
    first = false;
  }
  lse = global_max + std::log(total);
  pass_nan_of_skipped();
}

// Per-thread buffers of the in-task splits.
struct InvariantScratch {
  Vector<SoftmaxStat> stats;  // [row][split]
  Vector<float> partials;     // [row][split][d]
  Vector<float> merged;       // [d]
};

// Task `task_split` of a tile in batch-invariant mode (see the top of this file).
template <typename T, typename Kv>
void RunTileInvariant(const TileInputs<T>& in, const TileRows& tile, const Kv& kv, int64_t task_split) {
  thread_local TileScratch s;
  thread_local InvariantScratch is;
  thread_local Vector<KeyRange> visible;
  const int64_t d = in.head_dim;
  const int64_t group = in.group_size;
  const int64_t rows = tile.num_tokens * group;
  const int64_t split_keys = in.plan->invariant_split_keys;
  const int64_t launch_splits = in.plan->num_splits;
  const KeyRange tile_keys = LoadTileRows(in, tile, s, visible);
  const int64_t tile_splits = InvariantNumSplits(tile_keys.end > tile_keys.begin ? tile_keys.end : 0, split_keys);
  const bool in_task = launch_splits == 1 || tile_splits <= 1 || tile_splits > launch_splits;
  if (in_task ? task_split != 0 : task_split >= tile_splits) return;

  // Partial of row r from the state RunTileKeys left: stats and acc / sum_exp.
  auto store_partial = [&](int64_t r, SoftmaxStat* stat, float* partial) {
    const float sum = s.row_sum[r];
    *stat = SoftmaxStat{sum != 0.0f ? s.row_max[r] : -std::numeric_limits<float>::infinity(), sum};
    const float inv = sum != 0.0f ? 1.0f / sum : 0.0f;
    const float* const acc = s.acc.data() + r * d;  // a local pointer: see blocks::Scratch
    for (int64_t e = 0; e < d; ++e) partial[e] = acc[e] * inv;
  };
  // The sink enters here, once per row (NormaliseRow of the merged row: max lse, sum 1, or
  // sum 0 for a row that saw no key (lse -inf), whose lse becomes the sink (a sink of -inf:
  // -inf, not the NaN of exp(-inf - -inf)); without sinks keep is 1 and the lse unchanged,
  // bit for bit).
  auto write_row = [&](int64_t r, const float* o, float lse) {
    const int64_t token = tile.token_begin + r / group;
    const int64_t head = tile.kv_head * group + r % group;
    const bool seen = lse != -std::numeric_limits<float>::infinity();
    const RowNorm norm = NormaliseRow(lse, seen ? 1.0f : 0.0f, in.options.sinks, head);
    T* out = in.out + token * in.out_stride_token + head * in.out_stride_head;
    for (int64_t e = 0; e < d; ++e) out[e] = FromFloat<T>(o[e] * norm.keep);
    if (in.lse != nullptr) in.lse[token * in.num_qo_heads + head] = norm.lse;
  };
  auto split_keys_of = [&](int64_t sp) {
    return InvariantSplitKeyRange(tile_keys.begin, tile_keys.end, sp, split_keys, kKeyBlock);
  };
  is.merged.resize(d);

  if (in_task) {
    const int64_t n = tile_splits > 0 ? tile_splits : 1;
    is.stats.resize(rows * n);
    is.partials.resize(rows * n * d);
    for (int64_t sp = 0; sp < n; ++sp) {
      RunTileKeys(in, tile, kv, s, visible, tile_splits > 0 ? split_keys_of(sp) : KeyRange{0, 0}, true);
      for (int64_t r = 0; r < rows; ++r) store_partial(r, &is.stats[r * n + sp], &is.partials[(r * n + sp) * d]);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float lse;
      MergeInvariantRow(
          n, d, [&](int64_t sp) { return is.stats[r * n + sp]; },
          [&](int64_t sp) { return &is.partials[(r * n + sp) * d]; }, is.merged.data(), lse);
      write_row(r, is.merged.data(), lse);
    }
    return;
  }

  // Split task: partial to the workspace, count in; the tile's last own split merges.
  RunTileKeys(in, tile, kv, s, visible, split_keys_of(task_split), true);
  const LayoutShape shape{in.total_q, in.num_qo_heads, d};
  auto* stats = reinterpret_cast<SoftmaxStat*>(in.workspace + in.plan->layout.softmax_offset);
  auto* partials = reinterpret_cast<float*>(in.workspace + in.plan->layout.scratch_offset);
  auto index_of = [&](int64_t r, int64_t sp) {
    return PartialIndex(shape, launch_splits, sp, tile.token_begin + r / group, tile.kv_head * group + r % group);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t index = index_of(r, task_split);
    store_partial(r, &stats[index], &partials[index * d]);
  }
  std::atomic_ref<uint32_t> counter(reinterpret_cast<uint32_t*>(in.workspace)[tile.counter_index]);
  // acq_rel: this task's partial is published to, and every earlier partial visible to,
  // whichever task arrives last.
  const uint32_t arrived = counter.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (arrived != static_cast<uint32_t>(tile_splits)) return;
  for (int64_t r = 0; r < rows; ++r) {
    float lse;
    MergeInvariantRow(
        tile_splits, d, [&](int64_t sp) { return stats[index_of(r, sp)]; },
        [&](int64_t sp) { return &partials[index_of(r, sp) * d]; }, is.merged.data(), lse);
    write_row(r, is.merged.data(), lse);
  }
  counter.store(0, std::memory_order_release);
}

}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_INVARIANT_TILE_H_
