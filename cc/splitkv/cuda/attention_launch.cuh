// Template bodies of launch.h: pick the kernel instance, raise its shared-memory limit once
// per device, launch, check. Included by the per-head_dim .cu files only.
#ifndef SPLITKV_CUDA_ATTENTION_LAUNCH_CUH_
#define SPLITKV_CUDA_ATTENTION_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cc/splitkv/cuda/attention_kernel.cuh"
#include "cc/splitkv/cuda/decode_kernel.cuh"
#include "cc/splitkv/cuda/kv_source.cuh"
#include "cc/splitkv/cuda/launch.h"

namespace splitkv::cuda {

template <int kHeadDim>
using DecodeShape = KernelShape<kHeadDim, 1, DecodeBlockKeys(kHeadDim), DecodeStages(kHeadDim)>;
template <int kHeadDim>
using PrefillShape = KernelShape<kHeadDim, 4, PrefillBlockKeys(kHeadDim), 2>;

// One kernel instance. Kernels above 48 KiB of dynamic shared memory must opt in, per
// device; the attribute call is not a stream operation (safe during graph capture) and runs
// once per device and instance.
template <typename T, class Shape, template <typename> class KvSourceT>
struct KernelInstance {
  static constexpr auto kKernel = AttentionKernel<T, Shape, KvSourceT>;

  static void EnsureSharedMemory(const char* op) {
    static std::atomic<uint64_t> done_devices{0};
    int device = 0;
    CheckCuda(cudaGetDevice(&device), op);
    const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
    if (bit != 0 && (done_devices.load(std::memory_order_acquire) & bit) != 0) return;
    CheckCuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Shape::kSmemBytes)),
              op);
    done_devices.fetch_or(bit, std::memory_order_acq_rel);
  }

  static void Launch(const AttentionKernelParams& params, const typename KvSourceT<T>::Params& kv, int64_t num_tiles,
                     cudaStream_t stream, const char* op) {
    EnsureSharedMemory(op);
    const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(params.num_splits));
    kKernel<<<grid, kThreads, Shape::kSmemBytes, stream>>>(params, kv);
    CheckCuda(cudaGetLastError(), op);
  }

  static int ResidentCtasPerSm(const char* op) {
    EnsureSharedMemory(op);
    int ctas = 0;
    CheckCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kKernel, kThreads, Shape::kSmemBytes), op);
    return ctas;
  }
};

template <int kHeadDim>
using BulkDecodeShapeFor = BulkDecodeShape<kHeadDim, DecodeBlockKeys(kHeadDim), BulkDecodeStages(kHeadDim)>;
template <int kHeadDim>
using BulkDecodeSplitShapeFor = BulkDecodeShape<kHeadDim, DecodeBlockKeys(kHeadDim), BulkDecodeSplitStages(kHeadDim)>;

// The bulk-copy decode kernel (decode_kernel.cuh): same launch shape as KernelInstance.
template <typename T, class Shape>
struct BulkDecodeInstance {
  static constexpr auto kKernel = BulkDecodeKernel<T, Shape>;

  static void EnsureSharedMemory(const char* op) {
    static std::atomic<uint64_t> done_devices{0};
    int device = 0;
    CheckCuda(cudaGetDevice(&device), op);
    const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
    if (bit != 0 && (done_devices.load(std::memory_order_acquire) & bit) != 0) return;
    CheckCuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Shape::kSmemBytes)),
              op);
    done_devices.fetch_or(bit, std::memory_order_acq_rel);
  }

  static void Launch(const AttentionKernelParams& params, const PagedKvParams& kv, int64_t num_tiles,
                     cudaStream_t stream, const char* op) {
    EnsureSharedMemory(op);
    const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(params.num_splits));
    kKernel<<<grid, kThreads, Shape::kSmemBytes, stream>>>(params, kv);
    CheckCuda(cudaGetLastError(), op);
  }

  static int ResidentCtasPerSm(const char* op) {
    EnsureSharedMemory(op);
    int ctas = 0;
    CheckCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kKernel, kThreads, Shape::kSmemBytes), op);
    return ctas;
  }
};

