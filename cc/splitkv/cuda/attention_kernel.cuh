// The attention kernel shared by paged and ragged calls: one CTA runs one split of one work
// tile (request, kv head, q tile). Its query rows pack (tokens x the group's qo heads) into
// the mma M dimension; K/V blocks stream through shared memory in a multi-stage cp.async
// pipeline; S = Q K^T and O += P V run on mma.sync m16n8k16 with an fp32 online softmax.
// Masking (causal aligned to the end of the KV, sliding window, the split's key range) is
// applied to S; key rows outside the split's range are zero-filled in shared memory, so
// bytes past seq_len or in a page's tail never reach a result, NaN or not. (A key inside the
// tile's range is visible to some row of the tile; were its V row NaN, the rows that mask it
// would still see 0 * NaN in P V, as in any mma-based kernel.)
#ifndef SPLITKV_CUDA_ATTENTION_KERNEL_CUH_
#define SPLITKV_CUDA_ATTENTION_KERNEL_CUH_

#include <cstdint>
#include <type_traits>

#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/cuda/kv_source.cuh"
#include "cc/splitkv/cuda/ptx.cuh"
#include "cc/splitkv/cuda/split_merge.cuh"
#include "cc/splitkv/cuda/tile_config.h"
#include "cc/splitkv/split_plan.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv::cuda {

// Compile-time shape of a CTA: kWarpsM warps of 16 rows; the other 4 / kWarpsM warps per
// row block split each kBlockN-key block between them (decode tiles) and merge at the end.
// kStages K/V blocks live in shared memory: kStages - 1 are in flight while one is used.
template <int kHeadDim_, int kWarpsM_, int kBlockN_, int kStages_>
struct KernelShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kThreads / 32 / kWarpsM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kRows = 16 * kWarpsM;
  static constexpr int kKeysPerWarp = kBlockN / kWarpsN;
  static_assert(kKeysPerWarp % 16 == 0, "a warp's keys must be whole k-steps of 16");
  static_assert(kHeadDim % 32 == 0, "head_dim must be a multiple of 32");
  static constexpr int kDTiles = kHeadDim / 8;   // n-tiles of O (8 columns each)
  static constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T
  static constexpr int kSTiles = kKeysPerWarp / 8;
  static constexpr int kStages = kStages_;
  static_assert(kStages >= 2, "the pipeline needs a block in flight");
  static constexpr int kQElems = kRows * kHeadDim;
  static constexpr int kKvElems = kBlockN * kHeadDim;
  static constexpr int kOStride = kHeadDim + 8;  // floats; the pad spreads rows over banks
  static constexpr size_t kMainBytes = (size_t{kQElems} + size_t{2} * kStages * kKvElems) * 2;
  static constexpr size_t kEpilogueBytes = (size_t{kWarpsN} * kRows * kOStride + size_t{kWarpsN} * kRows * 2) * 4;
  static constexpr size_t kSmemBytes = kMainBytes > kEpilogueBytes ? kMainBytes : kEpilogueBytes;
};

