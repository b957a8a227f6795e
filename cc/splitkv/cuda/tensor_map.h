// Tensor maps (TMA descriptors) for the sm_90 kernels: encoded on the host for each call
// through the runtime's driver entry point (no -lcuda link) and passed to the kernels by
// value, so a captured CUDA graph carries them.
#ifndef SPLITKV_CUDA_TENSOR_MAP_H_
#define SPLITKV_CUDA_TENSOR_MAP_H_

#include <cuda.h>

#include <cstdint>

#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/params.h"

namespace splitkv::cuda {

// True when the environment variable SPLITKV_DISABLE_SM90 is set to anything but "0": the
// tensor-map paths are then off (A/B timing): ragged prefill runs the mma.sync kernel and the
// sm_90 paged decode copies rows.
bool TensorMapsDisabled();

// Encodes a float16/bfloat16 tensor of `rank` (1 to 5) dimensions, dims[0] contiguous and
// strides[i - 1] (elements) stepping dimension i, as a map with boxes `box` (elements per
// dimension; box[0] * 2 bytes is 128 or 64), the shared-memory swizzle of that many bytes
// (CU_TENSOR_MAP_SWIZZLE_128B or _64B) and `l2_promotion`
// (how far L2 widens each request of a copy). Returns false when the driver refuses the
// description or has no tensor-map entry point.
bool EncodeTensorMap(CUtensorMap* map, DType dtype, const void* base, int rank, const int64_t* dims,
                     const int64_t* strides, const uint32_t* box, CUtensorMapL2promotion l2_promotion);

// The paged decode kernel's maps of p's cache (kernel_params.h: PagedKvMaps), with boxes of
// min(page_size, block_keys) slots; box_rows == 0 (row copies) when they don't apply:
// head_dim other than 64/128/256, page_size < 8, a base or stride that is not 16-byte aligned,
// k and v with different dimension orders, or the driver refusing the map. Each thread keeps
// its last maps and reuses them while the cache (pointers, strides, shape, dtype) is the same.
PagedKvMaps PagedKvMapsFor(const PagedAttentionParams& p, int block_keys);

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_TENSOR_MAP_H_
