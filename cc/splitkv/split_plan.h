// Split-KV planning: how many splits a call uses, and which keys each split covers.
//
// The heuristic follows the idea of FlashAttention 3's num_splits_heuristic (hopper/
// heuristics.h): split only when the tiles alone would leave workers idle, and consider the
// split counts whose last wave is at least 95% as full as the best one (and 1, when splitting
// has a price). Among those it takes the count whose grid the wave model finishes first:
// waves x key blocks in a split (the kernels walk keys in blocks of split_block_keys, so a
// split of 16.5 blocks costs 17), plus for any count above 1 the price of its partials and
// merge (split_merge_blocks, in the same blocks); the smallest count on a tie. Examples: 8
// tiles on 264 workers (132 SMs x 2 CTAs) with 32k keys (512 blocks of 64): 32 splits (97%
// full, 16 blocks each) and 33 (100%, 16 blocks) tie, so 32; FlashAttention's 85% would take
// 29 (232 CTAs). On 396 workers (3 CTAs an SM) at most 32 splits: 31 (the smallest within
// 95%) costs 17 blocks, 32 costs 16, so 32 (1.3% faster on the H200 than 31). 256 keys at a
// price of 2: 2 splits cost 2 + 2, tying 1 split's 4, so the tile stays whole. The most
// splits a tile takes: max_splits, and its keys over min_keys_per_split, or over
// short_split_keys where that grid still fits short_split_workers (tiles of 4 x
// min_keys_per_split keys or more); with one_wave_splits, what one wave holds.
#ifndef SPLITKV_SPLIT_PLAN_H_
#define SPLITKV_SPLIT_PLAN_H_

#include <cstdint>

#include "cc/splitkv/workspace_layout.h"

#if defined(__CUDACC__)
#define SPLITKV_HOST_DEVICE __host__ __device__
#else
#define SPLITKV_HOST_DEVICE
#endif