// Element offset of (row, col) in a [rows][kHeadDim] shared tile whose 16-byte chunks are
// XOR-swizzled by row, so ldmatrix's 8 row addresses hit 8 different bank groups.
template <int kHeadDim>
__device__ __forceinline__ int SwizzledOffset(int row, int col) {
  return row * kHeadDim + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// One 16-byte chunk from global to shared memory: cp.async when `vec`, else element loads.
template <typename T>
__device__ __forceinline__ void CopyChunk(T* dst, const T* src, bool vec) {
  if (vec) {
    CpAsync16(dst, src, 16);
  } else {
    const auto* s = reinterpret_cast<const uint16_t*>(src);
    uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = uint32_t{s[2 * e]} | (uint32_t{s[2 * e + 1]} << 16);
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The CUDA backend's one place for an fp8 KV cache: float8 e4m3fn (1 sign, 4 exponent bits
// with bias 7, 3 mantissa bits; exponent 15 with mantissa 7 is NaN) to float32, exactly.
__device__ __forceinline__ float Fp8E4M3ToFloat(uint32_t b) {
  const uint32_t exponent = (b >> 3) & 15u, mantissa = b & 7u, sign = (b & 0x80u) << 24;
  if (exponent == 0) return __uint_as_float(sign | __float_as_uint(static_cast<float>(mantissa) * 0.001953125f));
  if (exponent == 15 && mantissa == 7) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// The kv head's scale of an fp8 cache (KvStorage: the per-head array where given, else the
// per-tensor value), read once a CTA; exactly 1 for 16-bit K/V (fp8 false).
__device__ __forceinline__ float KvHeadScale(bool fp8, float scale, const float* scales, int kv_head) {
  if (!fp8) return 1.0f;
  return scales != nullptr ? LoadInput(scales + kv_head) : scale;
}

// 4 fp8 bytes (memory order: the first in w's low byte) to two float16x2 words (the first
// pair in lo), exactly: every e4m3 value is a float16 value, NaN stays NaN. The sm_90 decode
// kernel's conversion (one cvt per pair on sm_89+; the sm_80 build keeps the float route).
__device__ __forceinline__ void Fp8x4ToHalf2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n"
      "  .reg .b16 a, b;\n"
      "  mov.b32 {a, b}, %2;\n"
      "  cvt.rn.f16x2.e4m3x2 %0, a;\n"
      "  cvt.rn.f16x2.e4m3x2 %1, b;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  lo = PackPair<__half>(Fp8E4M3ToFloat(w & 0xffu), Fp8E4M3ToFloat((w >> 8) & 0xffu));
  hi = PackPair<__half>(Fp8E4M3ToFloat((w >> 16) & 0xffu), Fp8E4M3ToFloat(w >> 24));
#endif
}

// 8 fp8 elements (two words, the first element in word[0]'s low byte) to 8 of T, exactly
// (every e4m3 value is a float16 and a bfloat16 value; the kv head's scales are applied by
// the kernel: k_scale with sm_scale, v_scale to the output). The mma.sync kernel's one
// dequantisation, for both of its ways to load an fp8 block (CopyChunk, ConvertFp8KvBlock).
template <typename T>
__device__ __forceinline__ uint4 Fp8ChunkTo(const uint32_t (&word)[2]) {
  uint32_t packed[4];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The hardware's pair conversion (exact), then float16 to T (exact: the same values). The
  // bit manipulation below cost ~12 integer instructions an element, as much issue time as
  // the prefill tiles' mma (fp8 prefill ran at 39-42 TFLOP/s on the H200, 1/14 of bf16's).
  Fp8x4ToHalf2x2(word[0], packed[0], packed[1]);
  Fp8x4ToHalf2x2(word[1], packed[2], packed[3]);
  if constexpr (!std::is_same_v<T, __half>) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&packed[e]));
      packed[e] = PackPair<T>(f.x, f.y);
    }
  }
#else
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t w = word[e / 2] >> (16 * (e % 2));
    packed[e] = PackPair<T>(Fp8E4M3ToFloat(w & 0xffu), Fp8E4M3ToFloat((w >> 8) & 0xffu));
  }
#endif
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// 8 fp8 elements to 8 of T in shared memory by a synchronous load, 8-byte when `vec`: the
// rows that are not 8-byte aligned (aligned ones stream through LoadFp8KvBlockAsync).
template <typename T>
__device__ __forceinline__ void CopyChunk(T* dst, const Fp8E4M3* src, bool vec) {
  uint32_t word[2];
  if (vec) {
    const uint2 w = LoadInput(reinterpret_cast<const uint2*>(src));
    word[0] = w.x, word[1] = w.y;
  } else {
    const auto* bytes = reinterpret_cast<const uint8_t*>(src);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      word[h] = uint32_t{bytes[4 * h]} | uint32_t{bytes[4 * h + 1]} << 8 | uint32_t{bytes[4 * h + 2]} << 16 |
                uint32_t{bytes[4 * h + 3]} << 24;
    }
  }
  *reinterpret_cast<uint4*>(dst) = Fp8ChunkTo<T>(word);
}

template <typename T>
__device__ __forceinline__ void ZeroChunk(T* dst) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
}

