// Prefill on Hopper (sm_90a): wgmma + TMA, one split (num_splits == 1), head_dim 64, 128 or
// 256, K/V ragged (packed rows) or in a paged cache (kPaged). Batch-invariant calls
// (kInvariant, head_dim 64/128) start blocks on absolute multiples of 128 keys and run all
// of a tile's invariant splits in its one CTA, merging them as the split CTAs of a decode
// would (see the consumers' comment), so their rows match the decode kernel's wgmma-order
// path bit for bit. K/V are 16-bit: an fp8 cache's call reads a 16-bit copy of its stored
// values (prefill_sm90.h), and the kernel applies its k_scale and v_scale.
//
// A CTA is three warpgroups. Warpgroup 0 is the producer: one thread (paged K/V at small
// pages: four warps) loads the query tile once and streams 128-key K and V blocks (64-key at
// head_dim 256, whose output accumulator takes 128 registers a thread) through a two-stage
// ring (three at head_dim 64) by TMA (128-byte swizzled, completing on mbarriers), and gives
// its registers to the consumers (setmaxnreg). Warpgroups 1 and 2 (and 3 at head_dim 64:
// PrefillSm90Consumers) each own 64 of the tile's 128 (192) query rows: S = Q K^T on wgmma
// with both operands in shared memory, the online softmax in registers (the max over the raw
// logits, raised lazily at head_dim 256 outside batch-invariant calls, then exp2 of one fused
// multiply-add a logit with the scale and log2(e) folded in), then O += P V with P from
// registers and V read transposed (MN-major) from shared memory. Inside a warpgroup, S of
// block b + 1 and P V of block b are issued together, and the source runs block b + 1's
// softmax before waiting for P V; but at head_dim 64 and 128 ptxas hoists that wait above the
// softmax (the SASS, docs/perf_log.md 2026-12-05 session 41), so there the softmax runs after
// P V lands. At head_dim <= 128 the consumer warpgroups also take turns issuing (ping-pong),
// so the others' softmax overlaps one's products. A stage is handed back to the producer (its "empty"
// barrier) as soon as the wgmma that read it has completed.
//
// Rows pack (tokens x the kv head's group of qo heads) as in the mma.sync kernel, so a GQA
// group shares every K/V block; the query tile is one TMA box {64 columns, group heads,
// 128 / group tokens} per 64-column half. Masking (causal aligned to the end of the KV,
// sliding window, the tile's key range) is applied to S by select, so a NaN logit of a
// masked key never survives. TMA fills rows past the tensor with zeros, but the last block's
// rows past the tile's keys are real rows: the request's later keys or the next request's.
// A masked key's P is exactly 0, yet 0 * NaN is NaN in P V, so the producer warp zeroes
// those V rows in shared memory before the consumers' last P V reads them: one request's
// data never reaches another's output, as in the mma.sync kernel (which zero-fills them).
// Query rows past the request are computed but never stored. Each warp writes its 16 output
// rows into its own rows of the spent Q tile and stores them 16 bytes a lane (the epilogue).
//
// Paged K/V (kPaged): a block is kBlockN / box_rows boxes of box_rows slots of one page (the
// cache's 4-D maps, tensor_map.h PagedKvMaps), each half of each box one tensor copy issued
// by its own lane of a producer warp (one warp, or four where a block is more than 8 copies
// a tensor: see the producer), the lane's page id read from block_tables one block ahead;
// all complete on the stage's barrier, which expects the bytes of the boxes fetched.
// Blocks start on a box boundary below the tile's first key (the keys before it are the
// request's own, masked like any other). Boxes wholly at or past the tile's last key are not
// fetched (their page ids may be anything), so their shared memory holds a previous block's
// bytes, and the fetched last box carries the page's tail, whatever the cache holds there:
// K rows past the keys are masked in S, and the V rows are zeroed as above. Query positions
// follow kv_offsets / full_seq_lens (QueryStart) when the call passes them.
#ifndef SPLITKV_CUDA_PREFILL_SM90_CUH_
#define SPLITKV_CUDA_PREFILL_SM90_CUH_

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cc/splitkv/cuda/attention_kernel.cuh"  // QueryStart, VisibleKeys
#include "cc/splitkv/cuda/block_softmax.cuh"
#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/cuda/ptx.cuh"
#include "cc/splitkv/cuda/split_merge.cuh"  // kLog2e, kLn2, SPLITKV_NEG_INF
#include "cc/splitkv/cuda/wgmma.cuh"

