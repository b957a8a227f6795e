// The paged decode kernel for sm_90 (decode tiles: at most 16 query rows, one kv head's
// group): the same math and split protocol as AttentionKernel, with a cheaper way to stream
// K/V. ncu on the H200 showed AttentionKernel's decode tiles latency-bound on their own
// instruction stream (8 warps per SM, one issue every 2 cycles per scheduler, DRAM at 66 %):
// each thread issued 16 cp.async per 64-key block, each with a page-table read and 64-bit
// address arithmetic, and every block reloaded Q and rescaled the whole output accumulator.
// Here:
//  - K/V blocks reach shared memory by the copy engine, completing on the stage's mbarrier,
//    in one of two ways (kPageTma):
//    * tensor copies: one copy per (page run of a block, K or V, 64-column half) through a
//      tensor map of the cache (PagedKvMaps), 128-byte swizzled (an fp8 cache at head_dim 64:
//      whole 64-byte rows, 64-byte swizzled), so a 64-key block at page_size 16 is 16 copies
//      of 2 KiB. The copies fetch whole page runs, so rows outside the split's keys (a
//      page's tail past seq_len, anything, even NaN) arrive too: their logits are masked
//      and each warp zeroes its V rows there (0 * NaN would be NaN in P V);
//    * row copies (page_size < 8, or no tensor map): one thread per key row issues one
//      cp.async.bulk of the row; rows are padded by 16 bytes, so ldmatrix's 8 row addresses
//      fall in 8 different bank groups without a swizzle (a plain bulk copy cannot
//      swizzle); rows past the split's keys are zero-filled instead of copied.
//    Tensor copies cut the copy engine's requests 8x at page_size 16 (0-7 % faster on the
//    H200, docs/perf_log.md);
//  - Q's mma fragments stay in registers (head_dim <= 128);
//  - head_dim 256 with tensor copies streams K and V through a ring of 3 one-part buffers
//    (BulkDecodeShape::kKvRing): two CTAs an SM, so one CTA's start and end no longer leave
//    its SM without copies in flight (64 x 4096 d256 87-89 -> 98-99 % of copy on the H200);
//  - the running max is raised only when a block's max exceeds it by more than 2^8 in
//    probability, so most blocks skip rescaling the accumulator (the result is the same:
//    the sum and the output share whichever reference max was used); each row decides for
//    itself, so its bits do not depend on the tile's other rows (batch-invariant mode runs
//    every call of an sm_90 device here, tile_config.h InvariantTile).
//  - an fp8 (e4m3) cache (kFp8, head_dim 64, 128 or 256): tensor copies of the cache's bytes as
//    16-bit words (a row of head_dim bytes is head_dim / 2 words: half the bytes of a
//    16-bit cache per key, more stages in the same shared memory). The mma runs in float16
//    whatever q's dtype (every e4m3 value is a float16: exact): a bfloat16 q row is scaled by
//    a power of two into float16's range (exact down to 2^-29 of the row's largest element),
//    which the logit scale undoes with k_scale; v_scale multiplies the output rows. Each lane
//    reads its mma fragments' fp8 bytes straight from the staged block with 32-bit loads and
//    converts them in registers (cvt.rn.f16x2.e4m3x2), in an order of head_dim chosen so a
//    fragment's bytes are adjacent (Fp8Frags below). An earlier version converted each
//    warp's rows into a float16 buffer and read that with ldmatrix: the stores, reloads and
//    the warp's waits on them kept fp8 decode at 0.90-1.09x the bf16 call's time.
//  - batch-invariant calls at head_dim 64/128 over 16-bit K/V (kWgmmaOrder; the default
//    calls' tensor-copy grids at both head_dims take it too, attention_launch.cuh) reduce every row
//    in the wgmma prefill kernel's order instead: the whole 128-key block's S in every thread
//    in the wgmma accumulator layout (one k-step chain a column tile, a quarter of the tiles a
//    warp, their exponentials exchanged through shared memory), the prefill's softmax, a
//    quarter of head_dim a warp in P V, so a token gets the same bits from a decode as from a
//    prefill (see that path's comment).
// Needs compute capability 9.0 and 16-byte aligned rows (kv_vec); elsewhere the launcher
// runs AttentionKernel.
#ifndef SPLITKV_CUDA_DECODE_KERNEL_CUH_
#define SPLITKV_CUDA_DECODE_KERNEL_CUH_

#include <cstdint>
#include <type_traits>

#include "cc/splitkv/cuda/attention_kernel.cuh"
#include "cc/splitkv/cuda/block_softmax.cuh"
#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/cuda/kv_source.cuh"
#include "cc/splitkv/cuda/ptx.cuh"
#include "cc/splitkv/cuda/split_merge.cuh"
#include "cc/splitkv/cuda/tile_config.h"
#include "cc/splitkv/split_plan.h"

namespace splitkv::cuda {

// kKvRing false: a stage holds one block's K and V, kStages of them. kKvRing true: a stage
// holds one block's K or its V, kStages of them (odd: K and V take turns), each refilled as
// soon as the block part it held is consumed, so head_dim 256 keeps about two stages' bytes
// in flight in 3/4 of the memory and fits two CTAs an SM.
// kKeyRows (fp8 only, tiles of at most 8 rows): the mma's 16-row operand is K (S^T = K Q^T)
// and V^T (O^T = V^T P^T), the query rows its 8 columns; see the kernel's comment.
// kCtasPerSm: the CTAs an SM the register budget is sized for; 0 sizes it by shared memory
// (3 up to 74 KiB, 2 up to 110, else 1).
template <int kHeadDim_, int kBlockN_, int kStages_, bool kPageTma_, bool kKvRing_ = false, bool kFp8_ = false,
          bool kKeyRows_ = false, bool kWgmmaOrder_ = false, int kCtasPerSm_ = 0>
struct BulkDecodeShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kPageTma = kPageTma_;
  static constexpr bool kKvRing = kKvRing_;
  static constexpr bool kFp8 = kFp8_;
  static_assert(!kFp8 || (kPageTma && !kKvRing && kHeadDim % 64 == 0), "fp8: tensor copies of whole stages");
  static constexpr bool kKeyRows = kKeyRows_;
  static_assert(!kKeyRows || kFp8, "keys as rows: the fp8 fragments' layout");
  static constexpr int kKeyRowsMaxRows = 8;  // the mma's n: a keys-as-rows tile's query rows
  // kWgmmaOrder (16-bit K/V, tensor copies through the ring, 128-key blocks at head_dim <= 128):
  // every row reduces in the wgmma prefill kernel's order (prefill_sm90.cuh), so a token's
  // bits are the same from either kernel (see the kernel's comment).
  static constexpr bool kWgmmaOrder = kWgmmaOrder_;
  static_assert(!kWgmmaOrder || (!kFp8 && kKvRing && kBlockN == 128 && kHeadDim <= 128),
                "wgmma order: 16-bit K/V through the ring (tensor or row copies) in 128-key blocks");
  // Its ring also runs on row copies (pages under 8 slots, ragged K/V): one key row a thread.
  static_assert(!kWgmmaOrder || kPageTma || kBlockN == kThreads, "row copies: one row a thread a part");
  static constexpr int kSlots = kKvRing ? kStages : 2 * kStages;  // K-or-V block buffers
  // 16-bit words of a staged K or V row (an fp8 row of head_dim bytes is head_dim / 2).
  static constexpr int kStageCols = kFp8 ? kHeadDim / 2 : kHeadDim;
  // Tensor copies move rows in parts of 64 words (128 bytes, the 128-byte swizzle), or whole
  // 32-word rows (fp8 at head_dim 64: 64 bytes, the 64-byte swizzle): kHalves parts a row.
  static constexpr int kHalfCols = kStageCols < 64 ? kStageCols : 64;
  static constexpr int kRowBytes = kHalfCols * 2;  // of one staged row part
  static_assert(!kPageTma || kStageCols % 64 == 0 || (kFp8 && kStageCols == 32),
                "tensor copies move 64-column halves (fp8 head_dim 64: one 32-column row)");
  static_assert(!kKvRing || ((kPageTma || kWgmmaOrder_) && kStages >= 3),
                "the ring streams K and V in flight (tensor copies; row copies in wgmma order)");
  static constexpr int kHalves = kStageCols / kHalfCols;
  static constexpr int kWarpsN = kThreads / 32;  // every warp takes a slice of each block
  static constexpr int kRows = kDecodeRows;
  static constexpr int kKeysPerWarp = kBlockN / kWarpsN;
  static_assert(kKeysPerWarp % 16 == 0, "a warp's keys must be whole k-steps of 16");
  // One thread issues at most one copy per block: row copies, or tensor copies of boxes of at
  // least kMinBoxRows (8) slots.
  static_assert(kPageTma ? kBlockN / 8 * 2 * kHalves <= kThreads : (kKvRing ? kBlockN : 2 * kBlockN) <= kThreads,
                "one thread issues at most one copy per block (per part in the ring)");
  static constexpr int kRowElems = kHeadDim + 8;  // the pad moves each row by one bank group
  // K/V rows: padded (row copies), or [half][row][kHalfCols] swizzled (tensor copies).
  static constexpr int kKvRowElems = kPageTma ? kStageCols : kRowElems;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kSTiles = kKeysPerWarp / 8;
  // A lane's S (and P) fragments a block: n-tiles of 8 keys, or (kKeyRows) m-tiles of 16, and
  // its output accumulator tiles: 8 columns of head_dim, or (kKeyRows) 16 rows of it.
  static constexpr int kSFrags = kKeyRows ? kKeysPerWarp / 16 : kSTiles;
  static constexpr int kAccTiles = kKeyRows ? kHeadDim / 16 : kDTiles;
  // 256 would need 64 more registers (keys as rows: 32, Q is the mma's 8-column operand).
  static constexpr bool kQInRegisters = kHeadDim <= 128 || kKeyRows;
  static constexpr int kQElems = kRows * kRowElems;
  static constexpr int kKvElems = kBlockN * kKvRowElems;
  static constexpr int kOStride = kHeadDim + 8;
  // The stages come first, at a base aligned to the swizzle's 1024-byte atom (the slack is
  // allocated); Q follows them.
  static constexpr size_t kAlign = kPageTma ? 1024 : 16;
  // kWgmmaOrder by tensor copies (kSharedLogits): the block's probabilities, [kBlockN / 8
  // column tiles][32 lanes][4] floats after Q (each warp computes a quarter of the logits and
  // their exponentials; every warp reads them all). Row copies' padded stages leave no room for
  // them at two CTAs an SM: there every warp computes the whole block's logits and softmax (the
  // same values).
  static constexpr bool kSharedLogits = kWgmmaOrder && kPageTma;
  static constexpr size_t kLogitBytes = kSharedLogits ? size_t{kRows} * kBlockN * 4 : 0;
  static constexpr size_t kMainBytes = (size_t{kQElems} + size_t{kSlots} * kKvElems) * 2 + kLogitBytes + kAlign;
  static constexpr size_t kEpilogueBytes =
      (size_t{kWarpsN} * kRows * kOStride + size_t{kWarpsN} * kRows * 2) * 4 + kAlign;
  static constexpr size_t kSmemBytes = kMainBytes > kEpilogueBytes ? kMainBytes : kEpilogueBytes;
  // CTAs per SM the register budget is sized for (shared memory allows as many on sm_90).
  static constexpr int kMinBlocks =
      kCtasPerSm_ > 0 ? kCtasPerSm_ : kSmemBytes <= 74 * 1024 ? 3 : kSmemBytes <= 110 * 1024 ? 2 : 1;
  // An SM's 228 KiB hold kCtasPerSm CTAs' dynamic shared memory, each with the 1 KiB the
  // driver reserves a CTA and (a bound) 1 KiB of the kernel's static shared memory.
  static_assert(kCtasPerSm_ == 0 || size_t{kCtasPerSm_} * (kSmemBytes + 2048) <= 228 * 1024,
                "kCtasPerSm CTAs fit an SM's shared memory");
};