// Calls chunk(r, c) for this thread's 8-element chunks of a [kRows][kHeadDim] tile: chunk c
// = threadIdx % (kHeadDim / 8) of every (kThreads / chunks)-th row, so a warp's chunks are
// adjacent. The loop is unrolled only partly: full unrolling of 16+ rows held every row's
// addresses in registers and spilled.
template <int kHeadDim, int kRows, typename Chunk>
__device__ __forceinline__ void ForEachChunk(const Chunk& chunk) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kStep = kThreads / kChunks;
  static_assert(kRows % kStep == 0, "rows must split evenly over the CTA");
  const int c = threadIdx.x % kChunks;
#pragma unroll 4
  for (int i = 0; i < kRows / kStep; ++i) chunk(static_cast<int>(threadIdx.x / kChunks + i * kStep), c);
}

// Copies kRows rows of kHeadDim elements into a swizzled shared tile; row_ptr(r) gives the
// global row or nullptr (the row becomes zeros).
template <typename T, int kHeadDim, int kRows, typename RowPtr>
__device__ __forceinline__ void LoadRows(T* smem, const RowPtr& row_ptr, bool vec) {
  ForEachChunk<kHeadDim, kRows>([&](int r, int c) {
    const T* src = row_ptr(r);
    T* dst = smem + SwizzledOffset<kHeadDim>(r, c * 8);
    if (src == nullptr) {
      ZeroChunk(dst);
    } else {
      CopyChunk(dst, src + c * 8, vec);
    }
  });
}

// Keys j0 .. j0 + kRows - 1 into the K and V tiles; keys at or past key_end become zeros, so
// nothing outside the split's range (a page tail, a page past seq_len) can reach a result.
// K and V of one key share one page-table lookup.
template <typename T, int kHeadDim, int kRows, typename KvSource>
__device__ __forceinline__ void LoadKvBlock(T* s_k, T* s_v, const KvSource& kv, int j0, int key_end, bool vec) {
  ForEachChunk<kHeadDim, kRows>([&](int r, int c) {
    const int offset = SwizzledOffset<kHeadDim>(r, c * 8);
    if (j0 + r < key_end) {
      const typename KvSource::Elem* key;
      const typename KvSource::Elem* value;
      kv.Rows(j0 + r, key, value);
      CopyChunk(s_k + offset, key + c * 8, vec);
      CopyChunk(s_v + offset, value + c * 8, vec);
    } else {
      ZeroChunk(s_k + offset);
      ZeroChunk(s_v + offset);
    }
  });
}

// An fp8 cache's keys j0 .. j0 + kRows - 1 as their bytes, into staging tiles of [kRows]
// [kHeadDim] bytes, by 8-byte cp.async (rows 8-byte aligned: p.kv_vec), so the block is in
// flight while the CTA works on the one before (a synchronous load, converting on the way,
// stalled every thread for the whole load each block: fp8 prefill ran at 1/6.5 of bf16's
// speed on the H200). Keys at or past key_end are not fetched; ConvertFp8KvBlock zeroes them.
template <int kHeadDim, int kRows, typename KvSource>
__device__ __forceinline__ void LoadFp8KvBlockAsync(uint8_t* s_k8, uint8_t* s_v8, const KvSource& kv, int j0,
                                                    int key_end) {
  ForEachChunk<kHeadDim, kRows>([&](int r, int c) {
    if (j0 + r < key_end) {
      const Fp8E4M3* key;
      const Fp8E4M3* value;
      kv.Rows(j0 + r, key, value);
      CpAsync8(s_k8 + r * kHeadDim + c * 8, key + c * 8);
      CpAsync8(s_v8 + r * kHeadDim + c * 8, value + c * 8);
    }
  });
}