namespace splitkv::cuda {

// Keys per K/V block. At head_dim 256 the output takes 128 registers a consumer thread, so
// S and P of a 64-key block (32 + 16) are what fits beside it under 240. The host encodes the
// K/V tensor maps with boxes of this many rows.
constexpr int PrefillSm90BlockKeys(int head_dim) { return head_dim == 256 ? 64 : 128; }

// Consumer warpgroups of a CTA (64 query rows each): three at head_dim 64, whose products are
// half of head_dim 128's while the softmax is the same size, so two consumers' softmax run
// while the third's products hold the tensor cores (as FlashAttention-3 tiles head_dim 64:
// 192 rows); two elsewhere. Batch-invariant instances follow the same rule (a row's bits do
// not depend on its tile). A call whose group does not divide the 192-row tile runs the
// two-consumer one.
constexpr int PrefillSm90Consumers(int head_dim) { return head_dim == 64 ? 3 : 2; }

template <int kHeadDimT, int kConsumersT = 2>
struct PrefillSm90Shape {
  static constexpr int kConsumers = kConsumersT;
  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumers
  static constexpr int kRows = 64 * kConsumers;            // query rows per CTA
  static constexpr int kConsumerThreads = 128 * kConsumers;
  // setmaxnreg budgets: 65536 registers an SM over the CTA (FlashAttention-3's split).
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "one CTA's registers");
  static constexpr int kHeadDim = kHeadDimT;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "wgmma prefill: head_dim 64, 128 or 256");
  static constexpr int kBlockN = PrefillSm90BlockKeys(kHeadDim);
  // head_dim 64 halves the work per block, so a third stage hides more of the TMA latency
  // (shared memory allows it: 112 KiB).
  static constexpr int kStages = kHeadDim == 64 ? 3 : 2;
  // A tile is head_dim / 64 column halves ([rows][128 bytes] each, 128-byte swizzled): the
  // swizzle spans at most 128 bytes of a row.
  static constexpr int kHalves = kHeadDim / 64;
  static constexpr int kKSteps = kHeadDim / 16;  // of S = Q K^T
  static constexpr int kSRegs = kBlockN / 2;     // S (64 x kBlockN) per consumer thread
  static constexpr int kPSteps = kBlockN / 16;   // k-steps of P V
  static constexpr int kOutRegs = kHeadDim / 2;  // O (64 x head_dim) per consumer thread
  static constexpr uint32_t kQHalfBytes = kRows * 64 * 2;
  static constexpr uint32_t kKvHalfBytes = kBlockN * 64 * 2;
  static constexpr uint32_t kQTileBytes = kHalves * kQHalfBytes;
  static constexpr uint32_t kKvTileBytes = kHalves * kKvHalfBytes;
  static constexpr uint32_t kQOffset = 0;
  static constexpr uint32_t kKOffset = kQOffset + kQTileBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKvTileBytes;
  static constexpr uint32_t kBarrierOffset = kVOffset + kStages * kKvTileBytes;
  static constexpr int kNumBarriers = 3 + 4 * kStages;  // + q_full, v_tail, v_head
  // + 1024: the dynamic shared memory base is aligned up to the swizzle atom in the kernel.
  static constexpr size_t kSmemBytes = kBarrierOffset + kNumBarriers * 8 + 1024;
  // Batch-invariant instances: each consumer thread's merged output rows (SplitFold), after
  // the barriers: [kOutRegs / 4][kConsumerThreads] float4s, a thread's accumulator
  // registers 4 c .. 4 c + 3 side by side (16-byte accesses, a warp's 512 bytes contiguous).
  static constexpr uint32_t kFoldOffset = (kBarrierOffset + kNumBarriers * 8 + 15) / 16 * 16;
  static constexpr size_t kFoldBytes = size_t{kOutRegs} * kConsumerThreads * 4;
  static constexpr size_t kInvariantSmemBytes = kSmemBytes + kFoldBytes;
  static constexpr int kConsumerWarps = 4 * kConsumers;
  // The consumers take turns issuing their wgmmas (see the kernel) at head_dim <= 128, where
  // the softmax is a larger share of a block's work; FlashAttention-3 makes the same choice.
  static constexpr bool kPingPong = kHeadDim <= 128;
  static_assert(kSmemBytes <= 227 * 1024, "one CTA's shared memory on sm_90");
  static_assert(kHeadDim > 128 || kInvariantSmemBytes <= 227 * 1024, "the batch-invariant fold fits beside");
};

struct PrefillSm90Params {
  AttentionKernelParams p;  // q/out/lse, strides, group, masking options (num_splits == 1, or
                            // a batch-invariant plan's split count)
  const int32_t* cu_seqlens_kv = nullptr;  // ragged K/V
  // Paged K/V: block_tables, block_tables_stride, seq_lens and page_size_log2 (the cache's
  // pointers and strides are in the maps); the maps' box rows (a power of two dividing
  // kBlockN) and dimension order (PagedKvMaps).
  PagedKvParams paged;
  int32_t box_rows = 0;
  bool slot_inner = true;
  int32_t q_tile_tokens = 1;  // the shape's kRows / group_size
  int32_t num_q_tiles = 1;    // per (request, kv head)
};


