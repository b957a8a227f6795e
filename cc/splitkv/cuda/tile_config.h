// How the CUDA kernels cut work, shared by Traits() (which the planner sizes the counter
// index space with) and the launch code, so both always agree on q_tile_tokens.
//
// A CTA is 4 warps. Its query rows pack (query tokens x qo heads of one kv head's group), so a
// GQA decode step reads each KV block once for the whole group:
//   decode tiles:  16 rows (1 warp of rows); the 4 warps split each 64-key block in 4 (the
//                  wgmma-order path: batch-invariant calls, and the default decode by
//                  tensor copies on most grids at head_dim 64 and 128: each warp a
//                  quarter of the 128-key block's logits and their exponentials, the
//                  probabilities exchanged so every warp holds them all, and a quarter of
//                  head_dim).
//   prefill tiles: 64 rows (4 warps of 16 rows); every warp sees the whole key block.
// Calls use decode tiles when a tile's rows (max_q_len x group) fit in 16, else prefill tiles
// (calls the wgmma kernel serves run its own tiles: 128 rows, 192 at head_dim 64 where the
// group divides 192); batch-invariant calls as InvariantTile says.
#ifndef SPLITKV_CUDA_TILE_CONFIG_H_
#define SPLITKV_CUDA_TILE_CONFIG_H_

#include <cstdint>

