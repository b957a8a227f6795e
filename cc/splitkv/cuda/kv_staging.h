// A 16-bit copy of an fp8 call's K/V in the workspace (workspace_layout.h StagedKvLayout),
// for the Hopper prefill (prefill_sm90.cu), whose wgmma kernel reads 16-bit K/V only. The
// copy holds the stored values, exactly (every e4m3 value is a float16 and a bfloat16 value);
// the kernel applies k_scale and v_scale as the fp8 kernels do.
#ifndef SPLITKV_CUDA_KV_STAGING_H_
#define SPLITKV_CUDA_KV_STAGING_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/params.h"

namespace splitkv::cuda {

// Enqueues the copy of a ragged call's k and v ([total_kv, num_kv_heads, head_dim] fp8, 8-byte
// aligned rows: the caller checked KvVec) into k_out and v_out, each [total_kv, num_kv_heads,
// head_dim] of p.dtype, contiguous.
void StageRaggedKv(const RaggedAttentionParams& p, void* k_out, void* v_out, cudaStream_t stream, const char* op);

// Enqueues the copy of a paged call's pages (`kv`: the kernels' view of its cache, page table
// and lengths) into a contiguous HND cache of p.dtype: request
// b's page j (j < ceil(seq_lens[b] / page_size)) becomes page b * max_pages_per_seq + j of
// k_out / v_out ([batch_size * max_pages_per_seq, num_kv_heads, page_size, head_dim]), and
// table_out [batch_size, max_pages_per_seq] gets b * max_pages_per_seq + j in every entry,
// the copy's block_tables. Pages past a request's keys are neither read nor written.
void StagePagedKv(const PagedAttentionParams& p, const PagedKvParams& kv, void* k_out, void* v_out, int32_t* table_out,
                  cudaStream_t stream, const char* op);

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_KV_STAGING_H_
