// Host side of the Hopper prefill kernel, ragged and paged: eligibility, the TMA tensor maps
// (tensor_map.h), the launch.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "cc/splitkv/cuda/kv_staging.h"
#include "cc/splitkv/cuda/launch.h"
#include "cc/splitkv/cuda/prefill_sm90.cuh"
#include "cc/splitkv/cuda/prefill_sm90.h"
#include "cc/splitkv/cuda/tensor_map.h"
#include "cc/splitkv/cuda/tile_config.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv::cuda {
namespace {

// A [tokens][heads][head_dim] tensor as a 3-D map with boxes of 64 columns (128 bytes, the
// 128-byte swizzle's width) x box_heads x box_tokens.
bool EncodeMap(CUtensorMap* map, DType dtype, const void* base, int64_t head_dim, int64_t num_heads,
               int64_t num_tokens, int64_t stride_head, int64_t stride_token, uint32_t box_heads,
               uint32_t box_tokens) {
  const int64_t dims[3] = {head_dim, num_heads, num_tokens};
  const int64_t strides[2] = {stride_head, stride_token};
  const uint32_t box[3] = {64, box_heads, box_tokens};
  // 128-byte requests measured the same as 256 here (H200, 4 x 4096 and 1 x 16384, head_dim
  // 128 and 256: docs/perf_log.md), likely because each K/V tile is read by many CTAs and
  // mostly hits in L2, and prefill is bound by its matrix products.
  return EncodeTensorMap(map, dtype, base, 3, dims, strides, box, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

template <typename T, int kHeadDim, bool kPaged, bool kInvariant, int kConsumers>
void Launch(const CUtensorMap& q, const CUtensorMap& k, const CUtensorMap& v, const PrefillSm90Params& params,
            int64_t num_ctas, cudaStream_t stream, const char* op) {
  using S = PrefillSm90Shape<kHeadDim, kConsumers>;
  constexpr auto kernel = PrefillSm90Kernel<T, kHeadDim, kPaged, kInvariant, kConsumers>;
  constexpr size_t kSmemBytes = kInvariant ? S::kInvariantSmemBytes : S::kSmemBytes;
  EnsureSharedMemory<kernel, kSmemBytes>(op);
  LaunchKernel(kernel, dim3(static_cast<unsigned>(num_ctas)), S::kThreads, kSmemBytes, stream, op, q, k, v, params);
}

template <int kHeadDim, bool kPaged, bool kInvariant, int kConsumers = 2>
void LaunchTyped(DType dtype, const CUtensorMap& q, const CUtensorMap& k, const CUtensorMap& v,
                 const PrefillSm90Params& params, int64_t num_ctas, cudaStream_t stream, const char* op) {
  dtype == DType::kBFloat16
      ? Launch<__nv_bfloat16, kHeadDim, kPaged, kInvariant, kConsumers>(q, k, v, params, num_ctas, stream, op)
      : Launch<__half, kHeadDim, kPaged, kInvariant, kConsumers>(q, k, v, params, num_ctas, stream, op);
}

// Batch-invariant calls (head_dim 64 or 128 only: Serves) run their own instances; the tile
// Serves chose (TileRows) picks the consumer count.
template <bool kPaged>
void LaunchFor(DType dtype, int64_t head_dim, const CUtensorMap& q, const CUtensorMap& k, const CUtensorMap& v,
               const PrefillSm90Params& params, int64_t num_ctas, cudaStream_t stream, const char* op) {
  const bool invariant = params.p.invariant_split_keys > 0;
  if (head_dim == 64) {
    const bool three = int64_t{params.q_tile_tokens} * params.p.group_size == PrefillSm90Shape<64, 3>::kRows;
    auto launch = [&](auto invariant_tag) {
      constexpr bool kInvariant = decltype(invariant_tag)::value;
      three ? LaunchTyped<64, kPaged, kInvariant, 3>(dtype, q, k, v, params, num_ctas, stream, op)
            : LaunchTyped<64, kPaged, kInvariant>(dtype, q, k, v, params, num_ctas, stream, op);
    };
    invariant ? launch(std::true_type{}) : launch(std::false_type{});
  } else if (head_dim == 256) {
    LaunchTyped<256, kPaged, false>(dtype, q, k, v, params, num_ctas, stream, op);
  } else {
    invariant ? LaunchTyped<128, kPaged, true>(dtype, q, k, v, params, num_ctas, stream, op)
              : LaunchTyped<128, kPaged, false>(dtype, q, k, v, params, num_ctas, stream, op);
  }
}

// The query rows of a call's tile: 64 a consumer warpgroup (PrefillSm90Consumers), or 128
// where the group does not divide that (0: it divides neither, no tile serves it).
int64_t TileRows(int64_t head_dim, int64_t group) {
  const int64_t rows = 64 * PrefillSm90Consumers(static_cast<int>(head_dim));
  if (group >= 1 && group <= rows && rows % group == 0) return rows;
  return group >= 1 && group <= 128 && 128 % group == 0 ? 128 : 0;
}

// What both operations need of a call (Params: RaggedAttentionParams or
// PagedAttentionParams): the kernel's head_dims and dtypes, one split, 16-bit K/V, a group
// dividing the tile's rows (TileRows), 16-byte-aligned q and k/v, an sm_90a device, and the
// grid's CTAs (returned in num_ctas, with the tile tokens and q tiles in params).
template <typename Params>
bool Serves(const Params& p, const SplitPlan& plan, const AttentionKernelParams& k, const char* op,
            PrefillSm90Params& params, int64_t& num_ctas) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
  // Splits: batch-invariant ones only (head_dim 64 or 128), which the kernel runs in one CTA
  // a tile and merges itself (128-key blocks: every split a whole number of blocks).
  if (plan.invariant_split_keys > 0) {
    // The kernel's invariant instances are compiled for kInvariantSplitKeys (a multiple of
    // the 128-key block).
    if (p.head_dim > 128 || plan.invariant_split_keys != kInvariantSplitKeys) return false;
  } else if (plan.num_splits != 1) {
    return false;
  }
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) return false;
  if (p.kv_storage.fp8_e4m3) return false;  // fp8: its staged 16-bit copy's params come here
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t rows = TileRows(p.head_dim, group);
  if (rows == 0) return false;
  // TMA: 16-byte aligned bases and strides (k.q_vec / k.kv_vec say exactly that).
  if (!k.q_vec || !k.kv_vec || p.total_q < 1) return false;
  if (TensorMapsDisabled() || !DeviceRunsSm90a(op)) return false;

  const int64_t tile_tokens = rows / group;
  const int64_t max_q = p.max_q_len > 0 ? p.max_q_len : p.total_q;
  const int64_t num_q_tiles = (max_q + tile_tokens - 1) / tile_tokens;
  num_ctas = p.batch_size * p.num_kv_heads * num_q_tiles;
  if (num_ctas < 1 || num_ctas > 2147483647) return false;
  params.p = k;
  params.q_tile_tokens = static_cast<int32_t>(tile_tokens);
  params.num_q_tiles = static_cast<int32_t>(num_q_tiles);
  return true;
}

// q as the kernel reads it: boxes of group heads x the tile's tokens.
template <typename Params>
bool EncodeQ(CUtensorMap* map, const Params& p, const PrefillSm90Params& params) {
  return EncodeMap(map, p.dtype, p.q, p.head_dim, p.num_qo_heads, p.total_q, p.q_stride_head, p.q_stride_token,
                   static_cast<uint32_t>(params.p.group_size), static_cast<uint32_t>(params.q_tile_tokens));
}

}  // namespace