// A staged fp8 block (LoadFp8KvBlockAsync, landed) into the K and V tiles the mma reads
// (LoadKvBlock's layout and values); keys at or past key_end become zeros. Each thread
// converts exactly the chunks it staged (the same ForEachChunk walk), so its own cp.async
// wait suffices before it; one
// CTA barrier after it publishes the tiles (which the previous block's reads, ended by a
// barrier, no longer need).
template <typename T, int kHeadDim, int kRows>
__device__ __forceinline__ void ConvertFp8KvBlock(T* s_k, T* s_v, const uint8_t* s_k8, const uint8_t* s_v8, int j0,
                                                  int key_end) {
  ForEachChunk<kHeadDim, kRows>([&](int r, int c) {
    const int offset = SwizzledOffset<kHeadDim>(r, c * 8);
    if (j0 + r < key_end) {
      const uint2 k = *reinterpret_cast<const uint2*>(s_k8 + r * kHeadDim + c * 8);
      const uint2 v = *reinterpret_cast<const uint2*>(s_v8 + r * kHeadDim + c * 8);
      const uint32_t kw[2] = {k.x, k.y}, vw[2] = {v.x, v.y};
      *reinterpret_cast<uint4*>(s_k + offset) = Fp8ChunkTo<T>(kw);
      *reinterpret_cast<uint4*>(s_v + offset) = Fp8ChunkTo<T>(vw);
    } else {
      ZeroChunk(s_k + offset);
      ZeroChunk(s_v + offset);
    }
  });
}

// The local key position of query 0 of `request` (q_len queries, kv_len keys): kv_len - q_len
// (the queries are the last tokens), or full_seq_lens - kv_offsets - q_len when the call's
// keys are one shard of a longer request (params.h). int64: the unchecked device values
// cannot overflow it.
__device__ __forceinline__ int64_t QueryStart(const AttentionKernelParams& p, int request, int q_len, int kv_len) {
  if (p.full_seq_lens == nullptr) return int64_t{kv_len} - q_len;
  return int64_t{LoadInput(p.full_seq_lens + request)} - LoadInput(p.kv_offsets + request) - q_len;
}

// Keys [lo, hi) that query index i of a request (query 0 at local position q_start, kv_len
// keys) sees: the semantics of DESIGN.md, as the CPU backend computes them (VisibleKeys in
// attention_tile.h). Past the last key a row sees what the window leaves of the keys, before
// key 0 nothing under causal masking; an empty range is [lo, lo) with lo in [0, kv_len].
__device__ __forceinline__ void VisibleKeys(const AttentionKernelParams& p, int64_t q_start, int kv_len, int i,
                                            int& lo, int& hi) {
  const int64_t pos = q_start + i;
  const int64_t h = p.causal ? min(int64_t{kv_len}, pos + 1) : int64_t{kv_len};
  const int64_t l = p.window_left >= 0 ? min(int64_t{kv_len}, max(int64_t{0}, pos - p.window_left)) : 0;
  lo = static_cast<int>(l);
  hi = static_cast<int>(max(l, h));
}

// The query tokens of this CTA's tile. blockIdx.x walks (request, kv head, q tile) with q
// tiles last-first: under causal masking the last tiles see the most keys, and starting them
// first shortens the tail. The counter index (TileCounterIndex) uses the same coordinates.
struct TileQueries {
  int request, kv_head, q_tile;
  int q_begin, q_len;     // the request's query tokens in q
  int first, num_tokens;  // the tile's, relative to q_begin
};

// False when the tile lies past its request's queries: no work and no counter (the exit is
// the same for every split of the tile).
__device__ __forceinline__ bool TileQueriesOf(const AttentionKernelParams& p, TileQueries& t) {
  const int tile = blockIdx.x;
  t.q_tile = p.max_q_tiles - 1 - tile % p.max_q_tiles;
  t.kv_head = tile / p.max_q_tiles % p.num_kv_heads;
  t.request = tile / p.max_q_tiles / p.num_kv_heads;
  t.q_begin = t.request;
  t.q_len = 1;
  if (p.cu_seqlens_q != nullptr) {
    t.q_begin = LoadInput(p.cu_seqlens_q + t.request);
    t.q_len = LoadInput(p.cu_seqlens_q + t.request + 1) - t.q_begin;
  }
  t.first = t.q_tile * p.q_tile_tokens;
  if (t.first >= t.q_len) return false;
  t.num_tokens = min(p.q_tile_tokens, t.q_len - t.first);
  return true;
}

