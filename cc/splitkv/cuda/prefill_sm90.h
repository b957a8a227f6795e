// Host entries of the Hopper prefill kernel (prefill_sm90.cuh), ragged and paged, called by
// backend_cuda.cu before the mma.sync kernel.
#ifndef SPLITKV_CUDA_PREFILL_SM90_H_
#define SPLITKV_CUDA_PREFILL_SM90_H_

#include <cuda_runtime.h>

#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"

namespace splitkv::cuda {

// Enqueues the call on the sm_90a wgmma kernel and returns true when that kernel serves it:
// a compute capability 9.0 device, float16/bfloat16, head_dim 64, 128 or 256, one split (or a
// batch-invariant plan's splits at head_dim 64/128, merged inside the kernel), a group size
// dividing the tile's query rows (128; at head_dim 64 192, or else 128),
// q/k/v 16-byte aligned with strides in multiples of 8 elements, and tensor maps the driver
// accepts. Returns false (nothing enqueued) otherwise, or when the
// environment variable SPLITKV_DISABLE_SM90 is set to anything but "0" (A/B timing).
// `k` holds the params the mma.sync kernel would get (same plan).
bool LaunchRaggedPrefillSm90(const RaggedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                             cudaStream_t stream, const char* op);

// The same for a paged call's prefill tiles (cu_seqlens_q set), whose 16-bit cache the
// decode kernel's page maps describe (tensor_map.h PagedKvMapsFor): HND or NHD, pages of 8
// slots or more (a power of two), 16-byte-aligned pages and strides. Query positions follow
// kv_offsets / full_seq_lens when set. Not served, and left to the mma.sync kernel: pages
// under 8 slots, plans of more than one split (batch-invariant ones aside), and the cases
// above. `kv` is the mma.sync kernel's view of the cache (its page table and lengths are
// read).
//
// Both launches serve fp8 (e4m3) K/V outside batch-invariant calls by first copying the K/V
// the call reads into the workspace as 16-bit values (workspace_layout.h StagedKvLayout,
// kv_staging.h), where the workspace holds the copy; else they decline, as above.
bool LaunchPagedPrefillSm90(const PagedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                            const PagedKvParams& kv, cudaStream_t stream, const char* op);

// Whether the two launches above would serve a batch-invariant call of these params (the
// same checks, given the q and K/V 16-byte vector flags), short of encoding the tensor maps,
// which only the launch does: a map the driver refuses is the one way they can differ.
bool RaggedPrefillSm90ServesInvariant(const RaggedAttentionParams& p, bool q_vec, bool kv_vec, const char* op);
bool PagedPrefillSm90ServesInvariant(const PagedAttentionParams& p, bool q_vec, bool kv_vec, const char* op);

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_PREFILL_SM90_H_
