// Host entry of the Hopper ragged-prefill kernel (prefill_sm90.cuh), called by
// backend_cuda.cu before the mma.sync kernel.
#ifndef SPLITKV_CUDA_PREFILL_SM90_H_
#define SPLITKV_CUDA_PREFILL_SM90_H_

#include <cuda_runtime.h>

#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"

namespace splitkv::cuda {

// Enqueues the call on the sm_90a wgmma kernel and returns true when that kernel serves it:
// a compute capability 9.0 device, float16/bfloat16, head_dim 64, 128 or 256, one split, a group size
// dividing 128, q/k/v 16-byte aligned with strides in multiples of 8 elements, and tensor
// maps the driver accepts. Returns false (nothing enqueued) otherwise, or when the
// environment variable SPLITKV_DISABLE_SM90 is set to anything but "0" (A/B timing).
// `k` holds the params the mma.sync kernel would get (same plan).
bool LaunchRaggedPrefillSm90(const RaggedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                             cudaStream_t stream, const char* op);

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_PREFILL_SM90_H_
