// How the CUDA kernels cut work, shared by Traits() (which the planner sizes the counter
// index space with) and the launch code, so both always agree on q_tile_tokens.
//
// A CTA is 4 warps. Its query rows pack (query tokens x qo heads of one kv head's group), so a
// GQA decode step reads each KV block once for the whole group:
//   decode tiles:  16 rows (1 warp of rows); the 4 warps split each 64-key block in 4.
//   prefill tiles: 64 rows (4 warps of 16 rows); every warp sees the whole key block.
// Paged calls use decode tiles when a tile's rows (max_q_len x group) fit in 16, else prefill
// tiles; ragged calls always use prefill tiles (with the same q_tile_tokens).
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

constexpr TileChoice ChooseTile(int64_t group_size, int64_t max_q_len) {
  const int64_t q = max_q_len > 0 ? max_q_len : 1;
  if (group_size * q <= kDecodeRows) return {TileKind::kDecode, kDecodeRows / group_size};
  // A group wider than 64 rows still gets one token per tile; the CTA loops over row chunks.
  return {TileKind::kPrefill, group_size >= kPrefillRows ? 1 : kPrefillRows / group_size};
}

// Keys per block of the main loop (the split granularity too).
constexpr int DecodeBlockKeys(int head_dim) { return 64; }
constexpr int PrefillBlockKeys(int head_dim) { return head_dim >= 256 ? 32 : 64; }
// Decode tiles only stream K/V, so they keep two blocks in flight where shared memory allows
// (head_dim 256 at three stages would exceed sm_80's 163 KiB per CTA).
constexpr int DecodeStages(int head_dim) { return head_dim >= 256 ? 2 : 3; }
// The sm_90 bulk-copy decode kernel (decode_kernel.cuh): 3 stages (2 CTAs an SM at d 128).
// 2 stages fit 3 CTAs an SM and ran split grids ~4 % faster on the H200, but 64 x 4096
// (512 tiles) then runs 1.3 waves unsplit and lost 10 %: the planner does not weigh that.
constexpr int BulkDecodeStages(int head_dim) { return head_dim >= 256 ? 2 : 3; }

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_TILE_CONFIG_H_
