// The split planner: the num_splits heuristic, fitting a plan to the caller's workspace,
// the errors when it cannot, and how SplitKeyRange cuts a tile's keys.
#include "cc/splitkv/split_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cc/splitkv/errors.h"
#include "cc/splitkv/workspace_layout.h"
#include "tests/cc/test_check.h"

namespace {

using splitkv::kCounterRegionBytes;
using splitkv::kMaxCounters;
using splitkv::LayoutShape;
using splitkv::NumSplitsHeuristic;
using splitkv::PlanSplits;
using splitkv::RequiredWorkspaceBytes;
using splitkv::SplitPlan;
using splitkv::SplitPlanRequest;
using splitkv::WorkspaceError;

// Fraction of the last wave's workers that have work with s splits.
double WaveEfficiency(int64_t tiles, int64_t workers, int64_t s) {
  const double waves = static_cast<double>(tiles * s) / static_cast<double>(workers);
  return waves / std::ceil(waves);
}

// Batch 1 decode over 32k keys, 8 kv heads, on 132 workers: the heuristic splits.
SplitPlanRequest LongDecodeRequest() {
  SplitPlanRequest r;
  r.op = "test_op";
  r.layout_shape = LayoutShape{1, 32, 128};
  r.batch_size = 1;
  r.num_kv_heads = 8;
  r.max_q_tiles = 1;
  r.max_kv_len = 32768;
  r.num_workers = 132;
  r.workspace_bytes = int64_t{1} << 32;
  return r;
}

// Work tiles counted past int64 (plan-only callers' sizes) are refused, never wrapped to a
// small or negative count (3 x 2^62 tiles once planned as num_tiles < 0).
TEST(TileCountsPastInt64AreRefused) {
  SplitPlanRequest r = LongDecodeRequest();
  r.batch_size = int64_t{3} << 61;
  r.max_q_tiles = 4;
  r.forced_num_splits = 2;
  EXPECT_THROWS(splitkv::InvalidArgument, PlanSplits(r), "test_op: work tiles out of range", "below 2^63",
                "batch_size 6917529027641081856, num_kv_heads 8, query tiles 4");
  r.batch_size = int64_t{1} << 40;  // 2^45 tiles: counted, then too many for the counters
  EXPECT_THROWS(WorkspaceError, PlanSplits(r), "too many work tiles for the counter region");
}

TEST(HeuristicIsOneWhenTilesFillTheWorkers) {
  for (int64_t workers : {1, 8, 16, 132}) {
    for (int64_t tiles = (workers * 8 + 9) / 10; tiles <= 4 * workers; ++tiles) {
      EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(tiles, workers, 1 << 20, 256, 64));
    }
  }
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(0, 132, 1 << 20, 256, 64));
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(8, 0, 1 << 20, 256, 64));
}

TEST(HeuristicSplitsBatchOneLongKv) {
  const int64_t s = NumSplitsHeuristic(8, 132, 32768, 256, 64);
  EXPECT_GT(s, int64_t{1});
  // Its last wave is nearly full: 8 x s tiles on 132 workers.
  EXPECT_GE(WaveEfficiency(8, 132, s), 0.95);
  // 8 tiles on 264 workers: 32 splits fill 97% of them (29, at 88%, is not enough).
  EXPECT_EQ(int64_t{32}, NumSplitsHeuristic(8, 264, 32768, 256, 64));
  EXPECT_GT(NumSplitsHeuristic(2, 16, 2048, 256, 64), int64_t{1});
  EXPECT_GT(NumSplitsHeuristic(1, 8, 4096, 256, 64), int64_t{1});
}

// Batch 1 decode over `max_kv_len` keys as the H200 plans head_dim 128 decode tiles: 8 tiles,
// 264 workers filled (132 SMs x 2 CTAs), 128-key splits of 64-key blocks, at most 32.
SplitPlanRequest ShortDecodeRequest(int64_t max_kv_len) {
  SplitPlanRequest r = LongDecodeRequest();
  r.num_workers = 264;
  r.max_kv_len = max_kv_len;
  r.min_keys_per_split = 128;
  r.max_splits = 32;
  return r;
}

// Splits as short as short_split_keys while tiles x splits fit short_split_workers (the H200's
// 132 SMs; 264 workers filled at head_dim 128, 396 at 64), min_keys_per_split past that.
TEST(HeuristicTakesShortSplitsWithinOneCtaAnSm) {
  // 1 x 1024 keys (8 tiles): 8 splits of 128 keys; 16 of 64 (128 CTAs) with short splits.
  EXPECT_EQ(int64_t{8}, NumSplitsHeuristic(8, 264, 1024, 128, 32, 64, 2));
  EXPECT_EQ(int64_t{16}, NumSplitsHeuristic(8, 264, 1024, 128, 32, 64, 2, 64, 132));
  EXPECT_EQ(int64_t{8}, NumSplitsHeuristic(8, 396, 512, 128, 32, 64, 2, 64, 132));
  // 1 x 2048: 16 splits of 128 keys already make 128 CTAs; 32 of 64 would pass 132.
  EXPECT_EQ(int64_t{16}, NumSplitsHeuristic(8, 264, 2048, 128, 32, 64, 2, 64, 132));
  // 4 x 1024 at head_dim 64 (32 tiles): 132 / 32 = 4 short splits a tile, fewer than the 8 of
  // 128 keys, which stay.
  EXPECT_EQ(int64_t{8}, NumSplitsHeuristic(32, 396, 1024, 128, 32, 64, 2, 64, 132));
  // Under 4 x 128 keys the 128-key floor rules (256 keys: 1 split, as the merge price chose).
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(8, 264, 256, 128, 32, 64, 2, 64, 132));
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(8, 264, 320, 128, 32, 64, 2, 64, 132));
  EXPECT_EQ(int64_t{8}, NumSplitsHeuristic(8, 264, 512, 128, 32, 64, 2, 64, 132));
  // More tiles than SMs: as without short splits.
  for (int64_t kv : {256, 1024, 4096}) {
    EXPECT_EQ(NumSplitsHeuristic(160, 264, kv, 128, 32, 64, 2),
              NumSplitsHeuristic(160, 264, kv, 128, 32, 64, 2, 64, 132));
  }
  // PlanSplits passes them on.
  SplitPlanRequest r = ShortDecodeRequest(1024);
  r.split_merge_blocks = 2;
  EXPECT_EQ(int64_t{8}, PlanSplits(r).num_splits);
  r.short_split_keys = 64;
  r.short_split_workers = 132;
  EXPECT_EQ(int64_t{16}, PlanSplits(r).num_splits);
}