// The swizzle's XOR term of staged row `row`: the 16-byte chunk c of a 128-byte row sits at
// c ^ (row % 8); of a 64-byte row (the 64-byte swizzle XORs address bits 4-5 with 7-8) at
// c ^ ((row / 2) % 4).
template <class S>
__device__ __forceinline__ int RowSwizzle(int row) {
  return S::kRowBytes == 128 ? row & 7 : (row >> 1) & 3;
}

// Element offset of (key row `row`, 8-element chunk `chunk`) in a K or V block; row7 is
// row % 8 (the 128-byte swizzle's XOR term, which callers know without a division).
template <class S>
__device__ __forceinline__ int KvOffset(int row, int chunk, int row7) {
  if constexpr (S::kPageTma && S::kRowBytes == 64) {
    return row * 32 + ((chunk ^ RowSwizzle<S>(row)) << 3);
  } else if constexpr (S::kPageTma) {
    return (chunk >> 3) * (S::kBlockN * 64) + row * 64 + (((chunk & 7) ^ row7) << 3);
  } else {
    return row * S::kRowElems + chunk * 8;
  }
}

// fp8 mma fragments, read from a staged block (the fp8 bytes as the tensor copies left them,
// swizzled) and converted in registers. The mma's k index runs over head_dim in Q K^T and
// over keys in P V; a lane (g = lane / 4, t = lane % 4) holds k = 2t, 2t + 1 (b0) and
// 2t + 8, 2t + 9 (b1) of its column g. Any order of head_dim serves both products if Q,
// K and the output agree on it, so:
//  - Q K^T: k-step ks's k = 2t, 2t + 1, 2t + 8, 2t + 9 are head_dim 16 ks + 4t + 0..3, one
//    32-bit word of a key row (QFrag reads q's float16 row in the same order);
//  - P V: the keys are in order (P's fragments are S's accumulators), and output column
//    n of d-tile dt is head_dim 32 (dt / 4) + 4n + dt % 4: a lane's 4 key rows each give one
//    word (head_dim 32 q + 4g .. + 3) holding its b0 / b1 bytes for the 4 d-tiles 4q .. 4q + 3,
//    which byte permutes pair up across rows. StageFp8Rows writes the output columns back.
// Every load is conflict-free: the 128-byte swizzle spreads the 8 rows of a warp's load over
// all 32 banks. At head_dim 64 (64-byte rows, the 64-byte swizzle) a row's 16 words take half
// the banks, by the row's parity: K's 8 rows are 4 even and 4 odd, and for V, whose 4 rows a
// load are all even or all odd, the lanes reading chunks 2q + 1 (lane >= 16) swap each pair
// of rows 2t, 2t + 1 (VRow) and undo the swap in their byte permutes.
template <class S>
struct Fp8Frags {
  // Bytes of one column part (64 words, or a whole 32-word row) of a staged block.
  static constexpr uint32_t kHalfBytes = S::kBlockN * S::kRowBytes;
  static constexpr bool kSwapV = S::kRowBytes == 64;
  // K's ks % 8 / ks / 8 and V's (2q) % 8 / q / 4 below count 128-byte parts; 64-byte rows hold
  // head_dim 64's 4 k-steps (and 2 q) in one part, whose chunk XOR stays below 4.
  static_assert(S::kRowBytes == 128 || (S::kRowBytes == 64 && S::kHeadDim == 64), "fp8 rows: 128 or 64 bytes");
  // A staged row's 16-byte chunk c sits at chunk c ^ RowSwizzle(row) of its part, so the byte
  // offset of (row, chunk c, byte b < 16) is (row * kRowBytes | RowSwizzle(row) << 4 | b) ^
  // (c << 4): with a lane's row and byte fixed, each fragment's address is its lane base XOR a
  // constant.
  // K: key row `row`'s word of every k-step (ks at KBase ^ (ks % 8) << 4, + ks / 8 parts).
  static __device__ __forceinline__ uint32_t KBase(int row, int lane) {
    return row * S::kRowBytes | RowSwizzle<S>(row) << 4 | (lane & 3) * 4;
  }
  // The key row (of a 16-key k-step at `first`) that this lane's V load k (0..3) reads: rows
  // 2t, 2t + 1, 2t + 8, 2t + 9, the pairs swapped where kSwapV and lane >= 16.
  static __device__ __forceinline__ int VRow(int first, int k, int lane) {
    const int swap = kSwapV ? (lane >> 4) & 1 : 0;
    return first + 2 * (lane & 3) + ((k & 1) ^ swap) + 8 * (k >> 1);
  }
  // V: key row `row`'s word of head_dim 32 q + 4 (lane / 4) .. + 3 (chunk 2q + lane / 16) at
  // VBase ^ ((2q) % 8) << 4, + q / 4 parts.
  static __device__ __forceinline__ uint32_t VBase(int row, int lane) {
    return row * S::kRowBytes | (((lane >> 4) ^ RowSwizzle<S>(row)) << 4) | (lane & 12);
  }
  // b0 (low) and b1 (high) of k-step ks for the key row whose KBase (plus the block's shared
  // address) is `k_addr`.
  static __device__ __forceinline__ void K(uint32_t k_addr, int ks, uint32_t& b0, uint32_t& b1) {
    Fp8x4ToHalf2x2(LdShared32((k_addr ^ ((ks & 7) << 4)) + (ks >> 3) * kHalfBytes), b0, b1);
  }
  // b0[j], b1[j] of d-tile 4q + j from key rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1) of a
  // k-step, whose VBase (plus the block's shared address) are v_addr[0..3] (VRow's order: a
  // swapped lane's words of each pair arrive high row first, and its permutes take them so).
  static __device__ __forceinline__ void V(const uint32_t (&v_addr)[4], int q, int lane, uint32_t (&b0)[4],
                                           uint32_t (&b1)[4]) {
    const bool swap = kSwapV && (lane >> 4) != 0;
    const uint32_t lo = swap ? 0x1504u : 0x5140u, hi = swap ? 0x3726u : 0x7362u;
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = LdShared32((v_addr[k] ^ (((2 * q) & 7) << 4)) + (q >> 2) * kHalfBytes);
    Fp8x4ToHalf2x2(__byte_perm(w[0], w[1], lo), b0[0], b0[1]);
    Fp8x4ToHalf2x2(__byte_perm(w[0], w[1], hi), b0[2], b0[3]);
    Fp8x4ToHalf2x2(__byte_perm(w[2], w[3], lo), b1[0], b1[1]);
    Fp8x4ToHalf2x2(__byte_perm(w[2], w[3], hi), b1[2], b1[3]);
  }
  // Q's A fragment of k-step ks from float16 rows (row stride kRowElems) in the order above.
  static __device__ __forceinline__ void QFrag(const __half* s_q, int ks, int lane, uint32_t (&a)[4]) {
    const __half* row = s_q + (lane >> 2) * S::kRowElems + ks * 16 + (lane & 3) * 4;
    const uint2 lo = *reinterpret_cast<const uint2*>(row);
    const uint2 hi = *reinterpret_cast<const uint2*>(row + 8 * S::kRowElems);
    a[0] = lo.x, a[1] = hi.x, a[2] = lo.y, a[3] = hi.y;
  }
  // Keys as rows: Q^T's B fragment of k-step ks (q row lane / 4), the same head_dim order.
  static __device__ __forceinline__ void QFragT(const __half* s_q, int ks, int lane, uint32_t (&b)[2]) {
    const uint2 lo = *reinterpret_cast<const uint2*>(s_q + (lane >> 2) * S::kRowElems + ks * 16 + (lane & 3) * 4);
    b[0] = lo.x, b[1] = lo.y;
  }
};

