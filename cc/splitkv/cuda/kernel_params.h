// What one attention launch passes to the device, by value: the same kernel serves the paged
// and the ragged operation, and only the KV source differs (kv_source.cuh). Built on the host
// by the launch code from PagedAttentionParams / RaggedAttentionParams and the SplitPlan.
#ifndef SPLITKV_CUDA_KERNEL_PARAMS_H_
#define SPLITKV_CUDA_KERNEL_PARAMS_H_

#include <cuda.h>  // CUtensorMap (a plain struct; no driver library is linked)

#include <cstdint>

#include "cc/splitkv/workspace_layout.h"

namespace splitkv::cuda {

struct AttentionKernelParams {
  // q [total_q, num_qo_heads, head_dim], out likewise; strides in elements.
  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  void* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0;
  float* lse = nullptr;  // [total_q, num_qo_heads] or null
  // cu_seqlens_q [batch_size + 1], or null for one query per request.
  const int32_t* cu_seqlens_q = nullptr;
  // Paged calls only, both or neither (params.h PagedAttentionParams): [batch_size] int32;
  // request b's query i sits at local key position full_seq_lens[b] - kv_offsets[b] - q_len + i
  // (QueryStart). Null: kv_len - q_len + i.
  const int32_t* kv_offsets = nullptr;
  const int32_t* full_seq_lens = nullptr;

  int32_t num_kv_heads = 0;
  int32_t group_size = 0;  // qo heads per kv head
  // Work tiles: blockIdx.x enumerates (request, kv_head, q_tile); blockIdx.y is the split.
  int32_t q_tile_tokens = 1;
  int32_t max_q_tiles = 1;
  // The most query rows a tile holds: group_size x min(q_tile_tokens, max_q_len) (at head_dim
  // 128 an fp8 split grid of at most one wave with at most 8 rows runs the decode kernel's
  // keys-as-rows shape: attention_launch.cuh). Unset, it reads as more than any tile holds.
  int32_t max_tile_rows = 1 << 30;
  int32_t num_splits = 1;
  // Batch-invariant mode: keys per split at absolute positions (split_plan.h
  // InvariantSplitKeyRange); 0: the default split rule.
  int32_t invariant_split_keys = 0;
  LayoutShape layout_shape;  // total_q, num_qo_heads, head_dim, for PartialIndex

  bool causal = true;
  int32_t window_left = -1;
  float logits_soft_cap = 0.0f;
  float sm_scale = 1.0f;
  // Attention sinks [num_qo_heads] float32, or null (params.h: AttentionOptions::sinks);
  // read only where a row's final result is written (RowWithSink in split_merge.cuh).
  const float* sinks = nullptr;
  // An fp8 (float8 e4m3fn) K/V cache (params.h: KvStorage): true value = stored x scale, the
  // per-kv-head arrays when non-null. The mma.sync kernel (fp8 sources) and the bulk decode
  // kernel (fp8 shapes) read the fp8 bytes; the wgmma prefill reads a 16-bit copy of them
  // (prefill_sm90.h) and applies the scales alike.
  bool kv_fp8 = false;
  float k_scale = 1.0f, v_scale = 1.0f;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;

  // Workspace regions, from the plan's layout (unused with num_splits == 1).
  uint32_t* counters = nullptr;
  float* stats = nullptr;     // float2 {max, sum_exp} per partial
  float* partials = nullptr;  // head_dim floats per partial
  // The workspace's status record (workspace_layout.h) and its optional pinned host mirror.
  uint32_t* status = nullptr;
  uint32_t* status_host = nullptr;

  // 16-byte vector access is legal (base and every stride multiples of 8 elements).
  bool q_vec = false;
  bool out_vec = false;
  bool kv_vec = false;
};

// Keys of a paged cache: element (page, kv_head, slot, d) at
// page * stride_page + kv_head * stride_head + slot * stride_slot + d.
struct PagedKvParams {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_stride_page = 0, k_stride_head = 0, k_stride_slot = 0;
  int64_t v_stride_page = 0, v_stride_head = 0, v_stride_slot = 0;
  const int32_t* block_tables = nullptr;
  int64_t block_tables_stride = 0;
  const int32_t* seq_lens = nullptr;
  int32_t page_size_log2 = 0;
};

// Tensor maps of a paged cache for the sm_90 decode kernel's copies of whole page runs
// (tensor_map.h builds them): dimensions (d, slot, kv_head, page) when slot_inner, else
// (d, kv_head, slot, page), so the strides ascend as the driver expects; boxes of 64
// columns (128 bytes, the swizzle's width) x box_rows slots of one head and one page,
// 128-byte swizzled in shared memory. box_rows == 0: no maps, the kernel copies rows.
struct PagedKvMaps {
  CUtensorMap k;
  CUtensorMap v;
  int32_t box_rows = 0;  // min(page_size, DecodeBlockKeys (64)); a power of two
  bool slot_inner = true;
};

// Keys of packed (ragged) k, v: request b owns tokens cu_seqlens_kv[b]..cu_seqlens_kv[b+1].
struct RaggedKvParams {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_stride_token = 0, k_stride_head = 0;
  int64_t v_stride_token = 0, v_stride_head = 0;
  const int32_t* cu_seqlens_kv = nullptr;
};

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_KERNEL_PARAMS_H_