// kInvariant: a batch-invariant call (p.invariant_split_keys > 0), its own instance so the
// default one carries none of its split handling (which cost the default prefill 1-2 % on
// the H200 when compiled into it).
template <typename T, int kHeadDim, bool kPaged, bool kInvariant, int kConsumers>
__global__ void __launch_bounds__(PrefillSm90Shape<kHeadDim, kConsumers>::kThreads, 1)
    PrefillSm90Kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v, const PrefillSm90Params params) {
#if SPLITKV_SM90_DEVICE
  using namespace sm90;
  using S = PrefillSm90Shape<kHeadDim, kConsumers>;
  const AttentionKernelParams& p = params.p;

  GridDependencyWait();  // before the first global access (ptx.cuh)
  // Same walk as the mma.sync kernel: (request, kv head) outer, q tiles last-first inside,
  // so CTAs running together share one head's K/V in L2 and the longest tiles start first.
  const int tile = blockIdx.x;
  const int q_tile = params.num_q_tiles - 1 - tile % params.num_q_tiles;
  const int kv_head = tile / params.num_q_tiles % p.num_kv_heads;
  const int request = tile / params.num_q_tiles / p.num_kv_heads;
  const int q_begin = LoadInput(p.cu_seqlens_q + request);
  const int q_len = LoadInput(p.cu_seqlens_q + request + 1) - q_begin;
  const int first = q_tile * params.q_tile_tokens;
  if (first >= q_len) return;  // uniform: before any barrier
  const int num_tokens = min(params.q_tile_tokens, q_len - first);
  int kv_begin = 0, kv_len;  // kv_begin: the request's first row of ragged k/v
  if constexpr (kPaged) {
    kv_len = LoadInput(params.paged.seq_lens + request);
  } else {
    kv_begin = LoadInput(params.cu_seqlens_kv + request);
    kv_len = LoadInput(params.cu_seqlens_kv + request + 1) - kv_begin;
  }
  const int group = p.group_size;
  const int64_t q_start = QueryStart(p, request, q_len, kv_len);  // query 0's key position

  // The tile's keys: rows' ranges only grow with the token, and the rows that see a key are
  // a suffix (causal: pos >= 0) or all of them, so the first such row and the last bound it.
  int key_begin = 0, key_end = 0;
  {
    const int last = first + num_tokens - 1;
    const int64_t t0 = p.causal ? max(int64_t{first}, -q_start) : first;
    if (kv_len > 0 && t0 <= last) {
      int lo0, hi0, lo1, hi1;
      VisibleKeys(p, q_start, kv_len, static_cast<int>(t0), lo0, hi0);
      VisibleKeys(p, q_start, kv_len, last, lo1, hi1);
      key_begin = lo0;
      key_end = max(lo0, hi1);
    }
  }
  // Blocks start at block_base: the tile's first key, or (paged) the box boundary below it;
  // batch-invariant calls, the multiple of kBlockN below it, so every row meets its blocks at
  // the same absolute keys as in a decode (split_plan.h InvariantSplitKeyRange).
  static_assert(!kInvariant || kHeadDim <= 128, "batch-invariant calls: head_dim 64 or 128 (128-key blocks)");
  // Batch-invariant instances: splits of kInvariantSplitKeys keys, a compile-time power of
  // two (Serves() declines a plan of any other size), so the kernel's split arithmetic has
  // no integer division.
  static_assert((kInvariantSplitKeys & (kInvariantSplitKeys - 1)) == 0, "a power of two");
  constexpr int split_keys = kInvariant ? static_cast<int>(kInvariantSplitKeys) : 1;
  const int block_base = kInvariant ? key_begin & ~(S::kBlockN - 1)
                         : kPaged       ? key_begin & ~(params.box_rows - 1)
                                        : key_begin;
  const int num_blocks = key_end > key_begin ? (key_end - block_base + S::kBlockN - 1) / S::kBlockN : 0;

  extern __shared__ unsigned char smem_raw[];
  // Aligned up to 1024 bytes by an offset from smem_raw (not through an integer), so the
  // compiler still knows the pointer is shared memory: C++ accesses through it (the fold
  // rows, zeroed V rows) compile to LDS/STS, not generic LD/ST.
  unsigned char* const smem = smem_raw + ((1024u - (SharedAddress(smem_raw) & 1023u)) & 1023u);
  uint64_t* const bars = reinterpret_cast<uint64_t*>(smem + S::kBarrierOffset);
  uint64_t* const q_full = bars;
  uint64_t* const k_full = bars + 1;
  uint64_t* const v_full = k_full + S::kStages;
  uint64_t* const k_empty = v_full + S::kStages;
  uint64_t* const v_empty = k_empty + S::kStages;
  uint64_t* const v_tail = v_empty + S::kStages;  // the last V block's tail rows are zero
  uint64_t* const v_head = v_tail + 1;            // the first V block's head rows are zero
  // Keys of the last block that this tile must not read: [key_end, block end).
  const int tail_keep = key_end - block_base - (num_blocks - 1) * S::kBlockN;  // rows kept
  const bool tail = num_blocks > 0 && tail_keep < S::kBlockN;
  // And of the first block (paged only): [block_base, key_begin), keys that no row of the
  // tile sees, whose V rows may hold anything as in the mma.sync kernel's contract. Ragged
  // rows there (batch-invariant calls only) are the request's own keys, masked like the rest.
  const int head_skip = key_begin - block_base;
  const bool head = kPaged && num_blocks > 0 && head_skip > 0;
  // Zeroes V rows [row_begin, row_end) of `stage` once the block in it has landed (its v_full
  // phase `parity`), then arrives on `done` (32 arrivals: the producer warp). Whole 128-byte
  // rows: the swizzle permutes 16-byte chunks inside a row only.
  auto zero_v_rows = [&](int stage, uint32_t parity, int row_begin, int row_end, uint64_t* done) {
    __syncwarp();
    MbarrierWait(v_full + stage, parity);
    unsigned char* const v_tile = smem + S::kVOffset + stage * S::kKvTileBytes;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (uint32_t c = row_begin * 8 + threadIdx.x % 32; c < static_cast<uint32_t>(row_end) * 8; c += 32) {
#pragma unroll
      for (int h = 0; h < S::kHalves; ++h) *reinterpret_cast<uint4*>(v_tile + h * S::kKvHalfBytes + c * 16) = zero;
    }
    FenceProxyAsyncShared();  // the wgmma (async proxy) reads these bytes next
    MbarrierArrive(done);
  };

  // Paged blocks of more than 8 tensor copies each for K and V (page 16 at head_dim 128 or
  // 256) are copied by four producer warps, two a K (V) stage; others by one (see the producer).
  const bool four_copiers = kPaged && S::kBlockN / params.box_rows * S::kHalves > 8;
  const int fill_warps = four_copiers ? 2 : 1;  // arrivals on a K (V) stage's "full" barrier
  if (threadIdx.x == 0) {
    MbarrierInit(q_full, 1);
#pragma unroll
    for (int s = 0; s < S::kStages; ++s) {
      MbarrierInit(k_full + s, fill_warps);
      MbarrierInit(v_full + s, fill_warps);
      MbarrierInit(k_empty + s, S::kConsumerWarps);
      MbarrierInit(v_empty + s, S::kConsumerWarps);
    }
    MbarrierInit(v_tail, 32);
    MbarrierInit(v_head, 32);
    FenceMbarrierInit();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ---- producer ----
    RegDealloc<S::kProducerRegs>();
    if (threadIdx.x >= (four_copiers ? 128 : 32)) return;  // warp 0 produces, or warps 0-3
    const int lane = threadIdx.x % 32, producer_warp = threadIdx.x / 32;
    const int v_warp = four_copiers ? 1 : 0;  // copies V: zeroes the rows no row may see
    if (threadIdx.x == 0) {
      PrefetchTensorMap(&tm_q);
      PrefetchTensorMap(&tm_k);
      PrefetchTensorMap(&tm_v);
      MbarrierArriveExpectTx(q_full, S::kQTileBytes);
#pragma unroll
      for (int h = 0; h < S::kHalves; ++h) {
        TensorCopy3dToShared(smem + S::kQOffset + h * S::kQHalfBytes, &tm_q, q_full, h * 64, kv_head * group,
                             q_begin + first);
      }
    }
    if constexpr (kPaged) {
      // A block at small pages is many tensor copies (page 16, head_dim 128: 16 of K and 16 of
      // V), and a copy whose coordinates differ across a warp's lanes is issued one lane at a
      // time (the copy instruction takes warp-uniform operands): one warp issuing them all held
      // the consumers back (paged / ragged 0.73 at page 16 on the H200, 0.87-0.96 with four:
      // docs/perf_log.md 2026-12-04). So with four_copiers, warps 0 and 2 copy K, 1 and 3 V,
      // each on its own scheduler and asleep in its waits (kMbarrierSleepNs), warp w the
      // boxes of parity w / 2; otherwise warp 0 copies K, then V. Lane l of a copier takes half
      // l % kHalves of its (l / kHalves)-th box (at most 32 copies a warp: box_rows >= 8, so
      // kBlockN / 8 * kHalves <= 32), and each copier's lane 0 arrives on the stage's barrier
      // expecting its own boxes' bytes. The two ways are compiled apart: the producer holds 24
      // registers, and one loop for both spilled.
      auto produce = [&](auto four_tag) {
        constexpr bool kFour = decltype(four_tag)::value;
        constexpr int kFillWarps = kFour ? 2 : 1;
        const int parity = kFour ? producer_warp >> 1 : 0;
        const int box_rows = params.box_rows;
        const int boxes = S::kBlockN / box_rows;
        const int box = kFillWarps * (lane / S::kHalves) + parity, half = lane % S::kHalves;
        const bool copier = box < boxes;
        const int32_t* const pages = params.paged.block_tables + request * params.paged.block_tables_stride;
        const int shift = params.paged.page_size_log2;
        const int slot_mask = (1 << shift) - 1;
        auto box_key = [&](int b) { return block_base + b * S::kBlockN + box * box_rows; };
        auto page_for = [&](int b) {
          return copier && b < num_blocks && box_key(b) < key_end ? LoadInput(pages + (box_key(b) >> shift)) : 0;
        };
        int page = page_for(0);
        for (int b = 0; b < num_blocks; ++b) {
          const int stage = b % S::kStages;
          const uint32_t reuse = b / S::kStages;
          const int next_page = page_for(b + 1);  // read while this block's copies wait
          const int j0 = block_base + b * S::kBlockN;
          // Boxes holding keys below key_end: [0, fetched); this warp's, those of its parity.
          const int fetched = min(boxes, (key_end - j0 + box_rows - 1) / box_rows);
          const int mine = kFour ? (fetched > parity ? (fetched - parity + 1) / 2 : 0) : fetched;
          const int j = box_key(b);
          const bool issue = copier && j < key_end;
          const int slot = j & slot_mask;
          auto fill = [&](const CUtensorMap* map, uint64_t* full, uint64_t* empty, uint32_t offset) {
            if (reuse > 0) MbarrierWait<kFour ? kMbarrierSleepNs : 0>(empty + stage, (reuse - 1) & 1);
            if (lane == 0) MbarrierArriveExpectTx(full + stage, mine * S::kHalves * box_rows * 128);
            if (!issue) return;
            unsigned char* dst =
                smem + offset + stage * S::kKvTileBytes + half * S::kKvHalfBytes + box * box_rows * 128;
            if (params.slot_inner) {
              TensorCopy4dToShared(dst, map, full + stage, half * 64, slot, kv_head, page);
            } else {
              TensorCopy4dToShared(dst, map, full + stage, half * 64, kv_head, slot, page);
            }
          };
          if (!kFour || producer_warp % 2 == 0) fill(&tm_k, k_full, k_empty, S::kKOffset);
          if (!kFour || producer_warp % 2 == 1) fill(&tm_v, v_full, v_empty, S::kVOffset);
          page = next_page;
          // Block 0's head (by a V copier), once block 1's copies are issued too (its stage is
          // not refilled before the consumers' P V of block 0, which waits for this: phase 0 is
          // the only one it can see).
          if (producer_warp == v_warp && head && b == min(1, num_blocks - 1)) zero_v_rows(0, 0, 0, head_skip, v_head);
        }
      };
      if (four_copiers) {
        produce(std::true_type{});
      } else {
        produce(std::false_type{});
      }
    } else if (lane == 0) {
      for (int b = 0; b < num_blocks; ++b) {
        const int stage = b % S::kStages;
        const uint32_t reuse = b / S::kStages;  // how often this stage was filled before
        const int key_row = kv_begin + block_base + b * S::kBlockN;
        // K, then V: wait until the consumers released the stage, then refill it.
        auto fill = [&](const CUtensorMap* map, uint64_t* full, uint64_t* empty, uint32_t offset) {
          if (reuse > 0) MbarrierWait(empty + stage, (reuse - 1) & 1);
          MbarrierArriveExpectTx(full + stage, S::kKvTileBytes);
#pragma unroll
          for (int h = 0; h < S::kHalves; ++h) {
            TensorCopy3dToShared(smem + offset + stage * S::kKvTileBytes + h * S::kKvHalfBytes, map, full + stage,
                                 h * 64, kv_head, key_row);
          }
        };
        fill(&tm_k, k_full, k_empty, S::kKOffset);
        fill(&tm_v, v_full, v_empty, S::kVOffset);
      }
    }
    if (tail && producer_warp == v_warp) {
      // Thread 0 (paged: every lane of v_warp, a V copier) waited on the last stage's
      // previous "empty" phase before its final load, so after zero_v_rows' __syncwarp the
      // only v_full phase of that parity left is the last block's: no lane can mistake an
      // earlier phase for it.
      const int last = num_blocks - 1;
      zero_v_rows(last % S::kStages, (last / S::kStages) & 1, tail_keep, S::kBlockN, v_tail);
    }
    return;
  }

  // ---- consumers ----
  RegAlloc<S::kConsumerRegs>();
  const int consumer = warpgroup - 1;  // rows 64 * consumer ..
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int tile_rows = num_tokens * group;

  // This thread's two rows (accumulator layout: lane / 4 and lane / 4 + 8 of its warp's 16).
  int row_lo[2], row_hi[2];
  bool row_valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = consumer * 64 + warp * 16 + lane / 4 + 8 * i;
    row_valid[i] = r < tile_rows;
    row_lo[i] = row_hi[i] = 0;
    if (row_valid[i]) {
      VisibleKeys(p, q_start, kv_len, first + r / group, row_lo[i], row_hi[i]);
      row_lo[i] = max(row_lo[i], key_begin);
      row_hi[i] = max(row_lo[i], min(row_hi[i], key_end));
    }
  }


  float o_acc[S::kOutRegs];