// StageWarpRows for the fp8 output order: a lane's d-tiles 4q .. 4q + 3 hold head_dim
// 32 q + 8t .. + 7 of its rows (Fp8Frags), written as two float4 each.
template <int kDTiles, int kOStride>
__device__ __forceinline__ void StageFp8Rows(float* s_o, float* s_ml, int row_base, const float (&acc)[kDTiles][4],
                                             const float (&row_max)[2], const float (&row_sum)[2]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row_base + lane / 4 + 8 * i;
    float* dst = s_o + r * kOStride + (lane & 3) * 8;
#pragma unroll
    for (int q = 0; q < kDTiles / 4; ++q) {
      const float(&a0)[4] = acc[4 * q], (&a1)[4] = acc[4 * q + 1], (&a2)[4] = acc[4 * q + 2], (&a3)[4] = acc[4 * q + 3];
      *reinterpret_cast<float4*>(dst + 32 * q) = make_float4(a0[2 * i], a1[2 * i], a2[2 * i], a3[2 * i]);
      *reinterpret_cast<float4*>(dst + 32 * q + 4) =
          make_float4(a0[2 * i + 1], a1[2 * i + 1], a2[2 * i + 1], a3[2 * i + 1]);
    }
    if ((lane & 3) == 0) s_ml[2 * r] = row_max[i], s_ml[2 * r + 1] = row_sum[i];
  }
}

// StageFp8Rows for keys as rows: accumulator tile 2q + jj holds, for query row 2t + e (t =
// lane % 4), head_dim 32 q + 4 (lane / 4) + 2 jj (element e) and + 1 (element 2 + e), so a
// lane's 4 adjacent columns 32 q + 4 (lane / 4) .. + 3 are one float4; the quad's 8 lanes
// of a row hold its parts, and lane t (lane / 4 == 0) writes its max and sum.
template <int kAccTiles, int kOStride>
__device__ __forceinline__ void StageFp8KeyRows(float* s_o, float* s_ml, int row_base,
                                                const float (&acc)[kAccTiles][4], const float (&row_max)[2],
                                                const float (&row_sum)[2]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = row_base + 2 * (lane & 3) + e;
    float* dst = s_o + r * kOStride + (lane >> 2) * 4;
#pragma unroll
    for (int q = 0; q < kAccTiles / 2; ++q) {
      *reinterpret_cast<float4*>(dst + 32 * q) =
          make_float4(acc[2 * q][e], acc[2 * q][2 + e], acc[2 * q + 1][e], acc[2 * q + 1][2 + e]);
    }
    if ((lane >> 2) == 0) s_ml[2 * r] = row_max[e], s_ml[2 * r + 1] = row_sum[e];
  }
}