// This split's keys: the union of the tile's rows' visible ranges, cut into the share of
// split blockIdx.y in whole granules of `granule` keys (SplitKeyRange), walked in blocks of
// block_keys. Batch-invariant mode: split blockIdx.y's absolute keys, its blocks starting on
// multiples of block_keys (InvariantSplitKeyRange), so a row's blocks and splits are the same
// in any tile, batch or launch.
struct SplitKeys {
  int begin, end, num_blocks;
  int tile_lo;  // the tile's first visible key (kv_len when it sees none)
};

__device__ __forceinline__ SplitKeys SplitKeysOf(const AttentionKernelParams& p, const TileQueries& t, int kv_len,
                                                 int block_keys, int granule) {
  int tile_lo = kv_len, tile_hi = 0;
  const int64_t q_start = QueryStart(p, t.request, t.q_len, kv_len);
  for (int i = 0; i < t.num_tokens; ++i) {
    int lo, hi;
    VisibleKeys(p, q_start, kv_len, t.first + i, lo, hi);
    if (hi > lo) tile_lo = min(tile_lo, lo), tile_hi = max(tile_hi, hi);
  }
  const KeyRange range =
      p.invariant_split_keys > 0
          ? InvariantSplitKeyRange(tile_lo, max(tile_lo, tile_hi), static_cast<int>(blockIdx.y), p.invariant_split_keys,
                                   block_keys)
          : SplitKeyRange(tile_lo, max(tile_lo, tile_hi), p.num_splits, static_cast<int>(blockIdx.y), granule);
  SplitKeys keys;
  keys.begin = static_cast<int>(range.begin);
  keys.end = static_cast<int>(range.end);
  keys.num_blocks = keys.end > keys.begin ? (keys.end - keys.begin + block_keys - 1) / block_keys : 0;
  keys.tile_lo = tile_lo;
  return keys;
}

// The end of a tile whose warps each hold a slice of the keys: every warp stages its
// accumulator rows and {max, sum_exp} in fp32 shared memory ([kWarpsN][kRows][kOStride] and
// {max, sum} per row), then whole rows are merged slice by slice in fixed order. Shared by
// AttentionKernel and BulkDecodeKernel (decode_kernel.cuh).
//
// Stages this warp's two fragment rows (row_base + lane / 4 + 8 i) of acc, row_max and row_sum.
template <int kDTiles, int kOStride>
__device__ __forceinline__ void StageWarpRows(float* s_o, float* s_ml, int row_base, const float (&acc)[kDTiles][4],
                                              const float (&row_max)[2], const float (&row_sum)[2]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row_base + lane / 4 + 8 * i;
    float* dst = s_o + r * kOStride + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      *reinterpret_cast<float2*>(dst + d * 8) = make_float2(acc[d][2 * i], acc[d][2 * i + 1]);
    }
    if ((lane & 3) == 0) s_ml[2 * r] = row_max[i], s_ml[2 * r + 1] = row_sum[i];
  }
}

// Row r merged over the kWarpsN staged slices (rows sl * kRows + r): the lane's kElems
// output elements (unnormalised), the row max m and sum of exp l (l == 0: no key seen; NaN
// where a slice's sum is NaN, RowSeen, even when every slice's max is -inf).
template <int kElems, int kWarpsN, int kRows, int kOStride>
__device__ __forceinline__ void MergeWarpSlices(const float* s_o, const float* s_ml, int r, float (&o)[kElems],
                                                float& m, float& l) {
  const int lane = threadIdx.x % 32;
  m = SPLITKV_NEG_INF;
#pragma unroll
  for (int sl = 0; sl < kWarpsN; ++sl) m = fmaxf(m, s_ml[2 * (sl * kRows + r)]);
#pragma unroll
  for (int e = 0; e < kElems; ++e) o[e] = 0.0f;
  l = 0.0f;
  if (m != SPLITKV_NEG_INF) {
#pragma unroll
    for (int sl = 0; sl < kWarpsN; ++sl) {
      const int sr = sl * kRows + r;
      const float w = exp2f((s_ml[2 * sr] - m) * kLog2e);
      l += s_ml[2 * sr + 1] * w;
      float part[kElems];
      LoadFloats<kElems, false>(part, s_o + sr * kOStride + lane * kElems);
#pragma unroll
      for (int e = 0; e < kElems; ++e) o[e] += w * part[e];
    }
  } else {
    // No finite logit in any slice: l is 0, or NaN from a slice whose logits were all NaN.
#pragma unroll
    for (int sl = 0; sl < kWarpsN; ++sl) l += s_ml[2 * (sl * kRows + r) + 1];
  }
}