// The merge's price (split_merge_blocks) is paid once by any count above 1: 8 tiles on 264
// workers at 128-key splits of 64-key blocks. 256 keys (4 blocks): 2 splits cost 2 + 2, a tie
// with 1 split's 4, so it stays whole; at a price of 1 it splits. 512 keys (8 blocks): 4 splits
// cost 2 + 2 against 8, so it splits at either price, as it does without one.
TEST(HeuristicWeighsTheMergeAgainstShortTiles) {
  EXPECT_EQ(int64_t{2}, NumSplitsHeuristic(8, 264, 256, 128, 32, 64, 0));
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(8, 264, 256, 128, 32, 64, 2));
  EXPECT_EQ(int64_t{2}, NumSplitsHeuristic(8, 264, 256, 128, 32, 64, 1));
  for (int64_t merge : {0, 1, 2}) EXPECT_EQ(int64_t{4}, NumSplitsHeuristic(8, 264, 512, 128, 32, 64, merge));
  // Without a price 1 split competes only through the wave filter, as before the price: 152
  // tiles on 216 workers at 600 keys, where 4 splits (3 waves of 3 blocks) tie 1 split's 9
  // blocks, take 4; with a price the whole tile wins.
  EXPECT_EQ(int64_t{4}, NumSplitsHeuristic(152, 216, 600, 128, 32, 64, 0));
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(152, 216, 600, 128, 32, 64, 2));
  // Long KV: the same count as without a price (32 x 16 blocks + 2 against 512 blocks).
  EXPECT_EQ(int64_t{32}, NumSplitsHeuristic(8, 264, 32768, 256, 64, 64, 2));
  // PlanSplits passes the request's price on.
  SplitPlanRequest r = ShortDecodeRequest(256);
  EXPECT_EQ(int64_t{2}, PlanSplits(r).num_splits);
  r.split_merge_blocks = 2;
  EXPECT_EQ(int64_t{1}, PlanSplits(r).num_splits);
}

TEST(HeuristicKeepsDecodeSplitGridsToOneWave) {
  // The H200 decode's workers: 264 filled (2 CTAs an SM at d128) of 396 resident, and 396
  // of 396 at d64; merge price 2 (tile_config.h DecodeSplitMergeBlocks). Without the cap the wave
  // model took many waves of short CTAs: 24 x 8192 d128 (192 tiles) 26 splits, 220.3 us
  // against 2 splits' 192.1 (one wave of 384 resident CTAs).
  EXPECT_EQ(int64_t{26}, NumSplitsHeuristic(192, 264, 8192, 128, 32, 64, 2));
  EXPECT_EQ(int64_t{2}, NumSplitsHeuristic(192, 264, 8192, 128, 32, 64, 2, 0, 0, 396));
  // 12 x 8192 d128 (96 tiles): 8 splits (3 waves), 105.4 us; within the fill, 2: 99.2.
  EXPECT_EQ(int64_t{8}, NumSplitsHeuristic(96, 264, 8192, 128, 32, 64, 2, 64, 132));
  EXPECT_EQ(int64_t{2}, NumSplitsHeuristic(96, 264, 8192, 128, 32, 64, 2, 64, 132, 396));
  // 10 x 16384 d128 (80 tiles): 3 splits, 240 CTAs (160.3 us; 13 splits planned before: 171.1).
  EXPECT_EQ(int64_t{3}, NumSplitsHeuristic(80, 264, 16384, 128, 32, 64, 2, 64, 132, 396));
  // 32 x 8192 d64 (256 tiles on 396): 1 split, 134.2 us (32 splits before: 193.3); 20 x 8192
  // (160 tiles): 2, 88.3 us (32 before: 125.0).
  EXPECT_EQ(int64_t{32}, NumSplitsHeuristic(256, 396, 8192, 128, 32, 64, 2));
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(256, 396, 8192, 128, 32, 64, 2, 64, 132, 396));
  EXPECT_EQ(int64_t{2}, NumSplitsHeuristic(160, 396, 8192, 128, 32, 64, 2, 64, 132, 396));
  // Past the fill, splits of 4 x min_keys_per_split keys or more: 20 x 512 d128 (160 tiles)
  // stays whole (2 splits of 256 keys took 5.1 % longer), 24 x 1024 takes 2 (30.6 us against 4
  // splits' 38.0).
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(160, 264, 512, 128, 32, 64, 2, 64, 132, 396));
  EXPECT_EQ(int64_t{2}, NumSplitsHeuristic(192, 264, 1024, 128, 32, 64, 2, 64, 132, 396));
  // One-wave grids plan as before: batch 1 x 32k (32), 16 x 4096 d128 (2), 1 x 1024 (16).
  EXPECT_EQ(int64_t{32}, NumSplitsHeuristic(8, 264, 32768, 128, 32, 64, 2, 64, 132, 396));
  EXPECT_EQ(int64_t{2}, NumSplitsHeuristic(128, 264, 4096, 128, 32, 64, 2, 64, 132, 396));
  EXPECT_EQ(int64_t{16}, NumSplitsHeuristic(8, 264, 1024, 128, 32, 64, 2, 64, 132, 396));
  // PlanSplits passes the resident count when the request asks for one-wave grids.
  SplitPlanRequest r = ShortDecodeRequest(8192);
  r.batch_size = 24;
  r.num_workers = 396;
  r.fill_workers = 264;
  r.split_merge_blocks = 2;
  r.short_split_keys = 0;
  EXPECT_EQ(int64_t{26}, PlanSplits(r).num_splits);
  r.one_wave_splits = true;
  EXPECT_EQ(int64_t{2}, PlanSplits(r).num_splits);
}