// KvSourceT: PagedKvSource, or RaggedKvSource (row copies only: batch-invariant ragged calls
// run this kernel so that a token's bits match its paged decode's, tile_config.h).
template <typename T, class S, template <typename> class KvSourceT = PagedKvSource>
__global__ void __launch_bounds__(kThreads, S::kMinBlocks)
    BulkDecodeKernel(const AttentionKernelParams p, const typename KvSourceT<T>::Params kv_params,
                     const __grid_constant__ PagedKvMaps maps) {
  static_assert(!S::kPageTma || std::is_same_v<KvSourceT<T>, PagedKvSource<T>>,
                "tensor copies read a paged cache's tensor maps");
  constexpr int D = S::kHeadDim;
  constexpr int RS = S::kRowElems;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ uint64_t stage_full[S::kStages];
  // The aligned base as smem_raw plus an offset, not through an integer: a pointer derived
  // from a __shared__ array keeps its state space, so the compiler emits shared loads and
  // stores (ld.shared: a few cycles) for every access through it, where a pointer made from
  // an integer gets generic ones (the softmax's probability exchange ran on LD.E.128, a
  // long-scoreboard wait each block; H200 ncu, docs/perf_log.md 2026-12-04 session 33).
  unsigned char* const smem =
      smem_raw + ((S::kAlign - (SharedAddress(smem_raw) & (S::kAlign - 1))) & (S::kAlign - 1));
  // Buffer i at i * kKvElems: stage st's K at 2 * st and V at 2 * st + 1, or (ring) part p
  // of the stream (block p / 2's K when p is even, its V when odd) at p % kStages.
  T* const s_kv = reinterpret_cast<T*>(smem);
  // What the mma multiplies: float16 over an fp8 cache (exact), else T.
  using M = std::conditional_t<S::kFp8, __half, T>;
  M* const s_q = reinterpret_cast<M*>(s_kv + S::kSlots * S::kKvElems);
  [[maybe_unused]] float* const s_logits = reinterpret_cast<float*>(s_q + S::kQElems);  // kWgmmaOrder
  __shared__ float s_q_scale[S::kFp8 ? S::kRows : 1];
  [[maybe_unused]] __shared__ float s_block_max[S::kSharedLogits ? S::kWarpsN * S::kRows : 1];  // kSharedLogits

  // Thread 0 sets up the barriers and fetches the tensor maps (no global memory: they may
  // run before GridDependencyWait); the CTA-wide barrier publishing them comes after the
  // seq_lens read is issued.
  if (threadIdx.x == 0) {
    if constexpr (S::kPageTma) PrefetchTensorMap(&maps.k), PrefetchTensorMap(&maps.v);
#pragma unroll
    for (int st = 0; st < S::kStages; ++st) MbarrierInit(&stage_full[st], 1);
    FenceMbarrierInit();
  }
  GridDependencyWait();  // before the first global access (ptx.cuh)
  TileQueries tq;
  if (!TileQueriesOf(p, tq)) return;
  const int split_idx = blockIdx.y;
  const int q_tile = tq.q_tile, kv_head = tq.kv_head, request = tq.request;
  const int q_begin = tq.q_begin, q_len = tq.q_len, first = tq.first, num_tokens = tq.num_tokens;
  // Tensor copies fetch whole boxes of box_rows slots, so blocks start on a box boundary
  // (keys below key_begin are masked like the rest).
  const int box_rows = S::kPageTma ? maps.box_rows : 1;
  // Block `block` into stage `stage`. The page id a copying thread needs for block b is read
  // one load earlier (during block b - 1's wait and math), so the copy is issued without
  // waiting for the page table.
  //  - tensor copies: copy c < boxes * 2 * kHalves fetches box c / (2 * kHalves) of the
  //    block (box_rows slots of one page), K or V (c % 2), half (c / 2) % kHalves; boxes
  //    wholly at or past key_end are not fetched (their page ids may be anything). Copy c
  //    is issued by lane c / kWarpsN of warp c % kWarpsN, so every warp carries the same
  //    issue work into the block's barrier.
  //  - row copies: thread t copies key row t % kBlockN of K (t < kBlockN) or V. Rows at or
  //    past key_end are zeros, so nothing outside the split's range (a page tail, a page past
  //    seq_len) can reach a result.
  const int boxes = S::kBlockN / box_rows;
  const int copy = (threadIdx.x % 32) * S::kWarpsN + threadIdx.x / 32;
  const int copy_row = S::kPageTma ? copy / (2 * S::kHalves) * box_rows : threadIdx.x % S::kBlockN;
  const bool copy_v = S::kPageTma ? (copy & 1) != 0 : threadIdx.x >= S::kBlockN;
  const int copy_half = S::kPageTma ? (copy >> 1) % S::kHalves : 0;
  const bool copier = S::kPageTma ? copy < boxes * 2 * S::kHalves : threadIdx.x < 2 * S::kBlockN;
  const KvSourceT<std::conditional_t<S::kFp8, Fp8E4M3, T>> kv(kv_params, request, kv_head);
  __syncthreads();
  const int kv_len = kv.kv_len;
  // Splits are cut in whole boxes (tensor copies) or 16 keys, not whole blocks: a split's
  // last block may be short, and the longest split is up to a block shorter (1 x 32k at 31
  // splits: 1072 keys, not 1088; 16 x 4096 at 3: 1376, not 1408).
  const SplitKeys split_keys = SplitKeysOf(p, tq, kv_len, S::kBlockN, S::kPageTma ? box_rows : 16);
  const int key_begin = split_keys.begin, key_end = split_keys.end;
  const int64_t q_start = QueryStart(p, request, q_len, kv_len);
  const int loop_begin = S::kPageTma ? key_begin & ~(box_rows - 1) : key_begin;
  const int num_blocks = !S::kPageTma         ? split_keys.num_blocks
                         : key_end > key_begin ? (key_end - loop_begin + S::kBlockN - 1) / S::kBlockN
                                               : 0;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int token_begin = q_begin + first;
  const int tile_rows = num_tokens * p.group_size;  // <= kRows for decode tiles
  const float sm_scale = p.sm_scale, cap = p.logits_soft_cap;
  auto page_for = [&](int block) {
    const int j = loop_begin + block * S::kBlockN + copy_row;
    return copier && block < num_blocks && j < key_end ? kv.PageOf(j) : 0;
  };
  int next_page = page_for(0);
  // K/V are read once a launch: first out of L2, so they do not push out what is read again
  // (the partials the merging CTAs fetch, the page table, the kernel's code). On the H200:
  // 1 x 32k 44.9 -> 43.1 us, 16 x 8192 137.4 -> 136.0, 64 x 4096 265.4 -> 263.8.
  const uint64_t kv_policy = S::kPageTma ? EvictFirstPolicy() : 0;
  // Boxes a block's copies fetch: all of them but in the split's last block, whose boxes wholly
  // at or past key_end are skipped. Worked out once here, not per part: the division in the
  // copy path put thread 0 (and with it warp 0) behind the other warps before two of the
  // block's barriers (perf_log, session 41).
  const int last_fetched =
      S::kPageTma && num_blocks > 0
          ? min(boxes, (key_end - (loop_begin + (num_blocks - 1) * S::kBlockN) + box_rows - 1) / box_rows)
          : 0;
  // Tensor copies of block `block`'s K (which 1), V (2) or both (3) into buffer `buf` (K; V
  // in the next buffer when both), completing on `bar`. A thread copies K or V only, so its
  // next page id is always its next block's.
  auto copy_tiles = [&](int block, int which, int buf, uint64_t* bar) {
    const int j0 = loop_begin + block * S::kBlockN;
    const int fetched = block + 1 < num_blocks ? boxes : last_fetched;
    const int num_parts = which == 3 ? 2 : 1;
    if (threadIdx.x == 0) MbarrierArriveExpectTx(bar, fetched * num_parts * S::kHalves * box_rows * S::kRowBytes);
    if (!copier || (which & (copy_v ? 2 : 1)) == 0) return;
    const int page = next_page;
    next_page = page_for(block + 1);
    if (j0 + copy_row >= key_end) return;
    const int slot = (j0 + copy_row) & kv.slot_mask;
    const CUtensorMap* map = copy_v ? &maps.v : &maps.k;
    T* dst = s_kv + (buf + (which == 3 && copy_v)) * S::kKvElems + copy_half * (S::kBlockN * S::kHalfCols) +
             copy_row * S::kHalfCols;
    if (maps.slot_inner) {
      TensorCopy4dToShared(dst, map, bar, copy_half * S::kHalfCols, slot, kv_head, page, kv_policy);
    } else {
      TensorCopy4dToShared(dst, map, bar, copy_half * S::kHalfCols, kv_head, slot, page, kv_policy);
    }
  };
  // Ring: part p of the stream into buffer p % kStages, if its block exists. Row copies (the
  // wgmma-order shape only): thread t copies key row t of the block's K or V; rows at or past
  // key_end are zeros, as in load_kv, and so are rows below the tile's first visible key (an
  // invariant split starts on a block boundary below it, where the page table may name pages
  // the caller no longer holds, e.g. below a sliding window: they are never dereferenced).
  // The wgmma-order path zeroes V rows below it after tensor copies too.
  [[maybe_unused]] const int copy_lo = max(key_begin, split_keys.tile_lo);
  // The ring's reading side: part p's buffer, and the wait for its copy (the p / kStages-th
  // fill of buffer p % kStages) to land.
  [[maybe_unused]] auto ring_buffer = [&](int part) { return s_kv + (part % S::kStages) * S::kKvElems; };
  [[maybe_unused]] auto wait_ring_part = [&](int part) {
    MbarrierWait(&stage_full[part % S::kStages], (part / S::kStages) & 1);
  };
  auto load_part = [&](int part) {
    if (part / 2 >= num_blocks) return;
    const int buf = part % S::kStages;
    if constexpr (S::kPageTma) {
      copy_tiles(part / 2, 1 + (part & 1), buf, &stage_full[buf]);
    } else if constexpr (S::kKvRing) {
      const int j0 = loop_begin + part / 2 * S::kBlockN;
      const int valid = min(S::kBlockN, key_end - j0);
      const int skip = min(valid, max(0, copy_lo - j0));  // rows [skip, valid) are copied
      if (threadIdx.x == 0) MbarrierArriveExpectTx(&stage_full[buf], (valid - skip) * D * sizeof(T));
      T* const dst = s_kv + buf * S::kKvElems + threadIdx.x * RS;
      if (static_cast<int>(threadIdx.x) < valid && static_cast<int>(threadIdx.x) >= skip) {
        const T* key;
        const T* value;
        kv.RowsInPage(kv.PageOf(j0 + threadIdx.x), j0 + threadIdx.x, key, value);
        BulkCopyToShared(dst, (part & 1) ? value : key, D * sizeof(T), &stage_full[buf]);
      } else {
#pragma unroll
        for (int c = 0; c < D / 8; ++c) ZeroChunk(dst + c * 8);
        FenceProxyAsyncShared();  // the copy engine rewrites these bytes in a later round
      }
    }
  };
  auto load_kv = [&](int block, int stage) {
    if constexpr (S::kPageTma) {
      copy_tiles(block, 3, 2 * stage, &stage_full[stage]);
    } else {
      const int j0 = loop_begin + block * S::kBlockN;
      const int page = next_page;
      next_page = page_for(block + 1);
      T* const stage_kv = s_kv + (2 * stage + copy_v) * S::kKvElems;
      const int valid = min(S::kBlockN, key_end - j0);
      if (threadIdx.x == 0) MbarrierArriveExpectTx(&stage_full[stage], valid * 2 * D * sizeof(T));
      if (!copier) return;
      T* dst = stage_kv + copy_row * RS;
      if (copy_row < valid) {
        const T* key;
        const T* value;
        kv.RowsInPage(page, j0 + copy_row, key, value);
        BulkCopyToShared(dst, copy_v ? value : key, D * sizeof(T), &stage_full[stage]);
      } else {
#pragma unroll
        for (int c = 0; c < D / 8; ++c) ZeroChunk(dst + c * 8);
        FenceProxyAsyncShared();  // the copy engine rewrites these bytes in a later round
      }
    }
  };
  if constexpr (S::kKvRing) {
#pragma unroll
    for (int part = 0; part < S::kStages; ++part) load_part(part);
  } else {
#pragma unroll
    for (int b = 0; b < S::kStages - 1; ++b) {
      if (b < num_blocks) load_kv(b, b);
    }
  }

  // Q (tile_rows rows; zeros below) while the first blocks are in flight.
  {
    constexpr int kChunks = D / 8;
    for (int i = threadIdx.x; i < S::kRows * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      T* dst = reinterpret_cast<T*>(s_q) + r * RS + c * 8;
      if (r < tile_rows) {
        const RowTarget at = TileRowTarget(p, token_begin, kv_head, r);
        const T* src = static_cast<const T*>(p.q) + at.token * p.q_stride_token + at.head * p.q_stride_head + c * 8;
        if (p.q_vec) {
          *reinterpret_cast<uint4*>(dst) = LoadInput(reinterpret_cast<const uint4*>(src));
        } else {
          CopyChunk(dst, src, false);
        }
      } else {
        ZeroChunk(dst);
      }
    }
  }
  __syncthreads();
  // fp8: Q rows to float16 in place, a bfloat16 row scaled by 2^e so its largest element is
  // in [2^14, 2^15) (the logits undo it: s_q_scale).
  if constexpr (S::kFp8) {
    for (int r = warp; r < S::kRows; r += S::kWarpsN) {
      float scale = 1.0f;
      if constexpr (!std::is_same_v<T, __half>) {
        const T* row = reinterpret_cast<const T*>(s_q) + r * RS;
        float m = 0.0f;
        for (int c = lane; c < D; c += 32) m = fmaxf(m, fabsf(__bfloat162float(row[c])));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (m > 0.0f && m <= 3.0e38f) {
          int e = 0;
          frexpf(m, &e);  // m = f 2^e, f in [0.5, 1)
          scale = __int_as_float((127 + min(15 - e, 120)) << 23);  // 2^(15 - e), exactly
        }
        for (int c = lane * 2; c < D; c += 64) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + c));
          *reinterpret_cast<uint32_t*>(s_q + r * RS + c) = PackPair<__half>(f.x * scale, f.y * scale);
        }
      }
      if (lane == 0) s_q_scale[r] = scale;
    }
    __syncthreads();
  }

  // Q's A fragment of k-step ks (fp8: in Fp8Frags' order of head_dim).
  auto load_q_frag = [&](int ks, uint32_t(&a)[4]) {
    if constexpr (S::kFp8) {
      Fp8Frags<S>::QFrag(s_q, ks, lane, a);
    } else {
      LdMatrixX4(a, s_q + ((lane & 7) + ((lane >> 3) & 1) * 8) * RS + ks * 16 + (lane >> 4) * 8);
    }
  };
  uint32_t q_frag[S::kQInRegisters ? S::kKSteps : 1][S::kKeyRows ? 2 : 4];
  if constexpr (S::kKeyRows) {
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) Fp8Frags<S>::QFragT(s_q, ks, lane, q_frag[ks]);
  } else if constexpr (S::kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) load_q_frag(ks, q_frag[ks]);
  }

  // A lane's two query rows (i = 0, 1), and which row element e of an mma accumulator (S's or
  // the output's) belongs to, and its key within a warp's slice of a block for S's fragment
  // n: rows lane / 4 and + 8 (accumulator rows), or, keys as rows, 2 (lane % 4) and + 1
  // (accumulator columns).
  const auto lane_row = [&](int i) { return S::kKeyRows ? 2 * (lane & 3) + i : lane / 4 + 8 * i; };
  constexpr auto row_of = [](int e) { return S::kKeyRows ? e & 1 : e >> 1; };
  const auto key_of = [&](int n, int e) {
    return S::kKeyRows ? n * 16 + (lane >> 2) + 8 * (e >> 1) : n * 8 + (lane & 3) * 2 + (e & 1);
  };
  // The lanes holding parts of one query row: a quad, or (keys as rows) the 8 lanes of lane % 4.
  const auto row_reduce_max = [](float m) {
    if constexpr (S::kKeyRows) {
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    } else {
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    }
    return m;
  };

  int row_lo[2], row_hi[2];
  bool row_valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = lane_row(i);
    row_valid[i] = r < tile_rows;
    row_lo[i] = row_hi[i] = 0;
    if (row_valid[i]) {
      VisibleKeys(p, q_start, kv_len, first + r / p.group_size, row_lo[i], row_hi[i]);
      row_lo[i] = max(row_lo[i], key_begin);
      row_hi[i] = max(row_lo[i], min(row_hi[i], key_end));
    }
  }

  // Each row's logit scale: sm_scale; with an fp8 cache also the kv head's k_scale over the q
  // row's scale (the output's v_scale is applied where the rows are written).
  float row_scale[2] = {sm_scale, sm_scale};
  float v_scale = 1.0f;
  if constexpr (S::kFp8) {
    const float k_scale = KvHeadScale(true, p.k_scale, p.k_scales, kv_head);
    v_scale = KvHeadScale(true, p.v_scale, p.v_scales, kv_head);
#pragma unroll
    for (int i = 0; i < 2; ++i) row_scale[i] = sm_scale * k_scale / s_q_scale[lane_row(i)];
  }

  if constexpr (S::kWgmmaOrder) {
    // ---- every row in the wgmma prefill kernel's order (batch-invariant calls, and default
    // ones routed here: attention_launch.cuh) ----
    // tools/gpu/mma_bits_probe.cu showed an mma.sync k-step chain and a wgmma one giving the
    // same fp32 bits element by element on the H200. So this path repeats, per row, exactly
    // the float work of prefill_sm90.cuh's consumers: every thread holds S for the whole
    // 128-key block, each column tile from one chain of k-steps (the accumulator layout of
    // thread (g, t) is then that of a wgmma thread: columns 8 c + 2 t, + 1 of rows g, g + 8;
    // the warps compute a quarter of the tiles each), runs the prefill's softmax on it (the max
    // over raw logits, exp2 of one FMA, four sum chains, the same rescale: with shared logits
    // each warp exponentiates its quarter and the probabilities are exchanged), and takes a
    // quarter of head_dim in P V, 8 k-steps in key order onto its columns. Every warp holds
    // the same row max and sum; none is merged across warps.
    constexpr int kSRegs = S::kBlockN / 2;           // 64: S of 16 rows x 128 keys a lane
    constexpr int kPSteps = S::kBlockN / 16;         // 8 k-steps of P V
    constexpr int kWarpDTiles = S::kDTiles / S::kWarpsN;  // this warp's d-tiles
    static_assert(kWarpDTiles % 2 == 0, "ldmatrix.trans loads d-tiles in pairs");
    const int dt0 = warp * kWarpDTiles;
    const SoftmaxScales scales(sm_scale, cap);
    float row_max[2] = {SPLITKV_NEG_INF, SPLITKV_NEG_INF};  // log2 units
    float row_sum[2] = {0.0f, 0.0f};                        // this thread's share
    float acc[kWarpDTiles][4];
#pragma unroll
    for (int d = 0; d < kWarpDTiles; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;
    const int k_row = (lane & 7) + (lane >> 4) * 8, k_bit = (lane >> 3) & 1;
    const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_bit = lane >> 4;
    const int row7 = lane & 7;
    // S's 16-key column pairs np0 .. np0 + kPairs - 1 of the K part at s_k into dst (8 floats a
    // pair): one chain a column tile, k-steps in order (the wgmma kernel's issue_s).
    auto s_pairs = [&](auto pairs, const T* s_k, int np0, float* dst) {
      constexpr int kPairs = decltype(pairs)::value;
#pragma unroll
      for (int e = 0; e < kPairs * 8; ++e) dst[e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
#pragma unroll
        for (int u = 0; u < kPairs; ++u) {
          uint32_t b[4];
          LdMatrixX4(b, s_k + KvOffset<S>(k_row + (np0 + u) * 16, ks * 2 + k_bit, row7));
          Mma16816<T>(*reinterpret_cast<float(*)[4]>(dst + 8 * u), q_frag[ks], b[0], b[1]);
          Mma16816<T>(*reinterpret_cast<float(*)[4]>(dst + 8 * u + 4), q_frag[ks], b[2], b[3]);
        }
      }
    };
    // kSharedLogits: warp w's slice of a block, column tiles 4w .. 4w + 3 (keys 32w .. 32w + 31).
    constexpr int kWarpNPairs = S::kBlockN / 16 / S::kWarpsN;  // 16-key column pairs a warp
    constexpr int kWarpRegs = kWarpNPairs * 8;
    // kSharedLogits: the warp's slice of S one block ahead. Block b + 1's S is computed beside
    // block b's P V, so the two dependent HMMA chains overlap instead of following each other
    // (one CTA an SM walks its split's blocks one after another: this chain is the grid's
    // time; docs/perf_log.md session 41). Each row's operations and their order are those of
    // S then P V block by block: the bits do not change.
    float s_ahead[S::kSharedLogits ? kWarpRegs : 1];
    if constexpr (S::kSharedLogits) {
      if (num_blocks > 0) {
        wait_ring_part(0);
        s_pairs(std::integral_constant<int, kWarpNPairs>{}, ring_buffer(0), warp * kWarpNPairs, s_ahead);
      }
      __syncthreads();  // every warp has read block 0's K: its buffer takes the stream's next part
      load_part(S::kStages);
    }
    for (int block = 0; block < num_blocks; ++block) {
      const int j0 = loop_begin + block * S::kBlockN;
      const int part_k = 2 * block, part_v = 2 * block + 1;
      T* const s_v = ring_buffer(part_v);
      // kSharedLogits: warp w computes column tiles 4w .. 4w + 3 (keys 32w .. 32w + 31), the
      // same chains on the same operands as a thread computing the whole block, and takes
      // BlockSoftmax's steps that need no other keys on them: the scale and mask, its max (the
      // maxima of the four warps' slices give the block's: max is exact in any order), and the
      // exponentials. The probabilities go through shared memory, where every thread reads the
      // whole block's back for BlockSoftmax's sum chains (which run over the block's keys in
      // order) and the P V operand. A warp exponentiates 32 keys, not 128 (H200: docs/
      // perf_log.md 2026-12-04). Otherwise every warp computes the whole block's logits and
      // softmax (the same values).
      float s[kSRegs];
      float alpha[2];
      if constexpr (S::kSharedLogits) {
        float sw[kWarpRegs];
#pragma unroll
        for (int e = 0; e < kWarpRegs; ++e) sw[e] = s_ahead[e];
        PrepareLogits(sw, j0 + warp * 2 * kWarpRegs, lane, scales, row_valid, row_lo, row_hi);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float m = SPLITKV_NEG_INF;
#pragma unroll
          for (int c = 0; c < kWarpRegs / 4; ++c) m = fmaxf(m, fmaxf(sw[4 * c + 2 * i], sw[4 * c + 2 * i + 1]));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          if ((lane & 3) == 0) s_block_max[warp * S::kRows + lane_row(i)] = m;
        }
        __syncthreads();  // every warp has stored its slice's maxima
        float m_ref[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float m = s_block_max[lane_row(i)];
#pragma unroll
          for (int w = 1; w < S::kWarpsN; ++w) m = fmaxf(m, s_block_max[w * S::kRows + lane_row(i)]);
          m_ref[i] = UpdateRowMax(m, scales, row_max[i], alpha[i]);
        }
#pragma unroll
        for (int e = 0; e < kWarpRegs; ++e) sw[e] = ExpLogit(sw[e], scales, m_ref[(e >> 1) & 1]);  // s[4 c + 2 i + e]
#pragma unroll
        for (int c = 0; c < kWarpRegs / 4; ++c) {
          *reinterpret_cast<float4*>(s_logits + ((warp * kWarpRegs / 4 + c) * 32 + lane) * 4) =
              make_float4(sw[4 * c], sw[4 * c + 1], sw[4 * c + 2], sw[4 * c + 3]);
        }
        __syncthreads();  // every warp's probabilities are stored
#pragma unroll
        for (int c = 0; c < kSRegs / 4; ++c) {
          const float4 v = *reinterpret_cast<const float4*>(s_logits + (c * 32 + lane) * 4);
          s[4 * c] = v.x, s[4 * c + 1] = v.y, s[4 * c + 2] = v.z, s[4 * c + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) row_sum[i] = AddBlockSum(s, i, alpha[i], row_sum[i]);
      } else {
        wait_ring_part(part_k);
        s_pairs(std::integral_constant<int, S::kBlockN / 16>{}, ring_buffer(part_k), 0, s);
        __syncthreads();  // every warp has read K: its buffer takes the stream's next part
        load_part(part_k + S::kStages);
        // The prefill's softmax (block_softmax.cuh), the same function.
        BlockSoftmax<kSRegs, S::kBlockN>(s, j0, lane, scales, row_valid, row_lo, row_hi, row_max, row_sum, alpha);
      }

      uint32_t a[kPSteps][4];
      PackProbabilities<T>(s, a);
      // The output so far times alpha plus +0, then P V onto it (the prefill's operations; its
      // first block skips the product, whose accumulator is +0 and stays +0 here).
#pragma unroll
      for (int d = 0; d < kWarpDTiles; ++d) {
        acc[d][0] = fmaf(acc[d][0], alpha[0], 0.0f), acc[d][1] = fmaf(acc[d][1], alpha[0], 0.0f);
        acc[d][2] = fmaf(acc[d][2], alpha[1], 0.0f), acc[d][3] = fmaf(acc[d][3], alpha[1], 0.0f);
      }
      wait_ring_part(part_v);
      // V rows that no row of the tile sees become zeros: tensor copies fetch whole boxes (a
      // page's tail, anything), and the split starts on a block boundary below the tile's
      // first key (pages there may hold anything, as in the wgmma kernel's contract). Each
      // warp zeroes a quarter of the block's rows for every warp to read (CTA-uniform).
      if (j0 < copy_lo || j0 + S::kBlockN > key_end) {
        constexpr int kChunks = S::kStageCols / 8;
        const int r0 = warp * S::kKeysPerWarp;
        for (int i = lane; i < S::kKeysPerWarp * kChunks; i += 32) {
          const int r = r0 + i / kChunks, c = i % kChunks;
          if (j0 + r < copy_lo || j0 + r >= key_end) ZeroChunk(s_v + KvOffset<S>(r, c, r & 7));
        }
        FenceProxyAsyncShared();  // the copy engine rewrites these bytes in a later round
        __syncthreads();
      }
      if constexpr (S::kSharedLogits) {
        // The next block's K: issued at the end of the previous block (three parts), or a
        // block earlier (four, the grids of one CTA an SM: attention_launch.cuh). After the
        // split's last block the slice is computed from whatever the buffer holds (no copy is
        // in flight into it) and never used: one straight sequence lets the compiler
        // interleave the two chains.
        const int next_k = part_k + 2;
        if (block + 1 < num_blocks) wait_ring_part(next_k);
        s_pairs(std::integral_constant<int, kWarpNPairs>{}, ring_buffer(next_k), warp * kWarpNPairs, s_ahead);
      }
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
        for (int dp = 0; dp < kWarpDTiles / 2; ++dp) {
          uint32_t b[4];
          LdMatrixX4Trans(b, s_v + KvOffset<S>(v_row + kk * 16, (dt0 / 2 + dp) * 2 + v_bit, row7));
          Mma16816<T>(acc[2 * dp], a[kk], b[0], b[1]);
          Mma16816<T>(acc[2 * dp + 1], a[kk], b[2], b[3]);
        }
      }
      __syncthreads();  // every warp has read V (and, kSharedLogits, the next block's K)
      load_part(part_v + S::kStages);
      if constexpr (S::kSharedLogits) load_part(part_k + 2 + S::kStages);
    }
    const uint32_t ticket = p.num_splits > 1 ? CountSplitIn(p, request, kv_head, q_tile) : 0u;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
    }
    if (num_blocks == 0) __syncthreads();  // every warp is past the loop (whose last barrier does this)
    // Rows as [kRows][kOStride] floats: each warp its columns, warp 0 the natural-log max and
    // the sum (WriteRowResult's units, as the prefill's epilogue converts them).
    float* const s_o = reinterpret_cast<float*>(smem);
    float* const s_ml = s_o + S::kRows * S::kOStride;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = lane / 4 + 8 * i;