#pragma unroll
  for (int e = 0; e < S::kOutRegs; ++e) o_acc[e] = 0.0f;
  float row_max[2] = {SPLITKV_NEG_INF, SPLITKV_NEG_INF};  // log2 units
  float row_sum[2] = {0.0f, 0.0f};                        // this thread's share

  // Batch-invariant calls whose tile spans more than one split (absolute multiples of
  // split_keys keys, split_plan.h): each split's rows are reduced from scratch and folded,
  // as its partial, into the merged rows kept in shared memory (split_merge.cuh SplitFold:
  // the fold a decode's merging CTA runs over the same partials, in the same split order).
  // With the decode kernel's wgmma-order path (decode_kernel.cuh), which reduces a row the
  // same way with mma.sync, a token gets the same bits from a prefill and from a decode
  // (tools/gpu/mma_bits_probe.cu: the two instructions round alike).
  const int first_split = kInvariant ? block_base / split_keys : 0;
  const int last_split = kInvariant && num_blocks > 0 ? (block_base + (num_blocks - 1) * S::kBlockN) / split_keys
                                                      : first_split;
  const bool multi_split = kInvariant && last_split > first_split;
  float4* const fold_rows = reinterpret_cast<float4*>(smem + S::kFoldOffset) + (threadIdx.x - 128);
  SplitFold fold[2];
  // Folds the finished split in o_acc, its row max (log2) and sum share; the partial it
  // stands for is WriteRowResult's: o / l and {max in natural log, l}. The thread's two rows
  // share each float4 (registers 4 c + 2 i + e), so one pass covers both: a row keeps its
  // merged values where its split is empty (the merges skip it), and takes its partial as
  // they are on its first split.
  auto fold_split = [&](const float (&m_log2)[2], const float (&sum_share)[2]) {
    float inv[2] = {0.0f, 0.0f}, wa[2] = {0.0f, 0.0f}, wb[2] = {0.0f, 0.0f};
    bool live[2], first[2] = {false, false};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = sum_share[i] + __shfl_xor_sync(0xffffffffu, sum_share[i], 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      live[i] = RowSeen(l);
      if (live[i]) {
        inv[i] = 1.0f / l;
        // __fmul_rn: the decode side's max and partial are rounded by their stores.
        first[i] = FoldSplit(fold[i], make_float2(__fmul_rn(m_log2[i], kLn2), l), wa[i], wb[i]);
      }
    }
    if (!live[0] && !live[1]) return;
    // Usually both rows fold a partial into merged values (selects only where not).
    const bool plain = live[0] && live[1] && !first[0] && !first[1];
    auto fold_pass = [&](auto both_plain) {
#pragma unroll
      for (int c = 0; c < S::kOutRegs / 4; ++c) {
        // Before a row's first split its old values are whatever shared memory held: only
        // selected away, never computed with into a kept value.
        const float4 old = fold_rows[c * S::kConsumerThreads];
        float v[4] = {old.x, old.y, old.z, old.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int i = k / 2;
          const float part = __fmul_rn(o_acc[4 * c + k], inv[i]);
          const float merged = FoldElement(v[k], wa[i], wb[i], part, false);
          v[k] = both_plain ? merged : !live[i] ? v[k] : first[i] ? part : merged;
        }
        fold_rows[c * S::kConsumerThreads] = make_float4(v[0], v[1], v[2], v[3]);
      }
    };
    if (plain) {
      fold_pass(std::true_type{});
    } else {
      fold_pass(std::false_type{});
    }
  };

  // Operand descriptors of Q, of stage 0's K and V; a stage and a k-step advance them.
  const uint64_t q_desc = Desc128B(SharedAddress(smem + S::kQOffset) + consumer * 64 * 128, 16, 1024);
  const uint64_t k_desc = Desc128B(SharedAddress(smem + S::kKOffset), 16, 1024);
  const uint64_t v_desc = Desc128B(SharedAddress(smem + S::kVOffset), S::kKvHalfBytes, 1024);

  // S = Q K^T over head_dim / 16 k-steps of 16 columns (4 per 128-byte swizzled half);
  // issued, not waited.
  auto issue_s = [&](float (&s)[S::kSRegs], int stage) {
    const uint64_t k_stage = DescAdvance(k_desc, stage * S::kKvTileBytes);
    WgmmaSS<T, false>(s, q_desc, k_stage);
#pragma unroll
    for (int ks = 1; ks < S::kKSteps; ++ks) {
      const uint32_t q_offset = (ks / 4) * S::kQHalfBytes + (ks % 4) * 32;
      const uint32_t k_offset = (ks / 4) * S::kKvHalfBytes + (ks % 4) * 32;
      WgmmaSS<T, true>(s, DescAdvance(q_desc, q_offset), DescAdvance(k_stage, k_offset));
    }
    WgmmaCommit();
  };
  // O += P V: V is [keys][d] in 64-column halves, read MN-major; a k-step is 16 keys
  // (16 rows of 128 bytes), the next half of N is kKvHalfBytes away. One wgmma covers at most
  // 128 columns of O, so head_dim 256 takes two, the second on halves 2 and 3 and on o_acc's
  // upper 64 registers (the accumulator layout of columns 128.. continues where 0..127 end).
  // Issued, not waited.
  auto issue_pv = [&](const uint32_t (&a)[S::kPSteps][4], int stage) {
    const uint64_t v_stage = DescAdvance(v_desc, stage * S::kKvTileBytes);
#pragma unroll
    for (int kk = 0; kk < S::kPSteps; ++kk) {
      const uint64_t v_k = DescAdvance(v_stage, kk * 16 * 128);
      if constexpr (S::kHeadDim == 256) {
        WgmmaRS<T>(*reinterpret_cast<float(*)[64]>(o_acc), a[kk], v_k);
        WgmmaRS<T>(*reinterpret_cast<float(*)[64]>(o_acc + 64), a[kk], DescAdvance(v_k, 2 * S::kKvHalfBytes));
      } else {
        WgmmaRS<T>(o_acc, a[kk], v_k);
      }
    }
    WgmmaCommit();
  };
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) MbarrierArrive(bar);
  };

  // Block b's logits -> probabilities (block_softmax.cuh, the decode kernel's wgmma-order path
  // runs the same function), and the probabilities as the P V A operand. pack runs only once no
  // wgmma reading `a` is in flight: ptxas may give the new values the registers of the old
  // ones, and would serialise the wgmmas to stay correct.
  // An fp8 call's staged copy holds the stored values (prefill_sm90.cu): k_scale joins
  // sm_scale here and v_scale the output's 1 / l below (both exactly 1 for 16-bit K/V, so
  // those calls' bits do not change).
  const SoftmaxScales scales(p.sm_scale * KvHeadScale(p.kv_fp8, p.k_scale, p.k_scales, kv_head), p.logits_soft_cap);
  // The running max raised lazily (alpha 1 on most blocks, the output's rescale skipped
  // there) where no ping-pong hides the rescale: head_dim 256, whose 128 output registers
  // a thread make it ~128 multiplies between P V's landing and the next issue. With ping-pong
  // (head_dim 64 / 128) the other consumer's products cover it, and the skip's vote cost
  // 1-2.5 % (H200, docs/perf_log.md 2026-12-05); batch-invariant rows never take it.
  constexpr bool kLazyMax = !kInvariant && !S::kPingPong;
  auto softmax = [&](float (&s)[S::kSRegs], int b, float (&alpha)[2]) {
    BlockSoftmax<S::kSRegs, S::kBlockN, kLazyMax>(s, block_base + b * S::kBlockN, lane, scales, row_valid, row_lo,
                                                  row_hi, row_max, row_sum, alpha);
  };
  auto pack = [&](const float (&s)[S::kSRegs], uint32_t (&a)[S::kPSteps][4]) { PackProbabilities<T>(s, a); };

  // Ping-pong between the consumers (FlashAttention-3's warp scheduling): they take turns
  // issuing their wgmmas in a ring, so the others' softmax runs while one's products hold the
  // tensor cores. Hardware barrier 1 + c is consumer c's turn: its 128 threads wait there for
  // the previous consumer's 128, which arrive right after issuing. Consumer 0 goes first (the
  // last consumer arrives once up front); the last consumer leaves out its last arrive, so
  // each barrier gets as many arrivals as waits and none is left holding arrivals when the
  // CTA exits. Every consumer issues at the same num_blocks + 1 points.
  auto turn_wait = [&]() {
    if constexpr (S::kPingPong) NamedBarrierSync(1 + consumer, 256);
  };
  auto turn_pass = [&](bool last) {
    if constexpr (S::kPingPong) {
      if (!(last && consumer == S::kConsumers - 1)) NamedBarrierArrive(1 + (consumer + 1) % S::kConsumers, 256);
    }
  };
  if constexpr (S::kPingPong) {
    if (num_blocks > 0 && consumer == S::kConsumers - 1) NamedBarrierArrive(1, 256);
  }

  MbarrierWait(q_full, 0);
  // Software pipeline inside the warpgroup: S of block b + 1 and P_b V_b are issued together,
  // and the softmax of block b + 1 is written between the two waits (ptxas moves the second
  // wait above it at head_dim 64 / 128: see the header comment).
  float s[S::kSRegs];
  uint32_t a[S::kPSteps][4];
  float alpha[2];
  if (num_blocks > 0) {
    MbarrierWait(k_full, 0);
    turn_wait();
    WgmmaFence();
    issue_s(s, 0);
    turn_pass(false);
    WgmmaWait<0>();
    FenceRegs(s);
    release(k_empty);
    softmax(s, 0, alpha);  // o_acc is zero: alpha is moot
    pack(s, a);
  }
  // One step of the loop: P V of block b and the softmax of block b + 1. kOpens (batch-
  // invariant only): block b + 1 opens a split, so its softmax starts from scratch and, once
  // P V of block b lands, the finished split is folded. The steps that open a split are
  // compiled apart (the walk below calls them at the split boundaries), so every other step
  // is the default instance's, with no fold code or test in the loop (which cost the
  // invariant prefill ~5 % at one split a tile before: H200, docs/perf_log.md 2026-12-03).
  auto step = [&](int b, auto opens_tag) {
    constexpr bool kOpens = decltype(opens_tag)::value;
    const int stage = b % S::kStages;
    const int next_stage = (b + 1) % S::kStages;
    MbarrierWait(k_full + next_stage, ((b + 1) / S::kStages) & 1);
    MbarrierWait(v_full + stage, (b / S::kStages) & 1);
    if (b == 0 && head) MbarrierWait(v_head, 0);
    FenceRegs(o_acc);  // the rescale and the packing land before the fence, not after it
    FenceRegs(a);
    turn_wait();
    WgmmaFence();
    issue_s(s, next_stage);
    issue_pv(a, stage);
    turn_pass(false);
    WgmmaWait<1>();  // S of block b + 1 (groups complete in order)
    FenceRegs(s);
    release(k_empty + next_stage);
    float done_max[2], done_sum[2];
    if constexpr (kOpens) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        done_max[i] = row_max[i], done_sum[i] = row_sum[i];
        row_max[i] = SPLITKV_NEG_INF, row_sum[i] = 0.0f;
      }
    }
    softmax(s, b + 1, alpha);
    WgmmaWait<0>();
    FenceRegs(o_acc);
    FenceRegs(a);
    release(v_empty + stage);
    pack(s, a);
    if constexpr (kInvariant) {
      if constexpr (kOpens) fold_split(done_max, done_sum);
      // The output so far times alpha (0 where a split opens: its softmax started afresh),
      // plus +0 so that a zeroed accumulator is +0 whatever the sign of what it held: the
      // decode kernel's wgmma-order path starts a split from +0 with the same operation.
#pragma unroll
      for (int c = 0; c < S::kOutRegs / 4; ++c) {
        o_acc[4 * c] = fmaf(o_acc[4 * c], alpha[0], 0.0f), o_acc[4 * c + 1] = fmaf(o_acc[4 * c + 1], alpha[0], 0.0f);
        o_acc[4 * c + 2] = fmaf(o_acc[4 * c + 2], alpha[1], 0.0f);
        o_acc[4 * c + 3] = fmaf(o_acc[4 * c + 3], alpha[1], 0.0f);
      }
    } else if (!kLazyMax || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
      // kLazyMax: skipped where no row of the warp raised its max (alpha is exactly 1).
#pragma unroll
      for (int c = 0; c < S::kOutRegs / 4; ++c) {
        o_acc[4 * c] *= alpha[0], o_acc[4 * c + 1] *= alpha[0];
        o_acc[4 * c + 2] *= alpha[1], o_acc[4 * c + 3] *= alpha[1];
      }
    }
  };
  int b = 0;
  if constexpr (kInvariant) {
    // Block j opens a split where block_base + j * kBlockN is a multiple of split_keys (j >=
    // 1; block_base is a multiple of kBlockN, split_keys a power-of-two multiple of it).
    constexpr int kSplitBlocks = split_keys / S::kBlockN;
    static_assert(kSplitBlocks >= 1 && split_keys % S::kBlockN == 0, "whole blocks a split");
    int next_open = multi_split ? (split_keys - block_base % split_keys) / S::kBlockN : num_blocks;
    while (b + 1 < num_blocks) {
      const int stop = min(next_open, num_blocks);
      for (; b + 1 < stop; ++b) step(b, std::false_type{});
      if (b + 1 < num_blocks) {
        step(b, std::true_type{});
        ++b;
        next_open += kSplitBlocks;
      }
    }
  } else {
    for (; b + 1 < num_blocks; ++b) step(b, std::false_type{});
  }
  if (num_blocks > 0) {  // the last block's P V
    const int stage = (num_blocks - 1) % S::kStages;
    MbarrierWait(v_full + stage, ((num_blocks - 1) / S::kStages) & 1);
    if (tail) MbarrierWait(v_tail, 0);
    if (num_blocks == 1 && head) MbarrierWait(v_head, 0);
    FenceRegs(o_acc);
    FenceRegs(a);
    turn_wait();
    WgmmaFence();
    issue_pv(a, stage);
    turn_pass(true);
    WgmmaWait<0>();
    FenceRegs(o_acc);
    release(v_empty + stage);
  }

  // ---- epilogue: normalise and store this thread's two rows ----
  // A batch-invariant tile of several splits stores its folded rows (as StoreMergedRow
  // writes a merged row); every other tile its accumulator over the row sum (CTA-uniform).
  const bool folded = kInvariant && multi_split;
  if (folded) {
    fold_split(row_max, row_sum);
    // The merged rows back into the accumulator's registers (o_acc is spent), so the stores
    // below read registers only, as the default instance's do: a per-element choice between
    // shared memory and o_acc compiled to a branch an element (~130 a thread, in every tile).
    // (Rows that see no key keep whatever this loads: value() writes them as zeros.)
#pragma unroll
    for (int c = 0; c < S::kOutRegs / 4; ++c) {
      const float4 merged = fold_rows[c * S::kConsumerThreads];
      o_acc[4 * c] = merged.x, o_acc[4 * c + 1] = merged.y, o_acc[4 * c + 2] = merged.z, o_acc[4 * c + 3] = merged.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
    }
  }
  const int quad = lane & 3;
  const float v_scale = KvHeadScale(p.kv_fp8, p.v_scale, p.v_scales, kv_head);
  // Each row's normalisation, its lse, and where it goes in out (-1: no row of the call).
  bool row_seen[2];
  float row_scale[2], row_keep[2];
  int64_t row_off[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_seen[i] = false, row_scale[i] = 0.0f, row_keep[i] = 1.0f, row_off[i] = -1;
    if (!row_valid[i]) continue;
    const int r = consumer * 64 + warp * 16 + lane / 4 + 8 * i;
    const int t = r / group;
    const int token = q_begin + first + t;
    const int head = kv_head * group + (r - t * group);
    // The max in natural log, rounded here (no fused multiply-add into lse or the sink's
    // terms): the decode kernel's rows get it through shared memory.
    const float m = folded ? fold[i].m : __fmul_rn(row_max[i], kLn2);
    const float l = folded ? fold[i].l : row_sum[i];
    const bool seen = RowSeen(l);
    const float scale = folded ? FoldScale(fold[i]) : seen ? v_scale / l : 0.0f;
    float lse = seen ? m + logf(l) : SPLITKV_NEG_INF;
    const float keep = SinkKeep(p, head, m, l, seen, lse);  // 1 without sinks
    row_seen[i] = seen, row_scale[i] = scale, row_keep[i] = keep;
    row_off[i] = int64_t{token} * p.out_stride_token + int64_t{head} * p.out_stride_head;
    if (quad == 0 && p.lse != nullptr) {
      p.lse[static_cast<int64_t>(token) * p.layout_shape.num_qo_heads + head] = lse;
    }
  }
  // This thread's element `reg` of row i, normalised; rows that see no key are written as
  // zeros, not 0 * o (o may hold 0 * NaN).
  auto value = [&](int i, int reg) { return row_seen[i] ? o_acc[reg] * row_scale[i] * row_keep[i] : 0.0f; };
  T* const out = static_cast<T*>(p.out);
  if (p.out_vec) {
    // Whole rows in 16-byte stores: the warp's 16 rows go through shared memory (this warp's
    // own rows of the Q tile, spent once the consumer's last S landed), since the accumulator
    // layout gives a thread 4 bytes of a row at a time, and 4-byte stores write each 32-byte
    // sector in halves (L2 sectors written 1.8x the output's at 64 x 256: docs/perf_log.md
    // 2026-12-04; H200 2026-12-05: +3.5 % at d128 8 x 2048, +11 % at d256 on the trace). A
    // row is 128-byte pieces, one a 64 columns, laid out as Q's; 16-byte chunk j of row r sits
    // at j ^ (r % 8), so both the 4-byte writes and the 16-byte reads are conflict-free.
    unsigned char* const rows = smem + S::kQOffset + (consumer * 64 + warp * 16) * 128;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int rr = lane / 4 + 8 * i;
#pragma unroll
      for (int c = 0; c < S::kOutRegs / 4; ++c) {
        const int chunk = (c % 8) ^ (rr % 8);
        *reinterpret_cast<uint32_t*>(rows + (c / 8) * S::kQHalfBytes + rr * 128 + chunk * 16 + quad * 4) =
            PackPair<T>(value(i, 4 * c + 2 * i), value(i, 4 * c + 2 * i + 1));
      }
    }
    __syncwarp();
    constexpr int kChunks = kHeadDim / 8;            // 16-byte chunks a row
    constexpr int kRowsPerPass = 32 / kChunks;       // rows a warp copies at once (<= 4)