namespace splitkv {

// What the planner needs to know about a call.
struct SplitPlanRequest {
  const char* op = "";        // operation name, for error messages
  LayoutShape layout_shape;   // total_q, num_qo_heads, head_dim
  int64_t batch_size = 0;
  int64_t num_kv_heads = 0;
  int64_t max_q_tiles = 1;    // upper bound on query tiles per request
  int64_t max_kv_len = 0;     // upper bound on keys per request
  int64_t num_workers = 1;    // CPU threads x oversubscription, or GPU SMs x CTAs per SM
  // Workers the heuristic fills (0: num_workers). Fewer than num_workers where a grid that
  // fills every resident slot is slower than one that leaves some empty (the CUDA decode
  // kernel: tile_config.h DecodeFillCtasPerSm).
  int64_t fill_workers = 0;
  int64_t min_keys_per_split = 256;  // never split below this many keys
  int64_t max_splits = 64;
  int64_t split_block_keys = 64;     // keys the kernel's main loop takes at a time
  // What splitting costs a tile in the wave model's blocks (0: nothing): the partials and the
  // last CTA's merge, so a short tile stays whole where its few blocks cost less than that.
  int64_t split_merge_blocks = 0;
  // Splits may be as short as this many keys (0: min_keys_per_split always) while the split
  // grid fits short_split_workers (one CTA an SM), for tiles of at least 4 x
  // min_keys_per_split keys: each CTA then has its SM to itself, and a shorter chain of
  // blocks wins; past that, more, shorter CTAs only add fixed cost.
  int64_t short_split_keys = 0;
  int64_t short_split_workers = 0;
  // Split grids of at most one wave: within fill_workers where that holds 2 splits of every
  // tile, else within num_workers (the resident CTAs) in splits of at least 4 x
  // min_keys_per_split keys. The wave model prices a wave by its longest split's blocks
  // only, not each CTA's fixed cost, so without this cap it chose grids of many waves of
  // short CTAs (the GPU decode kernel sets it; split_plan.cc).
  bool one_wave_splits = false;
  // Resident CTAs of a kernel whose one-split grid loses to two splits when it spills just
  // past one wave (0: no such rule): tiles in (tail_split_workers, 1.5 x tail_split_workers]
  // plan 2 splits where the heuristic plans 1, and 4 where max_kv_len >= 16384 (and 4 splits
  // keep min_keys_per_split each). The CUDA decode kernel at head_dim 64 (16-bit K/V) sets
  // it: a CTA carries half head_dim 128's bytes a key, so the lone CTAs of a thin second wave
  // leave the copy engines idle (H200, gpt-oss heads 64 / 8, 512 tiles at 3 an SM: 64 x 2048
  // / 4096 / 8192 88.2 / 167.8 / 325.9 us at 1 split, 83.2 / 146.5 / 274.3 at 2; 48 x 4096 (384
  // tiles), 96 x 4096 (768) and head_dim 128 at 512 tiles keep 1 split fastest; docs/perf_log.md
  // 2026-12-02, session 23). On the 128-key tiles head_dim 64 runs there since session 32, 32 /
  // 8 heads, page 16 (64) us at 1 / 2 / 4 / 8 splits: 64 x 16384 604.3 / 508.7 / 497.3 / 496.3
  // (609.8 / 512.0 / 493.8 / 502.5), 64 x 32768 1232.0 / 1029.0 / 974.0 / 988.4 (1187.8 /
  // 1001.3 / 942.8 / 951.3), 64 x 8192 307.7 / 262.2 / 269.2 / 261.7, 64 x 4096 157.3 / 135.4 /
  // 142.5 / 144.4, 64 x 2048 83.1 / 76.5 / 82.2 / 92.4 (docs/perf_log.md 2026-12-04). Past two
  // waves (tiles in (2, 4) x tail_split_workers), from 16384 keys: a last wave at most 60 %
  // full plans 2 splits, at most 30 % full 4 (head_dim 64, us at 1 / 2 / 3 / 4 splits, beside
  // FlashInfer: 128 x 16384 (2.59 waves of 396) 1027.2 / 973.0 / 978.3 / 990.3 (985.4), 128 x
  // 32768 2016.9 / 1894.0 / 1917.0 / 1887.1 (1903.7), 160 x 32768 (3.23) 2704.4 / 2493.9 /
  // 2451.0 / 2412.2 (2427.3); outside it 192 x 16384 (3.88) 1448.8 / 1467.9 / 1473.7 / 1460.3,
  // 256 x 32768 (5.17) 3817.1 / 3828.5 / 3825.0 / 3823.8, 96 x 32768 (1.94) within 1 % at all).
  int64_t tail_split_workers = 0;
  // With tail_split_workers: one-split grids of at most this many tiles keep 1 split under
  // 16384 keys (0: none). The CUDA decode at head_dim 64 runs grids of 3-4 CTAs an SM at two
  // an SM, which fills two waves where three an SM left a thin second one (cuda/
  // attention_launch.cuh D64TwoPerSmGrid), so it sets 4 x SMs. H200, 32 / 8 heads, page 16,
  // us at 1 / 2 splits on that shape: 64 x 2048 (512 tiles) 68.3 / 74.7, 64 x 4096 129.0 /
  // 134.5, 60 x 4096 (480) 121.0 / 132.9, 64 x 8192 249.2 / 256.6 (docs/perf_log.md 2026-12-04,
  // session 33; from 16384 keys not measured: the 4 splits stay).
  int64_t tail_keep_tiles = 0;
  // Workers (the CTAs an SM the planner fills, times the SMs) of a kernel whose one-split grids
  // of several waves of long tiles lose to split grids of about 11 waves (0: no such rule):
  // tiles in [3.5, 11) x wave_split_workers with max_kv_len >= 8192 plan the fewest splits that
  // make 11 waves, where the heuristic plans 1. The likely cause: CTAs of many thousand keys
  // each leave the grid's end to the slowest of a few long waves, where more, shorter CTAs let
  // every slot finish within one short CTA of the others. The CUDA decode kernel at head_dim
  // 128 (16-bit K/V) sets it. Measured on the 64-key bulk shape, before session 45 moved these
  // grids to the wgmma-order tiles (not re-timed since). H200, 32 / 8 heads, page 16, us, 1
  // split against the rule's: 256 x 32768 7908 / 7598 (2 splits), 256 x 16384 3945 / 3797 (2),
  // 256 x 8192 1961 / 1914 (2), 224 x 16384 3431 / 3330 (2), 192 x 16384 2921 / 2858 (2), 160 x
  // 16384 2427 / 2388 (3), 128 x 32768 3904 / 3802 (3), 128 x 8192 977 / 976 (3); 320 x 8192
  // 2445 / 2395 (2; page 64 2393 / 2412). Outside it: 384 x 8192 (11.6 waves) and 512 x 8192
  // keep 1 split fastest, 256 x 4096 and 256 x 2048 too. Not set at head_dim 256 (128 x 16384
  // and 256 x 4096 kept 1 split fastest) nor 64, where the same cell split faster in one
  // process and slower in another (256 x 8192: 1012 / 978 and 969 / 998 us; docs/perf_log.md
  // 2026-12-04, session 31).
  int64_t wave_split_workers = 0;
  // Resident CTAs (one wave) of a kernel the heuristic fills at fewer CTAs an SM, whose grids
  // of up to one wave of tiles run fastest at the split count that fills their last wave of
  // resident CTAs (0: no such rule): tiles in [fill_wave_workers / 8, fill_wave_workers] with
  // max_kv_len >= 4096 plan the count of 1 to 8 splits whose grid's last wave of
  // fill_wave_workers is fullest (the fewest of equals), in place of the heuristic's. The CUDA
  // decode kernel at head_dim 256 (filled at 1 CTA an SM, 2 resident) sets it; over an fp8
  // cache with fill_wave_min_tiles (below). Figures for 16-bit K/V:
  // H200, 32 / 8 heads, page 16, us at 1 / 2 / 3 / 4 / 8 splits (FlashInfer): 24 x 8192 (192
  // tiles; 4 splits: 2.91 waves of 264) 410.8 / 407.2 / 390.4 / 374.9 / 379.5 (377.7), 24 x
  // 32768 1620.7 / 1604.2 / 1475.9 / 1448.3 / 1457.2 (1474.1), 24 x 4096 201.0 / 204.4 / 205.6 /
  // 191.1 / 196.7 (191.2), 16 x 4096 130.2 / 127.1 / 142.6 / 131.1 / 135.5 (131.0), 8 x 16384
  // (the heuristic's 2) - / 255.9 / 272.4 / 246.7 / 248.0 (248.4), 8 x 32768 - / 503.9 / 536.4 /
  // 482.1 / 483.1 (482.2), 12 x 16384 (the heuristic's 26: 380.9) 497.2 / 401.3 / 449.1 / 398.5
  // / 365.8 (374.8); 24 x 2048 (under 4096 keys) 105.2 at 1 split, 105.5 at 4. Under 1/8 of a
  // wave of tiles (batch 1-4) the heuristic's many splits stay (docs/perf_log.md 2026-12-04,
  // session 32). Pages under 8 slots run the 1-an-SM row-copy kernel; the rule still applies.
  int64_t fill_wave_workers = 0;
  // Fewest tiles the fill_wave_workers rule applies to, where more than its fill_wave_workers
  // / 8 (0: that bound alone). Head_dim 256 over an fp8 cache (2 resident CTAs an SM) sets the
  // SM count + 1, grids past one CTA an SM at one split. H100, fp8, ms, the heuristic's plan
  // against the rule's: 24 x 4096 (192 tiles) 0.1536 / 0.1489, 24 x 8192 0.3555 / 0.3198, 24 x
  // 16384 0.6952 / 0.6377 (1 split / 4); but 16 x 4096 (128 tiles) 0.0979 / 0.1038 (1 / 2), 8 x
  // 16384 0.1924 / 0.1978 (2 / 4), 12 x 16384 0.3206 / 0.3232 (26 / 8) (docs/perf_log.md
  // session 47).
  int64_t fill_wave_min_tiles = 0;
  int64_t forced_num_splits = 0;     // 0: choose; >= 1: use exactly this or throw
  int64_t workspace_bytes = 0;       // the buffer's real size
  // Batch-invariant mode: splits of invariant_split_keys keys at absolute positions; the
  // count is ceil(max_kv_len / invariant_split_keys) or, with in_task_splits, 1 where
  // splitting does not pay or does not fit (tasks then run their splits one after another).
  bool batch_invariant = false;
  int64_t invariant_split_keys = 0;
  bool in_task_splits = false;
  // Batch-invariant mode: the backend runs this call's tiles with all their splits in one
  // task (CUDA: the wgmma prefill kernel folds them in the CTA), so where the workspace cannot
  // hold every split's partials the plan is 1 split instead of a refusal. Where it can, the
  // count is ceil(max_kv_len / invariant_split_keys) as without it.
  bool in_task_splits_if_short = false;
};

struct SplitPlan {
  int64_t num_splits = 1;
  int64_t num_tiles = 0;       // batch_size * num_kv_heads * max_q_tiles
  int64_t max_q_tiles = 1;
  int64_t num_workers = 1;     // the request's workers: CTAs (or tasks) the grid was sized for
  // Batch-invariant mode: keys per split (split s covers keys [s * this, (s + 1) * this));
  // 0 in the default mode. num_splits is then the launch's split tasks per tile.
  int64_t invariant_split_keys = 0;
  // Batch-invariant plans of 1 split whose tiles may see more (in_task_splits or
  // in_task_splits_if_short): the splits a tile may have, which its task runs itself; else 0.
  int64_t invariant_task_splits = 0;
  WorkspaceLayout layout;
};

// The split count that best fills `num_workers` (ignores the workspace size). With
// resident_workers > 0 (SplitPlanRequest::one_wave_splits: the resident count) the grid stays
// within one wave: of num_workers where that holds 2 splits of every tile, else of
// resident_workers in splits of at least 4 x min_keys_per_split keys.
int64_t NumSplitsHeuristic(int64_t num_tiles, int64_t num_workers, int64_t max_kv_len,
                           int64_t min_keys_per_split, int64_t max_splits, int64_t split_block_keys = 64,
                           int64_t split_merge_blocks = 0, int64_t short_split_keys = 0,
                           int64_t short_split_workers = 0, int64_t resident_workers = 0);

// The WorkspaceError of a batch-invariant call whose workspace cannot hold its `splits`
// splits' partials: PlanSplits, and a backend whose kernel declined at launch a call planned
// to run its splits in one task (SplitPlan::invariant_task_splits).
[[noreturn]] void ThrowInvariantWorkspaceTooSmall(const char* op, const LayoutShape& shape, int64_t splits,
                                                  int64_t split_keys, int64_t workspace_bytes);
// The same for the counter region: `counters` needed for `splits` splits.
[[noreturn]] void ThrowInvariantCountersTooFew(const char* op, int64_t counters, int64_t splits);
// A backend's refusal at launch of a plan of SplitPlan::invariant_task_splits its kernel
// declined: the counters' message where the partials' bytes fit, else the workspace's.
[[noreturn]] void ThrowInvariantTaskSplitsRefused(const char* op, const LayoutShape& shape, int64_t num_tiles,
                                                  int64_t splits, int64_t split_keys, int64_t workspace_bytes);

// Chooses num_splits and the workspace layout. A chosen count is lowered until the
// workspace holds it (1 split needs only the counter region, and no counters). Throws
// WorkspaceError when the workspace is smaller than the counter region, or a forced
// count does not fit (bytes or counters); the message gives the bytes needed and given.
SplitPlan PlanSplits(const SplitPlanRequest& request);

// ceil(a / b) for b >= 1, 0 for a <= 0, without forming a + b - 1 (near INT64_MAX that sum
// wrapped: a page_size there made a request's page count negative and skipped its page-id
// checks). The host's tile, page and block counts: the launchers, the CUDA backend's plan
// check and the planner.
inline int64_t CeilDiv(int64_t a, int64_t b) { return a <= 0 ? 0 : (a - 1) / b + 1; }

// Keys [begin, end) of split `split_idx` when the tile's visible keys [lo, hi) are cut
// into `num_splits` runs of whole granules of `granularity` keys (a page or a key tile; the
// last granule may be short). The granules are dealt out evenly: the first G % num_splits
// splits get G / num_splits + 1 of the G granules, the rest G / num_splits, so no split is
// more than one granule longer than another (the longest is ceil(G / num_splits) granules, as
// when every split but the last took that many, but the shortfall is spread instead of left
// to the last split). Trailing splits are empty (begin == end) when there are fewer granules
// than splits.
struct KeyRange {
  int64_t begin;
  int64_t end;
};
SPLITKV_HOST_DEVICE inline KeyRange SplitKeyRange(int64_t lo, int64_t hi, int64_t num_splits,
                                                  int64_t split_idx, int64_t granularity) {
  if (hi <= lo) return {lo, lo};
  const int64_t granules = (hi - lo + granularity - 1) / granularity;
  const int64_t each = granules / num_splits, extra = granules % num_splits;
  const auto start = [&](int64_t i) {
    const int64_t key = lo + (i * each + (i < extra ? i : extra)) * granularity;
    return key < hi ? key : hi;
  };
  return {start(split_idx), start(split_idx + 1)};
}

// The batch-invariant split rule (AttentionOptions::batch_invariant), the one place that
// says which keys an invariant split covers. Split s covers the absolute KV positions
// [s * split_keys, (s + 1) * split_keys), so a row's splits depend only on its own visible
// keys, never on the batch or the launch's split count. InvariantNumSplits: the splits a
// tile whose visible keys end at `hi` has (0 when it sees none). InvariantSplitKeyRange: the
// keys split s of a tile with visible keys [lo, hi) walks, starting on a multiple of
// `block_keys` (a divisor of split_keys), so every kernel's key blocks sit at the same
// absolute positions whatever the tile's other rows; keys before lo are masked out by the
// kernels. Empty (begin == end) when the split holds none of [lo, hi).
SPLITKV_HOST_DEVICE inline int64_t InvariantNumSplits(int64_t hi, int64_t split_keys) {
  return hi <= 0 ? 0 : (hi + split_keys - 1) / split_keys;
}
SPLITKV_HOST_DEVICE inline KeyRange InvariantSplitKeyRange(int64_t lo, int64_t hi, int64_t split_idx,
                                                           int64_t split_keys, int64_t block_keys) {
  const int64_t split_begin = split_idx * split_keys;
  const int64_t aligned_lo = lo / block_keys * block_keys;
  const int64_t begin = split_begin > aligned_lo ? split_begin : aligned_lo;
  const int64_t split_end = split_begin + split_keys;
  const int64_t end = split_end < hi ? split_end : hi;
  if (hi <= lo || end <= begin || end <= lo) return {begin, begin};
  return {begin, end};
}

}  // namespace splitkv

#endif  // SPLITKV_SPLIT_PLAN_H_
