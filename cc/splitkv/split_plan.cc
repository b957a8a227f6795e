#include "cc/splitkv/split_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "cc/splitkv/errors.h"

namespace splitkv {

namespace {

// How full a grid of `ctas` CTAs keeps its waves of `wave` slots: its waves over the whole
// waves it takes (1: the last wave is full).
double WaveEfficiency(int64_t ctas, int64_t wave) {
  const double waves = static_cast<double>(ctas) / static_cast<double>(wave);
  return waves / static_cast<double>((ctas + wave - 1) / wave);
}

}  // namespace

int64_t NumSplitsHeuristic(int64_t num_tiles, int64_t num_workers, int64_t max_kv_len,
                           int64_t min_keys_per_split, int64_t max_splits, int64_t split_block_keys,
                           int64_t split_merge_blocks, int64_t short_split_keys, int64_t short_split_workers,
                           int64_t resident_workers) {
  if (num_tiles <= 0 || num_workers <= 0) return 1;
  // Enough tiles to keep (almost) every worker busy: splitting only adds merge work.
  // (num_tiles * 10 >= num_workers * 8, without the product: plan-only calls may count more
  // tiles than int64 holds ten of.)
  if (num_tiles >= (num_workers * 8 + 9) / 10) return 1;
  int64_t by_keys = std::max<int64_t>(1, max_kv_len / std::max<int64_t>(1, min_keys_per_split));
  // Short splits only for tiles the floor already cuts into 4 or more: below that (256-511
  // keys at a 128-key floor) the measured choice was 1 split against 2, and one-block grids
  // there were not measured.
  if (short_split_keys > 0 && short_split_workers >= num_tiles && max_kv_len >= 4 * min_keys_per_split) {
    by_keys = std::max(by_keys, std::min(max_kv_len / short_split_keys, short_split_workers / num_tiles));
  }
  int64_t limit = std::max<int64_t>(1, std::min(max_splits, by_keys));
  // One-wave split grids: the wave model below prices a wave by its longest split's blocks,
  // not by each CTA's fixed cost, so past one wave it took many waves of short CTAs. H200,
  // decode, graph (us, before / after): 24 x 8192 d128 26 splits (4992 CTAs) 221.4 / 2
  // splits 188.6; fp8 231.8 / 103.6; 32 x 8192 d64 32 splits 194.7 / 1 split 135.1
  // (docs/perf_log.md 2026-12-02). Tiles more than half the fill workers split within the
  // resident CTAs (24 x 8192 d128: 2 splits, 384 CTAs of 396), in splits of at least 4 x
  // min_keys_per_split keys (20 x 512 d128 at 2 splits of 256 took 5.1 % longer than 1); the
  // rest within the fill.
  int64_t wave = num_workers;  // the workers one wave of the model holds
  if (resident_workers > 0) {
    int64_t cap = num_workers / num_tiles;
    if (cap < 2 && resident_workers > num_workers) {
      wave = resident_workers;
      cap = std::min(resident_workers / num_tiles, max_kv_len / std::max<int64_t>(1, 4 * min_keys_per_split));
    }
    limit = std::max<int64_t>(1, std::min(limit, cap));
  }
  // Efficiency of s splits: the fraction of the last wave's workers that have work.
  auto efficiency = [&](int64_t s) { return WaveEfficiency(num_tiles * s, wave); };
  double best = 0.0;
  for (int64_t s = 1; s <= limit; ++s) best = std::max(best, efficiency(s));
  // The wave model's time of s splits: waves x key blocks in the longest split, plus the
  // merge's price when there is a merge.
  const int64_t block_keys = std::max<int64_t>(1, split_block_keys);
  const int64_t blocks = std::max<int64_t>(1, CeilDiv(max_kv_len, block_keys));
  const int64_t merge = std::max<int64_t>(0, split_merge_blocks);
  auto cost = [&](int64_t s) {
    return (num_tiles * s + wave - 1) / wave * ((blocks + s - 1) / s) + (s > 1 ? merge : 0);
  };
  int64_t chosen = 1;
  bool found = false;
  // With a merge price one split (no merge) always competes on cost: its wave may be emptier
  // than a split grid's and still finish first when the merge costs more than the blocks
  // splitting saves. Without one, 1 competes as any count does (FlashAttention's rule: the
  // planners without a price, the CPU's and other GPUs', plan as they did before the price).
  for (int64_t s = 1; s <= limit; ++s) {
    const bool candidate = (s == 1 && merge > 0) || efficiency(s) >= 0.95 * best;
    if (candidate && (!found || cost(s) < cost(chosen))) chosen = s, found = true;
  }
  return chosen;
}

namespace {

// True when a call with `num_splits` would need more than 2^62 bytes, counted in 128-bit
// arithmetic: shapes a caller can build (stride-0 views, say) can exceed what the int64
// layout arithmetic counts, and that must read "too small", never wrap to a small size.
bool TooLargeToCount(const LayoutShape& shape, int64_t num_splits) {
  if (num_splits <= 1) return false;
  const __int128 partials = static_cast<__int128>(num_splits) * shape.total_q * shape.num_qo_heads;
  const __int128 bytes = kCounterRegionBytes + partials * kSoftmaxStatBytes +
                         partials * shape.head_dim * kScratchElementBytes +
                         3 * kWorkspaceAlignment;  // >= the aligned sum
  return bytes > static_cast<__int128>(int64_t{1} << 62);
}

bool Fits(const LayoutShape& shape, int64_t num_splits, int64_t workspace_bytes) {
  return !TooLargeToCount(shape, num_splits) &&
         RequiredWorkspaceBytes(shape, num_splits) <= workspace_bytes;
}

std::string TooSmallMessage(const SplitPlanRequest& r, int64_t num_splits, int64_t needed) {
  return std::string(r.op) + ": workspace too small: need " + std::to_string(needed) +
         " bytes for num_splits=" + std::to_string(num_splits) + ", got " +
         std::to_string(r.workspace_bytes) +
         "; pass a larger workspace or let the planner choose num_splits";
}

}  // namespace

void ThrowInvariantWorkspaceTooSmall(const char* op, const LayoutShape& shape, int64_t splits, int64_t split_keys,
                                     int64_t workspace_bytes) {
  const std::string needed = TooLargeToCount(shape, splits) ? std::string("more than 2^62")
                                                            : std::to_string(RequiredWorkspaceBytes(shape, splits));
  throw WorkspaceError(std::string(op) + ": workspace too small: need " + needed + " bytes for batch_invariant (" +
                       std::to_string(splits) + " splits of " + std::to_string(split_keys) + " keys), got " +
                       std::to_string(workspace_bytes) + "; pass a larger workspace");
}

void ThrowInvariantCountersTooFew(const char* op, int64_t counters, int64_t splits) {
  throw WorkspaceError(std::string(op) + ": too many work tiles for the counter region with batch_invariant: need " +
                       std::to_string(counters) + " counters for " + std::to_string(splits) +
                       " splits, the region holds " + std::to_string(kMaxCounters) + "; use a smaller batch");
}

void ThrowInvariantTaskSplitsRefused(const char* op, const LayoutShape& shape, int64_t num_tiles, int64_t splits,
                                     int64_t split_keys, int64_t workspace_bytes) {
  if (Fits(shape, splits, workspace_bytes)) ThrowInvariantCountersTooFew(op, num_tiles, splits);
  ThrowInvariantWorkspaceTooSmall(op, shape, splits, split_keys, workspace_bytes);
}

SplitPlan PlanSplits(const SplitPlanRequest& r) {
  if (r.workspace_bytes < kCounterRegionBytes) {
    throw WorkspaceError(std::string(r.op) + ": workspace too small: need at least " +
                         std::to_string(kCounterRegionBytes) +
                         " bytes (the counter region), got " + std::to_string(r.workspace_bytes));
  }
  SplitPlan plan;
  plan.max_q_tiles = std::max<int64_t>(1, r.max_q_tiles);
  plan.num_workers = r.num_workers;
  // Counted in 128 bits: a plan-only caller's sizes can exceed what int64 holds.
  const __int128 tiles = static_cast<__int128>(r.batch_size) * r.num_kv_heads * plan.max_q_tiles;
  if (r.batch_size < 0 || r.num_kv_heads < 0 || tiles > static_cast<__int128>(INT64_MAX)) {
    throw InvalidArgument(std::string(r.op) + ": work tiles out of range: expected batch_size x num_kv_heads x query "
                          "tiles >= 0 and below 2^63, got batch_size " + std::to_string(r.batch_size) +
                          ", num_kv_heads " + std::to_string(r.num_kv_heads) + ", query tiles " +
                          std::to_string(plan.max_q_tiles));
  }
  plan.num_tiles = static_cast<int64_t>(tiles);
  const auto fits_counters = [&](int64_t s) {
    return RequiredCounters(r.batch_size, r.num_kv_heads, plan.max_q_tiles, s) <= kMaxCounters;
  };
  if (r.batch_invariant) {
    if (r.invariant_split_keys <= 0) {
      throw UnsupportedError(std::string(r.op) + ": batch_invariant not supported on this backend");
    }
    plan.invariant_split_keys = r.invariant_split_keys;
    // Every tile's splits fit in this many (a tile sees at most max_kv_len keys); a tile that
    // sees more than max_kv_len promised runs its splits in its own task (CPU).
    const int64_t splits = std::max<int64_t>(1, InvariantNumSplits(r.max_kv_len, r.invariant_split_keys));
    const bool fits = Fits(r.layout_shape, splits, r.workspace_bytes) && fits_counters(splits);
    const int64_t fill = r.fill_workers > 0 ? r.fill_workers : r.num_workers;
    const bool pays = NumSplitsHeuristic(plan.num_tiles, fill, r.max_kv_len, r.min_keys_per_split, r.max_splits,
                                         r.split_block_keys, r.split_merge_blocks, r.short_split_keys,
                                         r.short_split_workers, r.one_wave_splits ? r.num_workers : 0) > 1;
    if (splits > 1 && !r.in_task_splits && !r.in_task_splits_if_short && !fits) {
      if (!fits_counters(splits)) {
        ThrowInvariantCountersTooFew(r.op, RequiredCounters(r.batch_size, r.num_kv_heads, plan.max_q_tiles, splits),
                                     splits);
      }
      ThrowInvariantWorkspaceTooSmall(r.op, r.layout_shape, splits, r.invariant_split_keys, r.workspace_bytes);
    }
    plan.num_splits = splits > 1 && fits && (pays || !r.in_task_splits) ? splits : 1;
    if (plan.num_splits == 1 && splits > 1) plan.invariant_task_splits = splits;
  } else if (r.forced_num_splits >= 1) {
    const int64_t s = r.forced_num_splits;
    if (TooLargeToCount(r.layout_shape, s)) {
      throw WorkspaceError(std::string(r.op) + ": workspace too small: need more than 2^62 bytes for num_splits=" +
                           std::to_string(s) + ", got " + std::to_string(r.workspace_bytes) +
                           "; let the planner choose num_splits");
    }
    const int64_t needed = RequiredWorkspaceBytes(r.layout_shape, s);
    if (needed > r.workspace_bytes) throw WorkspaceError(TooSmallMessage(r, s, needed));
    if (!fits_counters(s)) {
      throw WorkspaceError(
          std::string(r.op) + ": too many work tiles for the counter region: need " +
          std::to_string(RequiredCounters(r.batch_size, r.num_kv_heads, plan.max_q_tiles, s)) +
          " counters for num_splits=" + std::to_string(s) + ", the region holds " +
          std::to_string(kMaxCounters) + "; use num_splits=1 or a smaller batch");
    }
    plan.num_splits = s;
  } else {
    const int64_t fill = r.fill_workers > 0 ? r.fill_workers : r.num_workers;
    int64_t s = NumSplitsHeuristic(plan.num_tiles, fill, r.max_kv_len, r.min_keys_per_split, r.max_splits,
                                   r.split_block_keys, r.split_merge_blocks, r.short_split_keys,
                                   r.short_split_workers, r.one_wave_splits ? r.num_workers : 0);
    // Measured from 2048 keys up: shorter requests keep the heuristic's plan; from 16384 up, 4
    // splits.
    constexpr int64_t kTailSplitMinKeys = 1024;
    constexpr int64_t kTailSplitLongKeys = 16384;
    const int64_t tail = r.tail_split_workers;
    if (s == 1 && tail > 0 && plan.num_tiles > tail && 2 * plan.num_tiles <= 3 * tail && r.max_splits >= 2 &&
        r.max_kv_len >= 2 * std::max(r.min_keys_per_split, kTailSplitMinKeys)) {
      // A one-split grid just past a wave (SplitPlanRequest::tail_split_workers).
      const bool long_tiles = r.max_kv_len >= kTailSplitLongKeys && r.max_kv_len >= 4 * r.min_keys_per_split;
      const bool kept = plan.num_tiles <= r.tail_keep_tiles && r.max_kv_len < kTailSplitLongKeys;
      if (!kept) s = std::min<int64_t>(r.max_splits, long_tiles ? 4 : 2);
    }
    // Past two waves, long tiles only: a last wave at most 60 % full plans 2 splits, at most
    // 30 % full 4 (the same field).
    const int64_t last_wave = tail > 0 ? plan.num_tiles % tail : 0;
    if (s == 1 && tail > 0 && plan.num_tiles > 2 * tail && plan.num_tiles < 4 * tail && last_wave > 0 &&
        10 * last_wave <= 6 * tail && r.max_kv_len >= kTailSplitLongKeys && r.max_kv_len >= 4 * r.min_keys_per_split) {
      s = std::min<int64_t>(r.max_splits, 10 * last_wave <= 3 * tail ? 4 : 2);
    }
    // A one-split grid of a few waves of long tiles: split to about kWaveSplitWaves waves
    // (SplitPlanRequest::wave_split_workers). Measured from 3.88 waves and 8192 keys up.
    constexpr int64_t kWaveSplitWaves = 11;
    constexpr int64_t kWaveSplitMinKeys = 8192;
    const int64_t wave = r.wave_split_workers;  // CTAs a wave
    if (s == 1 && wave > 0 && 2 * plan.num_tiles >= 7 * wave && plan.num_tiles < kWaveSplitWaves * wave &&
        r.max_kv_len >= kWaveSplitMinKeys) {
      const int64_t want = (kWaveSplitWaves * wave + plan.num_tiles - 1) / plan.num_tiles;
      const int64_t most = std::min(r.max_splits, r.max_kv_len / std::max<int64_t>(1, r.min_keys_per_split));
      s = std::max<int64_t>(1, std::min(want, most));
    }
    // Tiles within one wave of resident CTAs (SplitPlanRequest::fill_wave_workers).
    constexpr int64_t kFillWaveMaxSplits = 8;
    constexpr int64_t kFillWaveMinKeys = 4096;
    const int64_t resident = r.fill_wave_workers;
    if (resident > 0 && plan.num_tiles * kFillWaveMaxSplits >= resident && plan.num_tiles >= r.fill_wave_min_tiles &&
        plan.num_tiles <= resident && r.max_kv_len >= kFillWaveMinKeys) {
      s = 1;
      const int64_t most = std::min({kFillWaveMaxSplits, r.max_splits,
                                     r.max_kv_len / std::max<int64_t>(1, r.min_keys_per_split)});
      double best = 0.0;
      for (int64_t c = 1; c <= most; ++c) {
        const double fill_of_c = WaveEfficiency(plan.num_tiles * c, resident);
        if (fill_of_c > best + 1e-9) best = fill_of_c, s = c;
      }
    }
    while (s > 1 && (!Fits(r.layout_shape, s, r.workspace_bytes) || !fits_counters(s))) {
      --s;
    }
    plan.num_splits = s;
  }
  plan.layout = ComputeWorkspaceLayout(r.layout_shape, plan.num_splits);
  return plan;
}

}  // namespace splitkv