#pragma unroll
      for (int d = 0; d < kWarpDTiles; ++d) {
        *reinterpret_cast<float2*>(s_o + r * S::kOStride + (dt0 + d) * 8 + (lane & 3) * 2) =
            make_float2(acc[d][2 * i], acc[d][2 * i + 1]);
      }
      if (warp == 0 && (lane & 3) == 0) s_ml[2 * r] = __fmul_rn(row_max[i], kLn2), s_ml[2 * r + 1] = row_sum[i];
    }
    __syncthreads();
    constexpr int kElems = D / 32;
    for (int r = warp; r < tile_rows; r += kThreads / 32) {
      float o[kElems];
      LoadFloats<kElems, false>(o, s_o + r * S::kOStride + lane * kElems);
      WriteRowResult<T, D>(p, TileRowTarget(p, token_begin, kv_head, r), split_idx, o, s_ml[2 * r], s_ml[2 * r + 1]);
    }
    if (p.num_splits > 1) {
      ArriveAndMerge<T, D>(p, request, kv_head, q_tile, token_begin, tile_rows, ticket, reinterpret_cast<float*>(smem),
                           static_cast<int32_t>(S::kSmemBytes - S::kAlign));
    }
  } else {
  // fp8 tiles keep their logits in log2 units (log2(e) folded into the row scale, a capped
  // logit c tanh(x / c) becomes c' tanh(x' / c') with c' = c log2(e)) and exponentiate with
  // FastExp2: per 128-key block this saves each warp the 8 multiplies by log2(e) and the
  // subnormal guard exp2f puts around every MUFU (3 instructions an exponential), where the
  // fp8 tiles are bound by issue rather than by the DRAM. 16-bit tiles keep natural units
  // and exp2f: batch-invariant head_dim 256 decodes run them and must give the mma.sync
  // kernel's bits (fp8 calls never run here batch-invariant: tile_config.h InvariantTile).
  constexpr bool kLog2Logits = S::kFp8;
  if constexpr (kLog2Logits) row_scale[0] *= kLog2e, row_scale[1] *= kLog2e;
  const float logit_cap = kLog2Logits ? cap * kLog2e : cap;
  float row_max[2] = {SPLITKV_NEG_INF, SPLITKV_NEG_INF};  // log2 units when kLog2Logits
  float row_sum[2] = {0.0f, 0.0f};
  float acc[S::kAccTiles][4];
#pragma unroll
  for (int d = 0; d < S::kAccTiles; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

  const int key0 = warp * S::kKeysPerWarp;  // this warp's first key within a block
  // Lane parts of the ldmatrix addresses: the key row and the chunk's low bit (rows are
  // key0 + lane % 8 + multiples of 8, so row % 8 is lane % 8).
  const int k_row = key0 + (lane & 7) + (lane >> 4) * 8, k_bit = (lane >> 3) & 1;
  const int v_row = key0 + (lane & 7) + ((lane >> 3) & 1) * 8, v_bit = lane >> 4;
  const int row7 = lane & 7;
  // fp8: this lane's Fp8Frags bases in a staged block: K's key rows key0 + 8n + lane / 4, V's
  // rows 2t, 2t + 1, 2t + 8, 2t + 9 of each 16-key k-step.
  [[maybe_unused]] uint32_t fp8_k_base[S::kFp8 ? S::kSTiles : 1];
  [[maybe_unused]] uint32_t fp8_v_base[S::kFp8 ? S::kKeysPerWarp / 16 : 1][4];
  if constexpr (S::kFp8) {
#pragma unroll
    for (int n = 0; n < S::kSTiles; ++n) fp8_k_base[n] = Fp8Frags<S>::KBase(key0 + n * 8 + (lane >> 2), lane);
#pragma unroll
    for (int kk = 0; kk < S::kKeysPerWarp / 16; ++kk) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        fp8_v_base[kk][k] = Fp8Frags<S>::VBase(Fp8Frags<S>::VRow(key0 + kk * 16, k, lane), lane);
      }
    }
  }

  // Tensor copies fetch whole boxes: this warp's V rows outside the split become zeros (fp8:
  // their bytes; an fp8 zero is a float16 zero).
  auto zero_v_outside = [&](T* s_v, int j_warp) {
    if constexpr (S::kPageTma) {
      if (j_warp < key_begin || j_warp + S::kKeysPerWarp > key_end) {  // warp-uniform
        constexpr int kChunks = S::kStageCols / 8;  // of a staged row (fp8: head_dim / 16)
        for (int i = lane; i < S::kKeysPerWarp * kChunks; i += 32) {
          const int r = i / kChunks, c = i % kChunks;
          if (j_warp + r < key_begin || j_warp + r >= key_end) ZeroChunk(s_v + KvOffset<S>(key0 + r, c, r & 7));
        }
        FenceProxyAsyncShared();  // the copy engine rewrites these bytes in a later round
        __syncwarp();
      }
    }
  };

  for (int block = 0; block < num_blocks; ++block) {
    const int j_warp = loop_begin + block * S::kBlockN + key0;
    const int part_k = 2 * block, part_v = 2 * block + 1;  // the ring's parts of this block
    const M* s_k;
    M* s_v;
    if constexpr (S::kKvRing) {
      s_k = ring_buffer(part_k);
      s_v = ring_buffer(part_v);
      wait_ring_part(part_k);
    } else {
      // The stage refilled here was last read in iteration block - 1, which ended in a barrier.
      const int ahead = block + S::kStages - 1;
      if (ahead < num_blocks) load_kv(ahead, ahead % S::kStages);
      const int stage = block % S::kStages;
      MbarrierWait(&stage_full[stage], (block / S::kStages) & 1);
      T* const stage_v = s_kv + (2 * stage + 1) * S::kKvElems;
      s_k = reinterpret_cast<const M*>(s_kv + 2 * stage * S::kKvElems);  // fp8: its bytes (Fp8Frags)
      s_v = reinterpret_cast<M*>(stage_v);
      zero_v_outside(stage_v, j_warp);
    }

    // S = Q K^T over kKSteps k-steps, in two accumulator chains (even and odd steps) so
    // consecutive mma.sync do not wait on each other's results.
    float s[S::kSFrags][4], s_odd[S::kSFrags][4];
#pragma unroll
    for (int n = 0; n < S::kSFrags; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      s_odd[n][0] = s_odd[n][1] = s_odd[n][2] = s_odd[n][3] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) {
      float(&acc_s)[S::kSFrags][4] = ks % 2 == 0 ? s : s_odd;
      if constexpr (S::kKeyRows) {
        // S^T's m-tile n: K rows key0 + 16 n + lane / 4 (a0, a2) and + 8 (a1, a3), Q^T's columns.
#pragma unroll
        for (int n = 0; n < S::kSFrags; ++n) {
          uint32_t a[4];
          Fp8Frags<S>::K(SharedAddress(s_k) + fp8_k_base[2 * n], ks, a[0], a[2]);
          Fp8Frags<S>::K(SharedAddress(s_k) + fp8_k_base[2 * n + 1], ks, a[1], a[3]);
          Mma16816<M>(acc_s[n], a, q_frag[ks][0], q_frag[ks][1]);
        }
      } else {
        uint32_t a_smem[4];
        if constexpr (!S::kQInRegisters) {
          load_q_frag(ks, a_smem);
        }
        const uint32_t(&a)[4] = S::kQInRegisters ? q_frag[S::kQInRegisters ? ks : 0] : a_smem;
        if constexpr (S::kFp8) {
#pragma unroll
          for (int n = 0; n < S::kSTiles; ++n) {
            uint32_t b0, b1;
            Fp8Frags<S>::K(SharedAddress(s_k) + fp8_k_base[n], ks, b0, b1);
            Mma16816<M>(acc_s[n], a, b0, b1);
          }
        } else {
#pragma unroll
          for (int np = 0; np < S::kSTiles / 2; ++np) {
            uint32_t b[4];
            LdMatrixX4(b, s_k + KvOffset<S>(k_row + np * 16, ks * 2 + k_bit, row7));
            Mma16816<M>(acc_s[2 * np], a, b[0], b[1]);
            Mma16816<M>(acc_s[2 * np + 1], a, b[2], b[3]);
          }
        }
      }
    }
    if constexpr (S::kKvRing) {
      __syncthreads();  // every warp has read K: its buffer takes the stream's next part
      load_part(part_k + S::kStages);
    }
#pragma unroll
    for (int n = 0; n < S::kSFrags; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] += s_odd[n][e];
    }

    // One branch a block for the soft cap (inside the loop it was one an element: 8 compares
    // and branches a block with the cap off); the same float work either way.
    if (logit_cap > 0.0f) {
#pragma unroll
      for (int n = 0; n < S::kSFrags; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float x = s[n][e] * row_scale[row_of(e)];
          s[n][e] = logit_cap * tanhf(x / logit_cap);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < S::kSFrags; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= row_scale[row_of(e)];
      }
    }
    bool partial = false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      partial |= row_valid[i] && !(row_lo[i] <= j_warp && j_warp + S::kKeysPerWarp <= row_hi[i]);
    }
    if (__any_sync(0xffffffffu, partial)) {
#pragma unroll
      for (int n = 0; n < S::kSFrags; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = j_warp + key_of(n, e);
          const int i = row_of(e);
          if (j < row_lo[i] || j >= row_hi[i]) s[n][e] = SPLITKV_NEG_INF;
        }
      }
    }

    // Online softmax with a lazily raised max (natural-log max; exp2 with log2(e) folded in).
    // Each row decides for itself (the lanes holding a row agree: they hold the same block
    // max), so a row's bits never depend on the tile's other rows (batch invariance:
    // a token decoded alone and inside a prefill chunk meets other neighbours).
    float block_max[2];
    bool raise[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float m = SPLITKV_NEG_INF;
#pragma unroll
      for (int n = 0; n < S::kSFrags; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (row_of(e) == i) m = fmaxf(m, s[n][e]);
        }
      }
      m = row_reduce_max(m);
      block_max[i] = m;
      const float rise_log2 = kLog2Logits ? m - row_max[i] : (m - row_max[i]) * kLog2e;
      raise[i] = m != SPLITKV_NEG_INF && (row_max[i] == SPLITKV_NEG_INF || rise_log2 > kLazyRescaleLog2);
    }
    if (__any_sync(0xffffffffu, raise[0] || raise[1])) {  // most blocks skip this whole branch
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (!raise[i]) continue;
        const float m = fmaxf(row_max[i], block_max[i]);
        const float m_ref = m == SPLITKV_NEG_INF ? 0.0f : m;
        const float alpha = kLog2Logits ? FastExp2(row_max[i] - m_ref) : exp2f((row_max[i] - m_ref) * kLog2e);
        row_max[i] = m;
        row_sum[i] *= alpha;
#pragma unroll
        for (int d = 0; d < S::kAccTiles; ++d) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (row_of(e) == i) acc[d][e] *= alpha;
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float m_ref = row_max[i] == SPLITKV_NEG_INF ? 0.0f : row_max[i];
      const float m_log2 = kLog2Logits ? m_ref : m_ref * kLog2e;
#pragma unroll
      for (int n = 0; n < S::kSFrags; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (row_of(e) != i) continue;
          // Rounded before the subtraction, like m_log2 (no fused multiply-add): the row's
          // largest logit then gets exactly exp2(0) = 1, so a dominant key's v row comes out exact.
          const float pr = kLog2Logits ? FastExp2(s[n][e] - m_log2) : exp2f(__fmul_rn(s[n][e], kLog2e) - m_log2);
          s[n][e] = pr;
          row_sum[i] += pr;
        }
      }
    }

    if constexpr (S::kKvRing) {
      wait_ring_part(part_v);
      zero_v_outside(s_v, j_warp);
    }