template <typename T, class Shape, template <typename> class KvSourceT>
__global__ void __launch_bounds__(kThreads)
    AttentionKernel(const AttentionKernelParams p, const typename KvSourceT<T>::Params kv_params) {
  using S = Shape;
  constexpr int D = S::kHeadDim;
  extern __shared__ __align__(128) unsigned char smem[];
  T* const s_q = reinterpret_cast<T*>(smem);
  T* const s_kv = s_q + S::kQElems;  // stage st: K at 2 * st * kKvElems, V right after

  GridDependencyWait();  // before the first global access (ptx.cuh)
  TileQueries tq;
  if (!TileQueriesOf(p, tq)) return;
  const int split_idx = blockIdx.y;
  const int q_tile = tq.q_tile, kv_head = tq.kv_head, request = tq.request;
  const int q_begin = tq.q_begin, q_len = tq.q_len, first = tq.first, num_tokens = tq.num_tokens;
  const KvSourceT<T> kv(kv_params, request, kv_head);
  const int kv_len = kv.kv_len;
  // An fp8 cache in 8-byte aligned rows streams its bytes into kStages staging blocks (stage
  // st's K at s_kv8 + 2 st kKvElems bytes, V after it) and converts each block into one pair
  // of K/V tiles at s_kv before its mma (LoadFp8KvBlockAsync, ConvertFp8KvBlock): the tiles'
  // 4 kKvElems bytes plus the stages' 2 kStages kKvElems fit in the 16-bit stages' 4 kStages
  // kKvElems (kStages >= 2).
  [[maybe_unused]] uint8_t* const s_kv8 = reinterpret_cast<uint8_t*>(s_kv + 2 * S::kKvElems);
  // An fp8 cache's scales, for this kv head: k_scale joins sm_scale (the logits are
  // q . k_stored x k_scale x sm_scale), v_scale multiplies the output rows before they are
  // written (out is linear in V, partials and merge included).
  constexpr bool kFp8 = std::is_same_v<typename KvSourceT<T>::Elem, Fp8E4M3>;
  float k_scale = 1.0f, v_scale = 1.0f;
  if constexpr (kFp8) {
    k_scale = KvHeadScale(true, p.k_scale, p.k_scales, kv_head);
    v_scale = KvHeadScale(true, p.v_scale, p.v_scales, kv_head);
  }
  const SplitKeys split_keys = SplitKeysOf(p, tq, kv_len, S::kBlockN, S::kBlockN);
  const int key_begin = split_keys.begin, key_end = split_keys.end, num_blocks = split_keys.num_blocks;
  const int64_t q_start = QueryStart(p, request, q_len, kv_len);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / S::kWarpsN, wn = warp % S::kWarpsN;
  const int token_begin = q_begin + first;
  const int tile_rows = num_tokens * p.group_size;
  const float sm_scale = kFp8 ? p.sm_scale * k_scale : p.sm_scale, cap = p.logits_soft_cap;
  // Logits are kept in log2 units in the main loop (natural units times log2(e), folded into
  // the one multiply by sm_scale), so p = exp2(s - max) needs no multiply: the row's largest
  // logit gets exactly exp2(0) = 1 (a dominant key's v row comes out exact) at no extra cost.
  const float scale_log2 = sm_scale * kLog2e;

  for (int row0 = 0; row0 < tile_rows; row0 += S::kRows) {
    const int chunk_rows = min(S::kRows, tile_rows - row0);
    LoadRows<T, D, S::kRows>(
        s_q,
        [&](int r) -> const T* {
          if (r >= chunk_rows) return nullptr;
          const RowTarget at = TileRowTarget(p, token_begin, kv_head, row0 + r);
          return static_cast<const T*>(p.q) + at.token * p.q_stride_token + at.head * p.q_stride_head;
        },
        p.q_vec);
    auto load_kv = [&](int block, int stage) {
      if constexpr (kFp8) {
        if (p.kv_vec) {
          uint8_t* const s_k8 = s_kv8 + stage * 2 * S::kKvElems;
          LoadFp8KvBlockAsync<D, S::kBlockN>(s_k8, s_k8 + S::kKvElems, kv, key_begin + block * S::kBlockN, key_end);
          return;
        }
      }
      T* s_k = s_kv + stage * 2 * S::kKvElems;
      LoadKvBlock<T, D, S::kBlockN>(s_k, s_k + S::kKvElems, kv, key_begin + block * S::kBlockN, key_end, p.kv_vec);
    };
    // Prologue: blocks 0 .. kStages - 2 (Q rides in block 0's group). Every slot and every
    // iteration commits one group, empty or not, so in iteration b (after its own commit)
    // block b has landed once at most kStages - 1 groups are pending.
#pragma unroll
    for (int b = 0; b < S::kStages - 1; ++b) {
      if (b < num_blocks) load_kv(b, b);
      CpAsyncCommit();
    }

    // This thread's two rows (mma layout): lane / 4 and lane / 4 + 8 of its warp's 16, with
    // their visible keys clipped to the split. Rows past the chunk see nothing.
    int row_lo[2], row_hi[2];
    bool row_valid[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = wm * 16 + lane / 4 + 8 * i;
      row_valid[i] = r < chunk_rows;
      row_lo[i] = row_hi[i] = 0;
      if (row_valid[i]) {
        VisibleKeys(p, q_start, kv_len, first + (row0 + r) / p.group_size, row_lo[i], row_hi[i]);
        row_lo[i] = max(row_lo[i], key_begin);
        row_hi[i] = max(row_lo[i], min(row_hi[i], key_end));
      }
    }

    float row_max[2] = {SPLITKV_NEG_INF, SPLITKV_NEG_INF};
    float row_sum[2] = {0.0f, 0.0f};  // this thread's share; summed over the quad at the end
    float acc[S::kDTiles][4];
#pragma unroll
    for (int d = 0; d < S::kDTiles; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

    for (int block = 0; block < num_blocks; ++block) {
      // The stage refilled here was last read in iteration block - 1, which ended in a barrier.
      const int ahead = block + S::kStages - 1;
      if (ahead < num_blocks) load_kv(ahead, ahead % S::kStages);
      CpAsyncCommit();
      CpAsyncWait<S::kStages - 1>();
      const T* s_k = s_kv + (block % S::kStages) * 2 * S::kKvElems;
      if constexpr (kFp8) {
        if (p.kv_vec) {
          const uint8_t* const s_k8 = s_kv8 + (block % S::kStages) * 2 * S::kKvElems;
          ConvertFp8KvBlock<T, D, S::kBlockN>(s_kv, s_kv + S::kKvElems, s_k8, s_k8 + S::kKvElems,
                                              key_begin + block * S::kBlockN, key_end);
          s_k = s_kv;
        }
      }
      __syncthreads();
      const T* s_v = s_k + S::kKvElems;
      const int key0 = wn * S::kKeysPerWarp;  // this warp's first key within the block
      const int j_warp = key_begin + block * S::kBlockN + key0;

      float s[S::kSTiles][4];
#pragma unroll
      for (int n = 0; n < S::kSTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
        uint32_t a[4];
        LdMatrixX4(a, s_q + SwizzledOffset<D>(wm * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ks * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int np = 0; np < S::kSTiles / 2; ++np) {
          uint32_t b[4];
          LdMatrixX4(b, s_k + SwizzledOffset<D>(key0 + np * 16 + (lane & 7) + (lane >> 4) * 8,
                                                ks * 16 + ((lane >> 3) & 1) * 8));
          Mma16816<T>(s[2 * np], a, b[0], b[1]);
          Mma16816<T>(s[2 * np + 1], a, b[2], b[3]);
        }
      }

#pragma unroll
      for (int n = 0; n < S::kSTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x;
          if (cap > 0.0f) {
            x = cap * tanhf(s[n][e] * sm_scale / cap) * kLog2e;  // capped in natural units
          } else {
            x = s[n][e] * scale_log2;
          }
          s[n][e] = x;
        }
      }
      // Mask only blocks that some row of this warp does not see whole.
      bool partial = false;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        partial |= row_valid[i] && !(row_lo[i] <= j_warp && j_warp + S::kKeysPerWarp <= row_hi[i]);
      }
      if (__any_sync(0xffffffffu, partial)) {
#pragma unroll
        for (int n = 0; n < S::kSTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = j_warp + n * 8 + (lane & 3) * 2 + (e & 1);
            const int i = e >> 1;
            if (j < row_lo[i] || j >= row_hi[i]) s[n][e] = SPLITKV_NEG_INF;
          }
        }
      }

      // Online softmax (log2 units).
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float m = row_max[i];
#pragma unroll
        for (int n = 0; n < S::kSTiles; ++n) m = fmaxf(m, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const float m_ref = m == SPLITKV_NEG_INF ? 0.0f : m;  // a row with no key yet: p = 0
        const float alpha = exp2f(row_max[i] - m_ref);
        row_max[i] = m;
        row_sum[i] *= alpha;
#pragma unroll
        for (int d = 0; d < S::kDTiles; ++d) acc[d][2 * i] *= alpha, acc[d][2 * i + 1] *= alpha;

#pragma unroll
        for (int n = 0; n < S::kSTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pr = exp2f(s[n][2 * i + e] - m_ref);
            s[n][2 * i + e] = pr;
            row_sum[i] += pr;
          }
        }
      }

      // O += P V: the S accumulators of two n-tiles are one A fragment of 16 keys.
#pragma unroll
      for (int kk = 0; kk < S::kKeysPerWarp / 16; ++kk) {
        const uint32_t a[4] = {PackPair<T>(s[2 * kk][0], s[2 * kk][1]), PackPair<T>(s[2 * kk][2], s[2 * kk][3]),
                               PackPair<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               PackPair<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < S::kDTiles / 2; ++dp) {
          uint32_t b[4];
          LdMatrixX4Trans(b, s_v + SwizzledOffset<D>(key0 + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                     dp * 16 + (lane >> 4) * 8));
          Mma16816<T>(acc[2 * dp], a, b[0], b[1]);
          Mma16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
        }
      }
      __syncthreads();  // the stage is overwritten by the next iteration's prefetch
    }
    CpAsyncWait<0>();
    __syncthreads();  // shared memory is reused below