bool DeviceRunsSm90a(const char* op) {
  // Two sets of devices: those read, and of them those that run sm_90a. A device's bit in
  // `runs` is published before its bit in `read`, so a reader that sees `read` sees `runs`.
  static std::atomic<uint64_t> read{0}, runs{0};
  int device = 0;
  CheckCuda(cudaGetDevice(&device), op);
  const uint64_t bit = DeviceBit(device);
  if (bit != 0 && (read.load(std::memory_order_acquire) & bit) != 0) {
    return (runs.load(std::memory_order_relaxed) & bit) != 0;
  }
  int major = 0, minor = 0;
  CheckCuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), op);
  CheckCuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), op);
  const bool sm90a = major == 9 && minor == 0;
  if (sm90a) runs.fetch_or(bit, std::memory_order_relaxed);
  read.fetch_or(bit, std::memory_order_release);
  return sm90a;
}

namespace {

// The checks of the launches below before their tensor maps are encoded.
bool RaggedServes(const RaggedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                  const char* op, PrefillSm90Params& params, int64_t& num_ctas) {
  return p.total_kv >= 1 && Serves(p, plan, k, op, params, num_ctas);
}
// One query per request (no cu_seqlens_q) is a decode call: decode tiles, never here. The
// page maps are the decode kernel's (boxes of min(page_size, 64) slots: a power of two
// dividing the 128- or 64-key block), so a serving loop's decode and prefill calls share the
// cached encoding; pages under 8 slots, or caches the maps cannot describe, get none.
bool PagedServes(const PagedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                 const char* op, PrefillSm90Params& params, int64_t& num_ctas, PagedKvMaps& maps) {
  if (p.cu_seqlens_q == nullptr || !Serves(p, plan, k, op, params, num_ctas)) return false;
  maps = PagedKvMapsFor(p, DecodeBlockKeys(static_cast<int>(p.head_dim)));
  return maps.box_rows >= 8 && PrefillSm90BlockKeys(static_cast<int>(p.head_dim)) % maps.box_rows == 0;
}
// A batch-invariant plan as the launchers make it, and the kernel params Serves() reads.
SplitPlan InvariantPlan() {
  SplitPlan plan;
  plan.invariant_split_keys = kInvariantSplitKeys;
  return plan;
}
AttentionKernelParams VecFlags(bool q_vec, bool kv_vec) {
  AttentionKernelParams k{};
  k.q_vec = q_vec;
  k.kv_vec = kv_vec;
  return k;
}

// The 16-bit launches (fp8 calls come here with their staged copy's params): the kernel's
// checks and tensor maps, then `before_launch()` (the fp8 copy, or nothing), then the kernel.
// Nothing is enqueued when they return false.
template <typename BeforeLaunch>
bool LaunchRagged16(const RaggedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                    cudaStream_t stream, const char* op, BeforeLaunch before_launch) {
  PrefillSm90Params params;
  int64_t num_ctas = 0;
  if (!RaggedServes(p, plan, k, op, params, num_ctas)) return false;
  const uint32_t block_n = PrefillSm90BlockKeys(static_cast<int>(p.head_dim));
  CUtensorMap tm_q, tm_k, tm_v;
  if (!EncodeQ(&tm_q, p, params) ||
      !EncodeMap(&tm_k, p.dtype, p.k, p.head_dim, p.num_kv_heads, p.total_kv, p.k_stride_head, p.k_stride_token,
                 1, block_n) ||
      !EncodeMap(&tm_v, p.dtype, p.v, p.head_dim, p.num_kv_heads, p.total_kv, p.v_stride_head, p.v_stride_token,
                 1, block_n)) {
    return false;
  }
  before_launch();
  params.cu_seqlens_kv = p.cu_seqlens_kv;
  LaunchFor<false>(p.dtype, p.head_dim, tm_q, tm_k, tm_v, params, num_ctas, stream, op);
  return true;
}

template <typename BeforeLaunch>
bool LaunchPaged16(const PagedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                   const PagedKvParams& kv, cudaStream_t stream, const char* op, BeforeLaunch before_launch) {
  PrefillSm90Params params;
  int64_t num_ctas = 0;
  PagedKvMaps maps{};
  if (!PagedServes(p, plan, k, op, params, num_ctas, maps)) return false;
  CUtensorMap tm_q;
  if (!EncodeQ(&tm_q, p, params)) return false;
  before_launch();
  params.paged = kv;
  params.box_rows = maps.box_rows;
  params.slot_inner = maps.slot_inner;
  LaunchFor<true>(p.dtype, p.head_dim, tm_q, maps.k, maps.v, params, num_ctas, stream, op);
  return true;
}

// fp8 K/V (default mode, one split): a 16-bit copy of the call's K/V in the workspace
// (workspace_layout.h StagedKvLayout, kv_staging.h), then the 16-bit kernel over the copy,
// applying k_scale and v_scale (the kernel params keep kv_fp8 and the scales). Where the
// workspace is too short for the copy, or the kernel would not serve the copy, nothing is
// enqueued and the mma.sync kernel runs the call over the fp8 bytes. Batch-invariant fp8
// calls stay there too: their prefill and decode rows share that kernel's reduction order.
// The copy's extra bytes (a 16-bit write and read of each K/V row the call reads) are small
// beside a prefill's products: the mma.sync kernel ran fp8 prefill at 3.8-4.4x the bf16
// call's time (H100, docs/perf_log.md session 47).
bool StagedKvFits(const AttentionKernelParams& k, const SplitPlan& plan) {
  return plan.invariant_split_keys == 0 && plan.num_splits == 1 && k.kv_vec;
}

uint8_t* WorkspaceBase(const WorkspaceBuffer& w) { return static_cast<uint8_t*>(w.data); }

// The kernel params over the copy: kv_fp8 and the scales stay (the kernel applies them); the
// copy is 256-byte aligned with rows of 64+ elements.
AttentionKernelParams StagedKernelParams(const AttentionKernelParams& k) {
  AttentionKernelParams staged = k;
  staged.kv_vec = true;
  return staged;
}

bool LaunchStagedRagged(const RaggedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                        cudaStream_t stream, const char* op) {
  // The copy kernel's index math is 32-bit (kv_staging.cu).
  if (!StagedKvFits(k, plan) || p.total_kv < 1 || p.total_kv * p.num_kv_heads > 2147483647) return false;
  const int64_t row_bytes = p.num_kv_heads * p.head_dim * 2;
  if (p.total_kv > p.workspace.bytes / row_bytes / 2) return false;
  const StagedKvLayout layout = ComputeStagedKvLayout(p.total_kv, row_bytes, 0);
  if (p.workspace.bytes < layout.required_bytes) return false;
  RaggedAttentionParams staged = p;  // the copy: [total_kv, num_kv_heads, head_dim] of q's dtype
  staged.kv_storage = KvStorage{};
  staged.k = WorkspaceBase(p.workspace) + layout.k_offset;
  staged.v = WorkspaceBase(p.workspace) + layout.v_offset;
  staged.k_stride_token = staged.v_stride_token = p.num_kv_heads * p.head_dim;
  staged.k_stride_head = staged.v_stride_head = p.head_dim;
  return LaunchRagged16(staged, plan, StagedKernelParams(k), stream, op, [&] {
    StageRaggedKv(p, const_cast<void*>(staged.k), const_cast<void*>(staged.v), stream, op);
  });
}

// The paged copy is an HND cache of batch_size * max_pages_per_seq pages (request b's page j
// at b * max_pages_per_seq + j, its own block table in the workspace too), so its size is
// known on the host without reading seq_lens: a block table much wider than the requests'
// pages needs a larger workspace for the copy.
bool LaunchStagedPaged(const PagedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                       const PagedKvParams& kv, cudaStream_t stream, const char* op) {
  // The copy kernel's index math is 32-bit within a page (kv_staging.cu).
  if (!StagedKvFits(k, plan) || p.cu_seqlens_q == nullptr ||
      p.num_kv_heads * p.page_size * (p.head_dim / 8) > 2147483647) {
    return false;
  }
  const int64_t page_bytes = p.page_size * p.num_kv_heads * p.head_dim * 2;
  if (p.max_pages_per_seq > p.workspace.bytes / page_bytes / 2 / std::max<int64_t>(p.batch_size, 1)) return false;
  const int64_t pages = p.batch_size * p.max_pages_per_seq;
  if (pages < 1 || pages > 2147483647) return false;
  const StagedKvLayout layout = ComputeStagedKvLayout(pages * p.page_size, p.num_kv_heads * p.head_dim * 2, pages);
  if (p.workspace.bytes < layout.required_bytes) return false;
  PagedAttentionParams staged = p;  // the copy: [pages, num_kv_heads, page_size, head_dim] of q's dtype
  staged.kv_storage = KvStorage{};
  staged.k_cache = WorkspaceBase(p.workspace) + layout.k_offset;
  staged.v_cache = WorkspaceBase(p.workspace) + layout.v_offset;
  staged.k_stride_page = staged.v_stride_page = p.num_kv_heads * p.page_size * p.head_dim;
  staged.k_stride_head = staged.v_stride_head = p.page_size * p.head_dim;
  staged.k_stride_slot = staged.v_stride_slot = p.head_dim;
  staged.num_pages = pages;
  auto* const table = reinterpret_cast<int32_t*>(WorkspaceBase(p.workspace) + layout.table_offset);
  staged.block_tables = table;
  staged.block_tables_stride = p.max_pages_per_seq;
  return LaunchPaged16(staged, plan, StagedKernelParams(k), PagedKvParamsOf(staged), stream, op, [&] {
    StagePagedKv(p, kv, const_cast<void*>(staged.k_cache), const_cast<void*>(staged.v_cache), table, stream, op);
  });
}

}  // namespace