#pragma unroll
    for (int kk = 0; kk < S::kKeysPerWarp / 16; ++kk) {
      if constexpr (S::kKeyRows) {
        // O^T += V^T P^T over the k-step's 16 keys: P^T's B fragment is S^T's m-tile kk
        // transposed in registers (keys g, g + 8 of query rows 2t, 2t + 1 -> keys 2t, 2t + 1
        // and + 8, + 9 of query row g); V^T's A fragments are Fp8Frags::V's b0 / b1 pairs,
        // whose d-tiles 4q + 2jj and + 1 become an m-tile's rows g and g + 8 (StageFp8KeyRows).
        const uint32_t p0 = MovMatrixTrans(PackPair<M>(s[kk][0], s[kk][1]));
        const uint32_t p1 = MovMatrixTrans(PackPair<M>(s[kk][2], s[kk][3]));
        uint32_t v_addr[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v_addr[k] = SharedAddress(s_v) + fp8_v_base[kk][k];
#pragma unroll
        for (int q = 0; q < S::kDTiles / 4; ++q) {
          uint32_t b0[4], b1[4];
          Fp8Frags<S>::V(v_addr, q, lane, b0, b1);
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const uint32_t a[4] = {b0[2 * jj], b0[2 * jj + 1], b1[2 * jj], b1[2 * jj + 1]};
            Mma16816<M>(acc[2 * q + jj], a, p0, p1);
          }
        }
      } else {
        const uint32_t a[4] = {PackPair<M>(s[2 * kk][0], s[2 * kk][1]), PackPair<M>(s[2 * kk][2], s[2 * kk][3]),
                               PackPair<M>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               PackPair<M>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        if constexpr (S::kFp8) {
#pragma unroll
          for (int q = 0; q < S::kDTiles / 4; ++q) {
            uint32_t b0[4], b1[4];
            uint32_t v_addr[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) v_addr[k] = SharedAddress(s_v) + fp8_v_base[kk][k];
            Fp8Frags<S>::V(v_addr, q, lane, b0, b1);
#pragma unroll
            for (int j = 0; j < 4; ++j) Mma16816<M>(acc[4 * q + j], a, b0[j], b1[j]);
          }
        } else {
#pragma unroll
          for (int dp = 0; dp < S::kDTiles / 2; ++dp) {
            uint32_t b[4];
            LdMatrixX4Trans(b, s_v + KvOffset<S>(v_row + kk * 16, dp * 2 + v_bit, row7));
            Mma16816<M>(acc[2 * dp], a, b[0], b[1]);
            Mma16816<M>(acc[2 * dp + 1], a, b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // the stage is overwritten by the next iteration's prefetch
    if constexpr (S::kKvRing) load_part(part_v + S::kStages);
  }
  const uint32_t ticket = p.num_splits > 1 ? CountSplitIn(p, request, kv_head, q_tile) : 0u;

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if constexpr (S::kKeyRows) {
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], o);
    } else {
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
    }
  }
  // Every copy has landed (each block was waited for) and every warp has left the loop (its
  // last iteration ended in a barrier): shared memory is free. A split with no key block
  // skipped the loop, so its Q fragment reads above still need a barrier before s_o
  // overwrites them (num_blocks is the same for the whole CTA; racecheck found this).
  if (num_blocks == 0) __syncthreads();
  float* const s_o = reinterpret_cast<float*>(smem);
  float* const s_ml = s_o + S::kWarpsN * S::kRows * S::kOStride;
  if constexpr (kLog2Logits) {  // the staged max is in natural units (MergeWarpSlices, the partials)
#pragma unroll
    for (int i = 0; i < 2; ++i) row_max[i] = __fmul_rn(row_max[i], kLn2);
  }
  if constexpr (S::kKeyRows) {
    StageFp8KeyRows<S::kAccTiles, S::kOStride>(s_o, s_ml, warp * S::kRows, acc, row_max, row_sum);
  } else if constexpr (S::kFp8) {
    StageFp8Rows<S::kDTiles, S::kOStride>(s_o, s_ml, warp * S::kRows, acc, row_max, row_sum);
  } else {
    StageWarpRows<S::kDTiles, S::kOStride>(s_o, s_ml, warp * S::kRows, acc, row_max, row_sum);
  }
  __syncthreads();

  constexpr int kElems = D / 32;
  for (int r = warp; r < tile_rows; r += kThreads / 32) {
    float o[kElems], m, l;
    MergeWarpSlices<kElems, S::kWarpsN, S::kRows, S::kOStride>(s_o, s_ml, r, o, m, l);
    if constexpr (S::kFp8) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) o[e] *= v_scale;
    }
    WriteRowResult<T, D>(p, TileRowTarget(p, token_begin, kv_head, r), split_idx, o, m, l);
  }

  // The stages and Q are free now: the tile's merge may use them.
  if (p.num_splits > 1) {
    ArriveAndMerge<T, D>(p, request, kv_head, q_tile, token_begin, tile_rows, ticket, reinterpret_cast<float*>(smem),
                         static_cast<int32_t>(S::kSmemBytes - S::kAlign));
  }
  }  // kWgmmaOrder
}

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_DECODE_KERNEL_CUH_