#pragma unroll
    for (int i = 0; i < 2; ++i) {
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
    }
    // Stage every warp's rows, then each warp finishes whole rows and writes the result.
    float* const s_o = reinterpret_cast<float*>(smem);
    float* const s_ml = s_o + S::kWarpsN * S::kRows * S::kOStride;
    // Back to natural-log units for the slices' merge and the stats (workspace_layout.h).
#pragma unroll
    for (int i = 0; i < 2; ++i) row_max[i] *= kLn2;
    StageWarpRows<S::kDTiles, S::kOStride>(s_o, s_ml, wn * S::kRows + wm * 16, acc, row_max, row_sum);
    __syncthreads();

    constexpr int kElems = D / 32;
    for (int r = warp; r < chunk_rows; r += kThreads / 32) {
      float o[kElems], m, l;
      MergeWarpSlices<kElems, S::kWarpsN, S::kRows, S::kOStride>(s_o, s_ml, r, o, m, l);
      if constexpr (kFp8) {
#pragma unroll
        for (int e = 0; e < kElems; ++e) o[e] *= v_scale;
      }
      WriteRowResult<T, D>(p, TileRowTarget(p, token_begin, kv_head, row0 + r), split_idx, o, m, l);
    }
    __syncthreads();  // the next chunk reloads shared memory
  }

  if (p.num_splits > 1) {
    const uint32_t ticket = CountSplitIn(p, request, kv_head, q_tile);
    ArriveAndMerge<T, D>(p, request, kv_head, q_tile, token_begin, tile_rows, ticket);
  }
}

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_ATTENTION_KERNEL_CUH_