TEST(HeuristicPrefersSplitsOfWholeBlocks) {
  // 8 tiles on 396 workers (132 SMs x 3 CTAs), 32k keys in blocks of 64, at most 32 splits:
  // 31 splits are within 95% of the best wave but cost 17 blocks each; 32 cost 16.
  EXPECT_EQ(int64_t{32}, NumSplitsHeuristic(8, 396, 32768, 256, 32, 64));
  // Counted in single keys the tie-break still prefers 32 (1024 keys against 1058).
  EXPECT_EQ(int64_t{32}, NumSplitsHeuristic(8, 396, 32768, 256, 32, 1));
  // 128 tiles of 4096 keys: 3 splits (one wave of 384, 22 blocks) tie with 6 (two waves of
  // 11 blocks): the smaller count wins.
  EXPECT_EQ(int64_t{3}, NumSplitsHeuristic(128, 396, 4096, 256, 32, 64));
}

TEST(HeuristicNeverExceedsItsLimits) {
  int64_t checked = 0, bad = 0;
  for (int64_t tiles = 1; tiles <= 40; ++tiles) {
    for (int64_t workers : {1, 8, 16, 132, 264}) {
      for (int64_t kv : {0, 100, 255, 256, 1000, 5000, 100000}) {
        for (int64_t min_keys : {64, 256}) {
          for (int64_t max_splits : {1, 4, 64}) {
            const int64_t s = NumSplitsHeuristic(tiles, workers, kv, min_keys, max_splits);
            const int64_t by_keys = kv / min_keys > 1 ? kv / min_keys : 1;
            ++checked;
            if (s < 1 || s > max_splits || s > by_keys) {
              ++bad;
              EXPECT_LE(s, max_splits);
              EXPECT_LE(s, by_keys);
              EXPECT_GE(s, int64_t{1});
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(int64_t{0}, bad);
  EXPECT_GT(checked, int64_t{0});
  // Fewer keys than one split's minimum: never split.
  EXPECT_EQ(int64_t{1}, NumSplitsHeuristic(1, 132, 255, 256, 64));
}

// fill_workers, where set, is what the heuristic fills; num_workers still reaches the plan
// (the CUDA launcher sizes its stages by what is resident). 16 x 4096 decode (128 tiles) on
// 396 resident CTAs, filling 264: 2 splits, not 3; batch 32 (256 tiles) does not split.
TEST(PlanFillsFillWorkersAndKeepsNumWorkers) {
  SplitPlanRequest r = LongDecodeRequest();
  r.batch_size = 16;
  r.layout_shape = LayoutShape{16, 32, 128};
  r.max_kv_len = 4096;
  r.num_workers = 396;
  EXPECT_EQ(int64_t{3}, PlanSplits(r).num_splits);
  r.fill_workers = 264;
  SplitPlan plan = PlanSplits(r);
  EXPECT_EQ(int64_t{2}, plan.num_splits);
  EXPECT_EQ(int64_t{396}, plan.num_workers);
  r.batch_size = 32;
  r.layout_shape = LayoutShape{32, 32, 128};
  r.max_kv_len = 8192;
  r.fill_workers = 0;
  EXPECT_EQ(int64_t{32}, PlanSplits(r).num_splits);  // 8192 CTAs of 4 blocks: 306 us on the H200
  r.fill_workers = 264;
  EXPECT_EQ(int64_t{1}, PlanSplits(r).num_splits);   // 266 us
  r.forced_num_splits = 3;
  EXPECT_EQ(int64_t{3}, PlanSplits(r).num_splits);  // a forced count is kept
}

TEST(PlanUsesTheHeuristicWhenTheWorkspaceHoldsIt) {
  const SplitPlanRequest r = LongDecodeRequest();
  const SplitPlan plan = PlanSplits(r);
  EXPECT_EQ(NumSplitsHeuristic(8, 132, 32768, 256, 64), plan.num_splits);
  EXPECT_EQ(int64_t{8}, plan.num_tiles);
  EXPECT_EQ(int64_t{132}, plan.num_workers);  // what the CUDA launcher sizes its stages by
  EXPECT_EQ(int64_t{1}, plan.max_q_tiles);
  const auto expected = splitkv::ComputeWorkspaceLayout(r.layout_shape, plan.num_splits);
  EXPECT_EQ(expected.required_bytes, plan.layout.required_bytes);
  EXPECT_EQ(expected.softmax_offset, plan.layout.softmax_offset);
  EXPECT_EQ(expected.scratch_offset, plan.layout.scratch_offset);
}

TEST(PlanLowersNumSplitsToFitTheWorkspace) {
  SplitPlanRequest r = LongDecodeRequest();
  const int64_t wanted = PlanSplits(r).num_splits;
  EXPECT_GT(wanted, int64_t{5});
  for (int64_t fits = 2; fits < wanted; ++fits) {
    r.workspace_bytes = RequiredWorkspaceBytes(r.layout_shape, fits) + 100;  // short of fits + 1
    const SplitPlan plan = PlanSplits(r);
    EXPECT_EQ(fits, plan.num_splits);
    EXPECT_LE(plan.layout.required_bytes, r.workspace_bytes);
  }
}

TEST(PlanLowersToOneWhenOnlyTheCounterRegionFits) {
  SplitPlanRequest r = LongDecodeRequest();
  r.workspace_bytes = kCounterRegionBytes;
  const SplitPlan plan = PlanSplits(r);
  EXPECT_EQ(int64_t{1}, plan.num_splits);
  EXPECT_EQ(kCounterRegionBytes, plan.layout.required_bytes);
  r.workspace_bytes = RequiredWorkspaceBytes(r.layout_shape, 2) - 1;
  EXPECT_EQ(int64_t{1}, PlanSplits(r).num_splits);
}

TEST(ForcedNumSplitsThatDoesNotFitIsRefused) {
  SplitPlanRequest r = LongDecodeRequest();
  r.forced_num_splits = 8;
  const int64_t need = RequiredWorkspaceBytes(r.layout_shape, 8);
  r.workspace_bytes = need - 1;
  const std::string message =
      EXPECT_THROWS(WorkspaceError, PlanSplits(r), "test_op: workspace too small", "need " + std::to_string(need) + " bytes",
                    "num_splits=8", "got " + std::to_string(need - 1));
  EXPECT_TRUE(message.rfind("test_op: ", 0) == 0);
  // Exactly enough is accepted, and a forced count is used as given (even above the heuristic's).
  r.workspace_bytes = need;
  EXPECT_EQ(int64_t{8}, PlanSplits(r).num_splits);
  r.forced_num_splits = 200;
  r.workspace_bytes = int64_t{1} << 40;
  EXPECT_EQ(int64_t{200}, PlanSplits(r).num_splits);
  // Forced 1 needs only the counter region.
  r.forced_num_splits = 1;
  r.workspace_bytes = kCounterRegionBytes;
  EXPECT_EQ(int64_t{1}, PlanSplits(r).num_splits);
}

TEST(WorkspaceBelowTheCounterRegionIsRefused) {
  SplitPlanRequest r = LongDecodeRequest();
  for (int64_t bytes : {int64_t{0}, int64_t{256}, kCounterRegionBytes - 1}) {
    for (int64_t forced : {0, 1, 4}) {
      r.workspace_bytes = bytes;
      r.forced_num_splits = forced;
      EXPECT_THROWS(WorkspaceError, PlanSplits(r), "test_op: workspace too small",
                    std::to_string(kCounterRegionBytes), "got " + std::to_string(bytes));
    }
  }
}

TEST(BytesBeyondInt64AreTooSmallNotWrapped) {
  // 2^15 tokens x 2^15 heads x 1022 x 2^22 splits x 4 bytes overflows int64: the plan must
  // refuse a forced count and lower a chosen one, never accept a wrapped-around size.
  SplitPlanRequest r;
  r.op = "test_op";
  r.layout_shape = LayoutShape{int64_t{1} << 15, int64_t{1} << 15, 1022};
  r.batch_size = 1;
  r.num_kv_heads = 1;
  r.max_kv_len = 1;
  r.workspace_bytes = kCounterRegionBytes;
  r.forced_num_splits = int64_t{1} << 22;
  EXPECT_THROWS(WorkspaceError, PlanSplits(r), "test_op: workspace too small", "more than 2^62 bytes",
                "num_splits=4194304", "got 8388608");
  r.forced_num_splits = 0;
  r.max_kv_len = int64_t{1} << 40;
  r.min_keys_per_split = 1;
  r.max_splits = int64_t{1} << 22;
  r.num_workers = int64_t{1} << 30;
  EXPECT_EQ(int64_t{1}, PlanSplits(r).num_splits);
}

TEST(TooManyTilesForTheCounterRegion) {
  SplitPlanRequest r;
  r.op = "test_op";
  r.layout_shape = LayoutShape{kMaxCounters + 1, 1, 1};
  r.batch_size = kMaxCounters + 1;
  r.num_kv_heads = 1;
  r.max_kv_len = 1 << 20;
  r.workspace_bytes = int64_t{1} << 40;
  r.forced_num_splits = 2;
  EXPECT_THROWS(WorkspaceError, PlanSplits(r), "test_op: too many work tiles for the counter region",
                "need " + std::to_string(kMaxCounters + 1) + " counters", "holds " + std::to_string(kMaxCounters));
  // Exactly as many tiles as counters is fine.
  r.batch_size = kMaxCounters;
  r.layout_shape.total_q = kMaxCounters;
  EXPECT_EQ(int64_t{2}, PlanSplits(r).num_splits);
  // Tiles x q tiles count too: 2^20 requests x 2 kv heads x 2 q tiles > 2^21.
  r.batch_size = int64_t{1} << 20;
  r.num_kv_heads = 2;
  r.max_q_tiles = 2;
  EXPECT_THROWS(WorkspaceError, PlanSplits(r), "too many work tiles", std::to_string(int64_t{1} << 22));
  // Chosen (not forced): lowered to 1, which needs no counters, even with idle workers.
  r.forced_num_splits = 0;
  r.num_workers = int64_t{1} << 40;
  EXPECT_GT(NumSplitsHeuristic(int64_t{1} << 22, r.num_workers, r.max_kv_len, 256, 64), int64_t{1});
  EXPECT_EQ(int64_t{1}, PlanSplits(r).num_splits);
}

TEST(MaxQTilesBelowOneCountsAsOne) {
  SplitPlanRequest r = LongDecodeRequest();
  r.max_q_tiles = 0;
  const SplitPlan plan = PlanSplits(r);
  EXPECT_EQ(int64_t{1}, plan.max_q_tiles);
  EXPECT_EQ(int64_t{8}, plan.num_tiles);
}

// Checks that splits 0..n-1 of [lo, hi) tile it in order, exactly once, in chunks that are
// a multiple of granularity (all but the last nonempty one), with empty splits only at the end.
void CheckCover(int64_t lo, int64_t hi, int64_t n, int64_t g, int64_t* bad) {
  int64_t cursor = lo;
  bool seen_empty = false, seen_short = false;
  const int64_t per_split = hi > lo ? (hi - lo + n - 1) / n : 0;
  const int64_t chunk = (per_split + g - 1) / g * g;
  for (int64_t i = 0; i < n; ++i) {
    const splitkv::KeyRange k = splitkv::SplitKeyRange(lo, hi, n, i, g);
    const int64_t size = k.end - k.begin;
    bool ok = k.begin == cursor && size >= 0 && k.end <= (hi > lo ? hi : lo);
    if (size == 0) {
      seen_empty = true;
    } else {
      ok &= !seen_empty && !seen_short && size <= chunk;
      if (size % g != 0) seen_short = true;  // only the last nonempty may be short
      ok &= (k.begin - lo) % g == 0;
    }
    if (!ok) {
      if (*bad < 5) {
        splitkv_test::Fail(__FILE__, __LINE__,
                           "SplitKeyRange(" + std::to_string(lo) + ", " + std::to_string(hi) + ", " + std::to_string(n) +
                               ", " + std::to_string(i) + ", " + std::to_string(g) + ") = [" + std::to_string(k.begin) +
                               ", " + std::to_string(k.end) + "), expected to start at " + std::to_string(cursor));
      }
      ++*bad;
    }
    cursor = k.end;
  }
  if (cursor != (hi > lo ? hi : lo)) ++*bad;
}

TEST(SplitKeyRangeCoversEveryKeyOnce) {
  int64_t bad = 0, cases = 0;
  for (int64_t lo : {0, 5, 100}) {
    for (int64_t len : {0, 1, 2, 15, 16, 17, 63, 64, 65, 97, 1000, 4099}) {
      for (int64_t n = 1; n <= 70; ++n) {
        for (int64_t g : {1, 16, 64}) {
          CheckCover(lo, lo + len, n, g, &bad);
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(int64_t{0}, bad);
  EXPECT_GT(cases, int64_t{0});
}

TEST(SplitKeyRangeDealsGranulesEvenly) {
  // No nonempty split is more than one granule longer than another (all but a short last
  // granule): 32768 keys in 16-key pages over 31 splits are 2 splits of 67 pages and 29 of
  // 66 (cutting 67 pages each would leave the last split 58), and 4096 over 3 are 1376, 1360,
  // 1360.
  int64_t bad = 0;
  for (int64_t len : {1, 17, 97, 1000, 4096, 4099, 32768}) {
    for (int64_t n = 1; n <= 70; ++n) {
      for (int64_t g : {1, 16, 64}) {
        int64_t longest = 0, shortest = len;
        for (int64_t i = 0; i < n; ++i) {
          const splitkv::KeyRange k = splitkv::SplitKeyRange(0, len, n, i, g);
          const int64_t granules = (k.end - k.begin + g - 1) / g;
          if (k.end > k.begin) longest = std::max(longest, granules), shortest = std::min(shortest, granules);
        }
        if (longest - shortest > 1) ++bad;
      }
    }
  }
  EXPECT_EQ(int64_t{0}, bad);
  const int64_t expected_32k[3][2] = {{0, 1072}, {1072, 2144}, {2144, 3200}};
  for (int64_t i = 0; i < 3; ++i) {
    const splitkv::KeyRange k = splitkv::SplitKeyRange(0, 32768, 31, i, 16);
    EXPECT_EQ(expected_32k[i][0], k.begin);
    EXPECT_EQ(expected_32k[i][1], k.end);
  }
  const splitkv::KeyRange last = splitkv::SplitKeyRange(0, 32768, 31, 30, 16);
  EXPECT_EQ(int64_t{32768 - 1056}, last.begin);
  EXPECT_EQ(int64_t{32768}, last.end);
  const int64_t expected_4k[3][2] = {{0, 1376}, {1376, 2736}, {2736, 4096}};
  for (int64_t i = 0; i < 3; ++i) {
    const splitkv::KeyRange k = splitkv::SplitKeyRange(0, 4096, 3, i, 16);
    EXPECT_EQ(expected_4k[i][0], k.begin);
    EXPECT_EQ(expected_4k[i][1], k.end);
  }
}

TEST(SplitKeyRangeLeavesTrailingSplitsEmpty) {
  // 97 keys in chunks of 64 over 4 splits: [0, 64), [64, 97), then two empty splits.
  const int64_t expected[4][2] = {{0, 64}, {64, 97}, {97, 97}, {97, 97}};
  for (int64_t i = 0; i < 4; ++i) {
    const splitkv::KeyRange k = splitkv::SplitKeyRange(0, 97, 4, i, 64);
    EXPECT_EQ(expected[i][0], k.begin);
    EXPECT_EQ(expected[i][1], k.end);
  }
  // An empty (or inverted) key range gives empty splits at lo.
  for (int64_t i = 0; i < 3; ++i) {
    const splitkv::KeyRange k = splitkv::SplitKeyRange(10, 4, 3, i, 16);
    EXPECT_EQ(int64_t{10}, k.begin);
    EXPECT_EQ(int64_t{10}, k.end);
  }
}

TEST(InvariantSplitsSitAtAbsolutePositions) {
  // Keys [700, 2600) (a window) at 1024 keys a split, blocks of 64: split 0 starts on the
  // block holding key 700, splits 1 and 2 on their own boundaries, split 3 is empty.
  const int64_t expected[4][2] = {{640, 1024}, {1024, 2048}, {2048, 2600}, {3072, 3072}};
  for (int64_t i = 0; i < 4; ++i) {
    const splitkv::KeyRange k = splitkv::InvariantSplitKeyRange(700, 2600, i, 1024, 64);
    EXPECT_EQ(expected[i][0], k.begin);
    EXPECT_EQ(expected[i][1], k.end);
  }
  // Keys [1500, 1600): split 0 holds none of them.
  const splitkv::KeyRange none = splitkv::InvariantSplitKeyRange(1500, 1600, 0, 1024, 64);
  EXPECT_EQ(none.begin, none.end);
  EXPECT_EQ(int64_t{0}, splitkv::InvariantNumSplits(0, 1024));
  EXPECT_EQ(int64_t{1}, splitkv::InvariantNumSplits(1024, 1024));
  EXPECT_EQ(int64_t{2}, splitkv::InvariantNumSplits(1025, 1024));
}

TEST(InvariantPlanSplitsOrRunsSplitsInTask) {
  SplitPlanRequest r = LongDecodeRequest();
  r.batch_invariant = true;
  r.invariant_split_keys = 1024;
  r.max_kv_len = 32768;
  r.workspace_bytes = RequiredWorkspaceBytes(r.layout_shape, 32);
  // The split count is the key count's, not the heuristic's (which would pick another).
  SplitPlan plan = PlanSplits(r);
  EXPECT_EQ(int64_t{32}, plan.num_splits);
  EXPECT_EQ(int64_t{1024}, plan.invariant_split_keys);
  // Too small a workspace: one task per tile where the backend runs splits in task ...
  r.workspace_bytes = RequiredWorkspaceBytes(r.layout_shape, 31);
  r.in_task_splits = true;
  EXPECT_EQ(int64_t{1}, PlanSplits(r).num_splits);
  EXPECT_EQ(int64_t{32}, PlanSplits(r).invariant_task_splits);
  // ... else refused, never fewer splits (other bits).
  r.in_task_splits = false;
  bool threw = false;
  try {
    PlanSplits(r);
  } catch (const WorkspaceError& e) {
    threw = std::string(e.what()).find("for batch_invariant (32 splits of 1024 keys)") != std::string::npos;
  }
  EXPECT_TRUE(threw);
}

// tail_split_workers: a one-split grid just past one wave of resident CTAs (up to 1.5 waves)
// plans 2 splits; below a wave, past 1.5 waves, or without the field, the heuristic's 1.
TEST(TailSplitWorkersSplitAThinSecondWave) {
  SplitPlanRequest r = LongDecodeRequest();
  r.max_kv_len = 4096;
  r.num_workers = 396;  // 132 SMs x 3 CTAs
  r.tail_split_workers = 396;
  auto planned = [&](int64_t batch) {
    r.batch_size = batch;
    r.layout_shape = LayoutShape{batch, 64, 64};
    return PlanSplits(r).num_splits;
  };
  EXPECT_EQ(int64_t{1}, planned(48));   // 384 tiles: within one wave
  EXPECT_EQ(int64_t{2}, planned(50));   // 400 tiles: just past it
  EXPECT_EQ(int64_t{2}, planned(64));   // 512 tiles (measured: 2 splits 13 % faster at 4096 keys)
  EXPECT_EQ(int64_t{2}, planned(74));   // 592 tiles <= 1.5 x 396
  EXPECT_EQ(int64_t{1}, planned(75));   // 600 tiles: a second wave more than half full
  EXPECT_EQ(int64_t{1}, planned(96));   // 768 tiles (measured: 1 split fastest)
  r.max_kv_len = 2047;  // below the measured lengths (2048 keys and up)
  EXPECT_EQ(int64_t{1}, planned(64));
  r.max_kv_len = 2048;
  EXPECT_EQ(int64_t{2}, planned(64));
  r.max_kv_len = 4096;
  r.workspace_bytes = RequiredWorkspaceBytes(LayoutShape{64, 64, 64}, 2) - 1;  // no room: 1
  EXPECT_EQ(int64_t{1}, planned(64));
  r.workspace_bytes = int64_t{1} << 32;
  r.max_kv_len = 16383;  // the longest 2-split tiles
  EXPECT_EQ(int64_t{2}, planned(64));
  r.max_kv_len = 16384;  // from here 4 splits
  EXPECT_EQ(int64_t{4}, planned(64));
  EXPECT_EQ(int64_t{4}, planned(50));
  EXPECT_EQ(int64_t{1}, planned(48));
  EXPECT_EQ(int64_t{1}, planned(75));
  r.max_splits = 3;  // capped
  EXPECT_EQ(int64_t{3}, planned(64));
  r.max_splits = 64;
  r.min_keys_per_split = 8192;  // 4 splits would cut under the floor: 2
  EXPECT_EQ(int64_t{2}, planned(64));
  r.min_keys_per_split = LongDecodeRequest().min_keys_per_split;
  r.workspace_bytes = RequiredWorkspaceBytes(LayoutShape{64, 64, 64}, 4) - 1;  // room for 3
  EXPECT_EQ(int64_t{3}, planned(64));
  r.workspace_bytes = int64_t{1} << 32;
  // Past two waves, from 16384 keys: a last wave at most 60 % full, 2 splits; at most 30 %, 4.
  r.max_kv_len = 16384;
  EXPECT_EQ(int64_t{2}, planned(128));  // 1024 tiles: 2.59 waves (last 59 %)
  EXPECT_EQ(int64_t{4}, planned(160));  // 1280 tiles: 3.23 waves (last 23 %)
  EXPECT_EQ(int64_t{1}, planned(192));  // 1536 tiles: 3.88 waves (last 88 %)
  EXPECT_EQ(int64_t{1}, planned(99));   // 792 tiles: exactly 2 waves
  EXPECT_EQ(int64_t{1}, planned(256));  // 2048 tiles: past 4 waves
  EXPECT_EQ(int64_t{1}, planned(132));  // 1056 tiles: 2.67 waves (last 67 %)
  r.max_kv_len = 16383;  // under 16384 keys
  EXPECT_EQ(int64_t{1}, planned(128));
  EXPECT_EQ(int64_t{1}, planned(160));
  // tail_keep_tiles: grids of at most that many tiles keep 1 split under 16384 keys.
  r.tail_keep_tiles = 528;  // 132 SMs x 4
  r.max_kv_len = 4096;
  EXPECT_EQ(int64_t{1}, planned(64));  // 512 tiles
  EXPECT_EQ(int64_t{1}, planned(66));  // 528
  EXPECT_EQ(int64_t{2}, planned(67));  // 536: past it, the thin-wave rule again
  EXPECT_EQ(int64_t{2}, planned(74));
  r.max_kv_len = 16383;
  EXPECT_EQ(int64_t{1}, planned(64));
  r.max_kv_len = 16384;  // long tiles: 4 splits as before
  EXPECT_EQ(int64_t{4}, planned(64));
  r.tail_keep_tiles = 0;
  r.max_kv_len = 4096;
  r.tail_split_workers = 0;
  EXPECT_EQ(int64_t{1}, planned(64));
}

// fill_wave_workers: a grid of 1/8 to one wave of resident CTAs in tiles, at 4096 keys or
// more, plans the 1-8 splits whose last wave of resident CTAs is fullest (the fewest of
// equals); elsewhere the heuristic's plan.
TEST(FillWaveWorkersFillTheLastResidentWave) {
  SplitPlanRequest r = LongDecodeRequest();
  r.max_kv_len = 8192;
  r.num_workers = 132;
  r.fill_workers = 132;       // 1 CTA an SM
  r.fill_wave_workers = 264;  // 2 resident an SM
  auto planned = [&](int64_t batch) {
    r.batch_size = batch;
    r.layout_shape = LayoutShape{batch, 32, 256};
    return PlanSplits(r).num_splits;
  };
  EXPECT_EQ(int64_t{4}, planned(24));  // 192 tiles: 768 CTAs, 2.91 waves (measured fastest)
  EXPECT_EQ(int64_t{2}, planned(16));  // 128 tiles: 256 CTAs (4 splits' 512 of 528 is no fuller)
  EXPECT_EQ(int64_t{4}, planned(8));   // 64 tiles: 256 CTAs (the heuristic's 2: 128)
  EXPECT_EQ(int64_t{8}, planned(12));  // 96 tiles: 768 CTAs (at most 8 splits)
  EXPECT_EQ(int64_t{1}, planned(33));  // 264 tiles: one full wave already
  EXPECT_EQ(int64_t{1}, planned(34));  // 272 tiles: past one wave
  r.fill_wave_workers = 0;
  const int64_t heuristic_of_4 = planned(4);  // 32 tiles, under 1/8 of a wave: the heuristic's
  r.fill_wave_workers = 264;
  EXPECT_EQ(heuristic_of_4, planned(4));
  EXPECT_TRUE(heuristic_of_4 != 8);  // (so the rule, which plans 8 here, is seen not to apply)
  r.max_kv_len = 4096;
  EXPECT_EQ(int64_t{4}, planned(24));
  r.max_splits = 3;  // 1-3 splits fill 192 / 264, 384 / 528, 576 / 792: the fewest
  EXPECT_EQ(int64_t{1}, planned(24));
  r.max_splits = 64;
  r.max_kv_len = 4095;  // under the measured lengths
  EXPECT_EQ(int64_t{1}, planned(24));
  r.max_kv_len = 8192;
  r.workspace_bytes = RequiredWorkspaceBytes(LayoutShape{24, 32, 256}, 4) - 1;  // room for 3
  EXPECT_EQ(int64_t{3}, planned(24));
  r.workspace_bytes = int64_t{1} << 32;
  r.fill_wave_workers = 0;
  EXPECT_EQ(int64_t{1}, planned(24));
}

// fill_wave_min_tiles: the rule above only for grids of at least that many tiles; smaller
// ones keep the heuristic's plan.
TEST(FillWaveMinTilesKeepsSmallerGridsOnTheHeuristic) {
  SplitPlanRequest r = LongDecodeRequest();
  r.max_kv_len = 8192;
  r.num_workers = 264;
  r.fill_workers = 132;
  auto planned = [&](int64_t batch, int64_t min_tiles) {
    r.batch_size = batch;
    r.layout_shape = LayoutShape{batch, 32, 256};
    r.fill_wave_workers = 264;
    r.fill_wave_min_tiles = min_tiles;
    const int64_t with_rule = PlanSplits(r).num_splits;
    r.fill_wave_workers = 0;
    r.fill_wave_min_tiles = 0;
    const int64_t heuristic = PlanSplits(r).num_splits;
    return std::make_pair(with_rule, heuristic);
  };
  EXPECT_EQ(int64_t{4}, planned(24, 133).first);  // 192 tiles: the rule's 4
  EXPECT_EQ(int64_t{4}, planned(24, 192).first);  // the bound itself is in
  const auto at_16 = planned(16, 133);              // 128 tiles: the heuristic's
  EXPECT_EQ(at_16.second, at_16.first);
  EXPECT_EQ(int64_t{2}, planned(16, 0).first);     // (where the rule alone plans 2)
  EXPECT_TRUE(at_16.second != 2);
  const auto at_24 = planned(24, 193);              // 192 tiles under a bound of 193
  EXPECT_EQ(at_24.second, at_24.first);
  EXPECT_TRUE(at_24.second != 4);
}

// wave_split_workers: a one-split grid of 3.5 to 11 waves of tiles of 8192 keys or more plans
// the fewest splits that make 11 waves; below 3.5 waves, from 11 up, under 8192 keys, or
// without the field, the heuristic's 1.
TEST(WaveSplitWorkersSplitAFewLongWaves) {
  SplitPlanRequest r = LongDecodeRequest();
  r.num_workers = 396;   // 132 SMs x 3 CTAs resident
  r.fill_workers = 264;  // the planner fills 2 an SM
  r.min_keys_per_split = 128;
  r.max_splits = 32;
  r.wave_split_workers = 264;
  auto planned = [&](int64_t batch, int64_t kv_len) {
    r.batch_size = batch;
    r.max_kv_len = kv_len;
    r.layout_shape = LayoutShape{batch, 32, 128};
    return PlanSplits(r).num_splits;
  };
  EXPECT_EQ(int64_t{1}, planned(115, 32768));  // 920 tiles: 3.48 waves
  EXPECT_EQ(int64_t{4}, planned(116, 32768));  // 928 tiles: 3.52 waves; 4 x 928 >= 11 x 264
  EXPECT_EQ(int64_t{3}, planned(128, 32768));  // 1024 tiles (measured: 3 splits 2.6 % faster)
  EXPECT_EQ(int64_t{3}, planned(160, 16384));  // 1280 tiles (3 splits 1.6 % faster)
  EXPECT_EQ(int64_t{2}, planned(192, 16384));  // 1536 tiles
  EXPECT_EQ(int64_t{2}, planned(256, 32768));  // 2048 tiles (2 splits 3.9 % faster)
  EXPECT_EQ(int64_t{2}, planned(256, 8192));   // 8192 keys: the shortest measured gain
  EXPECT_EQ(int64_t{1}, planned(256, 8191));   // shorter: 256 x 4096 kept 1 split fastest
  EXPECT_EQ(int64_t{2}, planned(362, 8192));   // 2896 tiles: 10.97 waves
  EXPECT_EQ(int64_t{1}, planned(363, 8192));   // 2904 tiles: 11 waves (384 x 8192: 1 fastest)
  r.workspace_bytes = RequiredWorkspaceBytes(LayoutShape{256, 32, 128}, 2) - 1;  // no room: 1
  EXPECT_EQ(int64_t{1}, planned(256, 32768));
  r.workspace_bytes = int64_t{1} << 32;
  r.max_splits = 1;
  EXPECT_EQ(int64_t{1}, planned(256, 32768));
  r.max_splits = 32;
  r.wave_split_workers = 0;
  EXPECT_EQ(int64_t{1}, planned(256, 32768));
}

// A backend that runs a call's splits in one task only where the workspace cannot hold them
// (CUDA's wgmma prefill): split tasks where they fit, whether or not they pay; one task, with
// the split count recorded for a refusal at launch, where they do not.
TEST(InvariantPlanRunsSplitsInTaskOnlyIfShort) {
  SplitPlanRequest r = LongDecodeRequest();
  r.batch_invariant = true;
  r.invariant_split_keys = 1024;
  r.max_kv_len = 32768;
  r.in_task_splits_if_short = true;
  r.workspace_bytes = RequiredWorkspaceBytes(r.layout_shape, 32);
  SplitPlan plan = PlanSplits(r);
  EXPECT_EQ(int64_t{32}, plan.num_splits);
  EXPECT_EQ(int64_t{0}, plan.invariant_task_splits);
  r.workspace_bytes = RequiredWorkspaceBytes(r.layout_shape, 31);
  plan = PlanSplits(r);
  EXPECT_EQ(int64_t{1}, plan.num_splits);
  EXPECT_EQ(int64_t{32}, plan.invariant_task_splits);
  EXPECT_EQ(RequiredWorkspaceBytes(r.layout_shape, 1), plan.layout.required_bytes);
  // One split's keys: nothing to run in a task.
  r.max_kv_len = 1024;
  plan = PlanSplits(r);
  EXPECT_EQ(int64_t{1}, plan.num_splits);
  EXPECT_EQ(int64_t{0}, plan.invariant_task_splits);
  // The launch-time refusal names what the planner would have.
  bool threw = false;
  try {
    splitkv::ThrowInvariantWorkspaceTooSmall("ragged_attention", r.layout_shape, 32, 1024, 4096);
  } catch (const WorkspaceError& e) {
    const std::string what = e.what();
    threw = what.find("ragged_attention: workspace too small: need " +
                      std::to_string(RequiredWorkspaceBytes(r.layout_shape, 32)) +
                      " bytes for batch_invariant (32 splits of 1024 keys), got 4096") != std::string::npos;
  }
  EXPECT_TRUE(threw);
  // ... and where the partials' bytes fit, the counters were what the plan could not hold.
  threw = false;
  try {
    splitkv::ThrowInvariantTaskSplitsRefused("ragged_attention", r.layout_shape, 3000000, 32, 1024, int64_t{1} << 40);
  } catch (const WorkspaceError& e) {
    threw = std::string(e.what()).find("ragged_attention: too many work tiles for the counter region with "
                                       "batch_invariant: need 3000000 counters for 32 splits") != std::string::npos;
  }
  EXPECT_TRUE(threw);
  threw = false;
  try {
    splitkv::ThrowInvariantTaskSplitsRefused("ragged_attention", r.layout_shape, 8, 32, 1024, 4096);
  } catch (const WorkspaceError& e) {
    threw = std::string(e.what()).find("workspace too small") != std::string::npos;
  }
  EXPECT_TRUE(threw);
}

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