namespace splitkv::cuda {

inline constexpr int kThreads = 128;
inline constexpr int kDecodeRows = 16;
inline constexpr int kPrefillRows = 64;

enum class TileKind { kDecode, kPrefill };

struct TileChoice {
  TileKind kind;
  int64_t q_tile_tokens;
};

// Most query rows a tile of q_tile_tokens holds when no request has more than max_q_len.
constexpr int64_t MaxTileRows(int64_t group_size, int64_t q_tile_tokens, int64_t max_q_len) {
  const int64_t tokens = max_q_len > 0 ? max_q_len : 1;
  return group_size * (q_tile_tokens < tokens ? q_tile_tokens : tokens);
}

constexpr TileChoice ChooseTile(int64_t group_size, int64_t max_q_len) {
  const int64_t q = max_q_len > 0 ? max_q_len : 1;
  if (group_size * q <= kDecodeRows) return {TileKind::kDecode, kDecodeRows / group_size};
  // A group wider than 64 rows still gets one token per tile; the CTA loops over row chunks.
  return {TileKind::kPrefill, group_size >= kPrefillRows ? 1 : kPrefillRows / group_size};
}

// Batch-invariant mode: every call of a device, paged or ragged, decode or prefill, runs
// kernels whose rows' results do not depend on the tile's other rows, split at absolute
// multiples of kInvariantSplitKeys keys with blocks on multiples of the block size, so a row
// meets the same blocks, splits and reduction order in any tile, batch or launch. The plan
// cuts decode tiles (`decode_kernel` below); the launch (backend_cuda.cu) then runs:
//  - sm_90, 16-bit K/V with 16-byte-aligned rows, head_dim 64 or 128 (the wgmma-order
//    family): calls with more rows than a decode tile on the wgmma prefill kernel, which
//    merges a tile's splits itself (prefill_sm90.cuh); its decode tiles, and the calls it
//    declines, on the decode kernel's wgmma-order path (decode_kernel.cuh kWgmmaOrder:
//    tensor copies, or row copies for pages under 8 slots and ragged K/V), which reduces a
//    row with mma.sync in the wgmma kernel's order. The two instructions round alike
//    (tools/gpu/mma_bits_probe.cu), so a token gets the same bits from either kernel;
//  - other sm_90 16-bit calls with a group within a decode tile (head_dim 256): decode tiles
//    on the bulk decode kernel for every call (ragged K/V by row copies). K/V rows that are
//    not 16-byte aligned run the mma.sync decode tiles instead (other bits: invariance holds
//    among calls of the same alignment, which a batch does not change);
//  - elsewhere (an fp8 cache included: the decode kernel reads fp8 only by tensor copies,
//    which ragged K/V lack), and for wider groups: prefill tiles of the mma.sync kernel (the
//    warp slices of its decode tiles reduce in another order than prefill tiles).
constexpr TileChoice InvariantTile(int64_t group_size, bool decode_kernel) {
  if (decode_kernel && group_size <= kDecodeRows) return {TileKind::kDecode, kDecodeRows / group_size};
  return {TileKind::kPrefill, group_size >= kPrefillRows ? 1 : kPrefillRows / group_size};
}
// 2048 keys: the prefill folds a split into its merged rows half as often as at 1024 (its
// cost), and decode grids stay near the default plan's at batch 1 to 24 (1 x 32768: 16
// splits, 128 CTAs, as fast as the default's 32). H200, invariant cost at 1024 -> 2048:
// decode 1 x 32768 +4.7 -> +0.9 %, 16 x 4096 +4.0 -> +1.8 %, 1 x 131072 +14.4 -> +8.4 %;
// prefill 8 x 2048 +14.3 -> +6.0 %, 4 x 4096 +17 -> +9-14 % (docs/perf_log.md 2026-12-03).
inline constexpr int64_t kInvariantSplitKeys = 2048;

// Keys per block of the main loop (the split granularity too).
constexpr int DecodeBlockKeys(int head_dim) { return 64; }
constexpr int PrefillBlockKeys(int head_dim) { return head_dim >= 256 ? 32 : 64; }
// Decode tiles only stream K/V, so they keep two blocks in flight where shared memory allows
// (head_dim 256 at three stages would exceed sm_80's 163 KiB per CTA).
constexpr int DecodeStages(int head_dim) { return head_dim >= 256 ? 2 : 3; }
// The sm_90 bulk-copy decode kernel (decode_kernel.cuh): 3 stages (2 CTAs an SM at d 128)
// for unsplit grids; split grids of at most one wave of 2-stage CTAs (3 an SM) run 2 stages,
// also at the 2 an SM the planner fills (DecodeFillCtasPerSm): 16 x 4096 at 2 splits
// 72.6-73.4 us with 2 stages, 74.2-74.6 with 3. 2 stages everywhere lost 10 % at 64 x 4096
// (512 tiles, 1.3 waves unsplit) (H200, docs/perf_log.md 2026-11-30). Head_dim 128's grids
// by tensor copies run the wgmma-order tiles instead, but for one-wave split grids, as most of
// head_dim 64's do (attention_launch.cuh); its 3 stages serve grids without tensor maps
// (pages under 8 slots, a cache whose maps do not apply, SPLITKV_DISABLE_SM90).
constexpr int BulkDecodeStages(int head_dim) { return head_dim >= 256 ? 2 : 3; }
constexpr int BulkDecodeSplitStages(int head_dim) { return 2; }
// The bulk decode kernel over an fp8 cache takes 128-key blocks at head_dim 64 (256 on small
// grids: below) and 128 (a 64-key fp8 block is half a 16-bit block's bytes for the same
// per-block work: barrier, copies, softmax reductions); a stage of them holds a 16-bit 64-key stage's bytes. 3 stages
// at head_dim 128 (2 CTAs an SM, where the planner fills 2 as for 16-bit caches), but for its
// keys-as-rows split grids (2 stages: attention_launch.cuh); head_dim 64 below; 64-key
// blocks at 256 (96 KiB, 2 an SM: at 2 stages 3 CTAs would fit, with too few registers for a
// 256-column accumulator). H200, fp8 / bf16 time, d128: 2 stages and 3 CTAs an SM for split
// grids (filled, up to 64 splits) against this: 1 x 32768 0.823 / 0.721, 16 x 8192 0.582 /
// 0.563, 1 x 131072 0.590 / 0.567, 16 x 4096 0.607 / 0.625 (docs/perf_log.md).
constexpr int Fp8DecodeBlockKeys(int head_dim) { return head_dim >= 256 ? 64 : 128; }
constexpr int Fp8BulkDecodeStages(int head_dim) { return 3; }
inline constexpr int kFp8D256DecodeCtasPerSm = 2;  // head_dim 256's fp8 stages (attention_launch.cuh asserts it)
// Head_dim 64 over an fp8 cache, tiles of at most 8 query rows (a decode step at a group of up
// to 8): keys as the mma's rows (half the mma, softmax and conversion work of the query rows'
// 16-row operand, which such a tile fills at most half), 2 stages, 4 CTAs an SM (128
// registers) so a grid of 3-4 CTAs an SM runs in one wave; grids of at most 2 CTAs an SM
// (1 x 131072 at 32 splits, 8 kv heads: 256 CTAs) 256-key blocks at 3 stages, half the blocks'
// fixed costs (barrier, row reductions) on each CTA's chain. H200, 32 / 8 heads, page 16, fp8 / bf16 time in one
// process, query rows at 3 stages (before) -> these, planned as below: 64 x 4096 0.888 ->
// 0.553, 128 x 4096 0.541, 16 x 4096 0.842 -> 0.655, 4 x 16384 0.855 -> 0.662, 1 x 32768
// 0.933 -> 0.757, 1 x 131072 0.821 -> 0.592 (docs/perf_log.md 2026-12-04, session 35). The
// planner fills those four (backend_cuda.cu Traits): 16 x 4096 3 -> 4 splits 26.8 -> 25.2
// us, 8 x 8192 6 -> 8 27.1 -> 25.4, 4 x 16384 12 -> 16 27.3 -> 25.8; 32 x 4096 1 or 2 alike.
// Its tiles of 9-16 rows (group 16, or a few speculative tokens) keep the query rows as the
// mma's rows, at 2 stages: three CTAs an SM on grids of at most three an SM (the planner's
// count), four an SM on larger ones. H200, group 16, fp8 / bf16 time in one process, 3 stages
// (before) -> these: 64 x 4096 0.892 -> 0.662, 128 x 4096 0.760 -> 0.660, 16 x 4096 0.867 ->
// 0.830, 4 x 16384 0.873 -> 0.845, 1 x 32768 0.950 -> 0.917 (four an SM on those split grids:
// 0.844, 0.856, 0.926; docs/perf_log.md 2026-12-04, session 35).
inline constexpr int kFp8D64QueryRowsCtasPerSm = 4;
inline constexpr int kFp8D64KeyRowsMaxRows = 8;  // the keys-as-rows mma's n
inline constexpr int kFp8D64KeyRowsCtasPerSm = 4;
// Whether a decode tile of at most max_tile_rows query rows runs keys as the mma's rows
// (Fp8KeyRowsD64Shape): head_dim 64 over an fp8 cache, at most kFp8D64KeyRowsMaxRows rows. The
// launch and the resident count (ResidentCtasPerSm) both ask this.
constexpr bool Fp8D64KeyRowsTile(int64_t head_dim, bool kv_fp8, int64_t max_tile_rows) {
  return head_dim == 64 && kv_fp8 && max_tile_rows <= kFp8D64KeyRowsMaxRows;
}
inline constexpr int kFp8D64WideBlockKeys = 256;
inline constexpr int64_t kFp8D64WideBlocksMaxCtasPerSm = 2;
// Tensor copies at head_dim 256 stream K and V as separate parts through 3 buffers of one
// block's K or V (BulkDecodeShape's ring): 105 KiB, two CTAs an SM, where two whole stages
// (137 KiB) fit one and each CTA's start and end left its SM without copies in flight.
constexpr bool BulkDecodeKvRing(int head_dim) { return head_dim >= 256; }
inline constexpr int kBulkDecodeRingStages = 3;
inline constexpr int kBulkDecodeRingCtasPerSm = 2;  // the ring's CTAs an SM (attention_launch.cuh asserts it)
// Head_dim 64's decode grids of more than 3 and at most this many CTAs an SM run the
// wgmma-order tiles at two an SM: two full waves of them (attention_launch.cuh
// D64TwoPerSmGrid; the planner keeps those grids unsplit, backend_cuda.cu tail_keep_tiles).
inline constexpr int64_t kD64TwoPerSmGridMaxCtasPerSm = 4;
// Most splits of one decode tile on the GPU. At 3 CTAs an SM the planner would cut 1 x 32k
// into 47 splits (704 keys each): 6 % slower than 31 on the H200, each CTA's fixed cost
// outweighing the parallelism. (A key floor instead, 1024, cost 8 x 2048 38 %: 2 splits, one
// CTA an SM, against 6.)
inline constexpr int64_t kDecodeMaxSplits = 32;
// Fewest keys a decode split takes (prefill tiles: 256). A short request at a small batch is
// latency-bound on each CTA's chain of blocks, so within one wave more, shorter splits win:
// H200, 1 request x 32 / 8 heads, d128, bf16, page 16, graph (us, forced splits 4 / 8 / 16):
// 1 x 1024 11.60 / 9.52 / 8.97, 1 x 2048 (8 / 16) 11.69 / 10.16; at 256 the planner took 4
// and 8 (FlashInfer XQA 8.7 and 9.9 in the same day's bench, docs/perf_log.md 2026-12-02).
// Every head_dim, bf16 and fp8, batch 1-16 x 512-4096 keys, 128 against 256 (same call):
// 3-32 % faster where the count changed (four d64 cells at 3-23 splits: -1.2..-0.3 %, the
// unchanged cells' spread -0.6..+1.1 %); but 256 keys in 2 splits lost to 1 at d <= 128
// (below), docs/perf_log.md 2026-12-02.
inline constexpr int64_t kDecodeMinKeysPerSplit = 128;
// Shorter still, one 64-key block, for 16-bit caches while the split grid fits one CTA an SM
// and the request has 512 keys or more (split_plan.h short_split_keys). H200, 64 against 128
// keys at batch 1 / 4 / 16 x 512-4096 keys (same call, graph us): batch 1 x 512 / 1024 d64
// 8.60 / 8.72 -> 7.77 / 8.14, d128 9.38 / 9.44 -> 8.27 / 8.91, d256 11.36 / 11.95 -> 10.09 /
// 11.34 (4 -> 8 and 8 -> 16 splits, 32 to 128 CTAs); but where the grid passed one CTA an SM
// it lost: 1 x 2048 d128 16 -> 32 splits 10.03 -> 10.30, 4 x 1024 d64 8 -> 12 9.61 -> 10.56;
// fp8 d128 lost at 1 x 1024 / 2048 and 4 x 512 (+3..+6 %), so it keeps 128 (docs/perf_log.md
// 2026-12-02).
inline constexpr int64_t kDecodeShortSplitKeys = 64;
// The planner's price of splitting a decode tile on sm_90 (split_plan.h), in DecodeBlockKeys
// blocks (also for fp8, whose kernel walks 128-key blocks: the planner counts 64-key ones, and
// the fp8 price below was chosen in those units): the partials and the last CTA's merge.
// H200, 256 keys, 1 split against 2, graph, us, batch 1 (1-16 alike): bf16 d64 7.35 / 8.49,
// d128 8.59 / 9.10, fp8 d128 8.97 / 9.72, all of batch 1-16 5-18 % faster whole; but d256
// (bf16 12.35 / 11.13, fp8 13.15 / 12.22) and fp8 d64 (10.55 / 9.18) split faster, their
// blocks costing more. Two blocks make 256 keys (4 blocks) a tie that stays whole at
// d <= 128, one lets d256 and fp8 d64 split.
constexpr int64_t DecodeSplitMergeBlocks(int head_dim, bool kv_fp8) {
  return head_dim >= 256 || (kv_fp8 && head_dim < 128) ? 1 : 2;
}
// CTAs an SM the split heuristic fills with decode tiles on sm_90 at head_dim 128 (3 fit).
// Decode streams K/V: two CTAs an SM keep enough copies in flight, and a third adds only its
// fixed cost (prologue, epilogue, a partial to merge). H200, same call each (us): 16 x 4096
// 3 -> 2 splits 73.3-73.9 -> 72.5-72.6, 16 x 1024 25.7 -> 24.0, 8 x 2048 6 -> 4 splits
// 25.7 -> 24.1, 4 x 32768 12 -> 8 137.2 -> 135.0, 2 x 16384 24 -> 16 41.8 -> 40.4, and
// batch 32 (256 tiles) no longer splits: 32 x 1024 50.4 -> 39.2, 32 x 8192 306.3 -> 265.8
// (32 splits, 8192 CTAs, before); 16 x 8192 and 16 x 32768 within noise (docs/perf_log.md).
inline constexpr int64_t kDecodeFillCtasPerSm = 2;
// The same bytes in flight at other head_dims: a CTA's blocks carry head_dim x 2 bytes a key,
// so 4 an SM at 64 (a cap: its 168-register shapes fit 3; 2 there cost 8 x 4096..32768 d64
// page 16 1.5-2 %, gained page 64 1-1.4 %) and 1 at 256 (where the K/V ring fits 2, filling 2
// an SM cost 1 x 8k..32k 3-4 points of copy bandwidth at 32 splits against 16; batch 5-33 plan
// by split_plan.h fill_wave_workers instead: H200, docs/perf_log.md).
constexpr int64_t DecodeFillCtasPerSm(int64_t head_dim) {
  const int64_t same_bytes = kDecodeFillCtasPerSm * 128 / head_dim;
  return same_bytes > 1 ? same_bytes : 1;
}
static_assert(DecodeFillCtasPerSm(64) == 4 && DecodeFillCtasPerSm(128) == 2 && DecodeFillCtasPerSm(256) == 1);

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_TILE_CONFIG_H_