bool RaggedPrefillSm90ServesInvariant(const RaggedAttentionParams& p, bool q_vec, bool kv_vec, const char* op) {
  PrefillSm90Params params;
  int64_t num_ctas = 0;
  return RaggedServes(p, InvariantPlan(), VecFlags(q_vec, kv_vec), op, params, num_ctas);
}

bool PagedPrefillSm90ServesInvariant(const PagedAttentionParams& p, bool q_vec, bool kv_vec, const char* op) {
  PrefillSm90Params params;
  int64_t num_ctas = 0;
  PagedKvMaps maps{};
  return PagedServes(p, InvariantPlan(), VecFlags(q_vec, kv_vec), op, params, num_ctas, maps);
}

bool LaunchRaggedPrefillSm90(const RaggedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                             cudaStream_t stream, const char* op) {
  if (p.kv_storage.fp8_e4m3) return LaunchStagedRagged(p, plan, k, stream, op);
  return LaunchRagged16(p, plan, k, stream, op, [] {});
}

bool LaunchPagedPrefillSm90(const PagedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                            const PagedKvParams& kv, cudaStream_t stream, const char* op) {
  if (p.kv_storage.fp8_e4m3) return LaunchStagedPaged(p, plan, k, kv, stream, op);
  return LaunchPaged16(p, plan, k, kv, stream, op, [] {});
}

}  // namespace splitkv::cuda