// Bulk copies (cp.async.bulk) exist from compute capability 9.0 on, but the fatbin holds
// machine code for sm_90a and sm_80 only: a newer major would need code built for it (a
// PTX-only JIT of the sm_80 pass would trap in the bulk-copy wrappers), so exactly 9.
// Read once per device.
inline bool DeviceHasBulkCopy(const char* op) {
  static std::atomic<uint64_t> known{0}, has{0};
  int device = 0;
  CheckCuda(cudaGetDevice(&device), op);
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (known.load(std::memory_order_acquire) & bit) != 0) {
    return (has.load(std::memory_order_acquire) & bit) != 0;
  }
  int major = 0;
  CheckCuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), op);
  if (major == 9) has.fetch_or(bit, std::memory_order_acq_rel);
  known.fetch_or(bit, std::memory_order_acq_rel);
  return major == 9;
}

template <typename T, int kHeadDim>
void LaunchPagedTyped(TileKind kind, const AttentionKernelParams& params, const PagedKvParams& kv, int64_t num_tiles,
                      cudaStream_t stream, const char* op) {
  if (kind == TileKind::kDecode) {
    if (params.kv_vec && DeviceHasBulkCopy(op)) {
      // Split grids have short CTAs: 2 stages fit a third on each SM (tile_config.h).
      if (params.num_splits > 1) {
        return BulkDecodeInstance<T, BulkDecodeSplitShapeFor<kHeadDim>>::Launch(params, kv, num_tiles, stream, op);
      }
      return BulkDecodeInstance<T, BulkDecodeShapeFor<kHeadDim>>::Launch(params, kv, num_tiles, stream, op);
    }
    KernelInstance<T, DecodeShape<kHeadDim>, PagedKvSource>::Launch(params, kv, num_tiles, stream, op);
  } else {
    KernelInstance<T, PrefillShape<kHeadDim>, PagedKvSource>::Launch(params, kv, num_tiles, stream, op);
  }
}

template <int kHeadDim>
void LaunchPaged(DType dtype, TileKind kind, const AttentionKernelParams& params, const PagedKvParams& kv,
                 int64_t num_tiles, cudaStream_t stream, const char* op) {
  if (dtype == DType::kBFloat16) {
    LaunchPagedTyped<__nv_bfloat16, kHeadDim>(kind, params, kv, num_tiles, stream, op);
  } else {
    LaunchPagedTyped<__half, kHeadDim>(kind, params, kv, num_tiles, stream, op);
  }
}

template <int kHeadDim>
void LaunchRagged(DType dtype, const AttentionKernelParams& params, const RaggedKvParams& kv, int64_t num_tiles,
                  cudaStream_t stream, const char* op) {
  if (dtype == DType::kBFloat16) {
    KernelInstance<__nv_bfloat16, PrefillShape<kHeadDim>, RaggedKvSource>::Launch(params, kv, num_tiles, stream, op);
  } else {
    KernelInstance<__half, PrefillShape<kHeadDim>, RaggedKvSource>::Launch(params, kv, num_tiles, stream, op);
  }
}

template <int kHeadDim>
int ResidentCtasPerSm(TileKind kind, const char* op) {
  if (kind == TileKind::kDecode) {
    // Workers for the planner: the kernel a split grid of an aligned cache runs (strided
    // caches, rare, run the cp.async kernel with these workers). The planner splits only
    // grids short of 80 % of these; an unsplit grid runs 3 stages (fewer CTAs an SM).
    if (DeviceHasBulkCopy(op)) {
      return BulkDecodeInstance<__nv_bfloat16, BulkDecodeSplitShapeFor<kHeadDim>>::ResidentCtasPerSm(op);
    }
    return KernelInstance<__nv_bfloat16, DecodeShape<kHeadDim>, PagedKvSource>::ResidentCtasPerSm(op);
  }
  return KernelInstance<__nv_bfloat16, PrefillShape<kHeadDim>, PagedKvSource>::ResidentCtasPerSm(op);
}

#define SPLITKV_INSTANTIATE_HEAD_DIM(D)                                                                            \
  template void LaunchPaged<D>(DType, TileKind, const AttentionKernelParams&, const PagedKvParams&, int64_t,       \
                               cudaStream_t, const char*);                                                        \
  template void LaunchRagged<D>(DType, const AttentionKernelParams&, const RaggedKvParams&, int64_t, cudaStream_t, \
                                const char*);                                                                     \
  template int ResidentCtasPerSm<D>(TileKind, const char*);

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_ATTENTION_LAUNCH_CUH_