#pragma unroll
    for (int k = 0; k < 16 / kRowsPerPass; ++k) {
      const int rr = k * kRowsPerPass + lane / kChunks;  // rr / 8 is k * kRowsPerPass / 8
      const int cc = lane % kChunks;
      // Row rr's destination from the lane holding it (lane 4 * (rr % 8), its row rr / 8).
      const int64_t off = __shfl_sync(0xffffffffu, row_off[(k * kRowsPerPass) / 8], 4 * (rr % 8));
      const uint4 v = *reinterpret_cast<const uint4*>(rows + (cc / 8) * S::kQHalfBytes + rr * 128 +
                                                       ((cc % 8) ^ (rr % 8)) * 16);
      if (off >= 0) *reinterpret_cast<uint4*>(out + off + cc * 8) = v;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (row_off[i] < 0) continue;
      T* dst = out + row_off[i] + quad * 2;
#pragma unroll
      for (int c = 0; c < S::kOutRegs / 4; ++c) {
        dst[c * 8] = FromFloat<T>(value(i, 4 * c + 2 * i));
        dst[c * 8 + 1] = FromFloat<T>(value(i, 4 * c + 2 * i + 1));
      }
    }
  }
#elif defined(__CUDA_ARCH__)
  // A device pass without sm_90a's instructions (sm_80 here; the host launches this kernel
  // only on compute capability 9.0, where the sm_90a image loads). Should a build ever carry
  // only plain sm_90 code, a launch must fail loudly rather than leave out unwritten.
  __trap();
#endif  // SPLITKV_SM90_DEVICE
}

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_PREFILL_SM90_CUH_
