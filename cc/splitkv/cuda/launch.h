// Host-side entry points of the per-head_dim kernel files (attention_hd{64,128,256}.cu), one
// file per head_dim so nvcc compiles them in parallel. Called by backend_cuda.cu only.
#ifndef SPLITKV_CUDA_LAUNCH_H_
#define SPLITKV_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/cuda/tile_config.h"
#include "cc/splitkv/params.h"

namespace splitkv::cuda {

// Throws CudaError("<op>: <cudaGetErrorString>") unless err is cudaSuccess.
void CheckCuda(cudaError_t err, const char* op);

// Whether the current device runs the fatbin's sm_90a code (bulk copies, TMA, wgmma): compute
// capability exactly 9.0, since arch-specific sm_90a code loads on no other device and the
// other image is sm_80's. Read once per device (devices 0-63; others on every call), without a
// lock: every launch asks (LaunchKernel).
bool DeviceRunsSm90a(const char* op);

// Device numbers with a bit in a 64-bit set (devices 0-63), else 0.
inline uint64_t DeviceBit(int device) { return device >= 0 && device < 64 ? uint64_t{1} << device : 0; }

// Lets kKernel use kSmemBytes of dynamic shared memory on the current device (kernels above
// 48 KiB must opt in, per device). The attribute call is not a stream operation (safe during
// graph capture); it runs once per device and kernel instance (devices 0-63; others on every
// launch).
template <auto kKernel, size_t kSmemBytes>
void EnsureSharedMemory(const char* op) {
  static std::atomic<uint64_t> done_devices{0};
  int device = 0;
  CheckCuda(cudaGetDevice(&device), op);
  const uint64_t bit = DeviceBit(device);
  if (bit != 0 && (done_devices.load(std::memory_order_acquire) & bit) != 0) return;
  CheckCuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)),
            op);
  done_devices.fetch_or(bit, std::memory_order_acq_rel);
}

// The smallest n with 2^n >= x (x >= 1): the shift of a power of two the launchers checked.
inline int CeilLog2(int64_t x) {
  int n = 0;
  while ((int64_t{1} << n) < x) ++n;
  return n;
}

// The kernels' view of a paged call's cache, page table and lengths (page_size a power of
// two on CUDA, as the launchers check).
inline PagedKvParams PagedKvParamsOf(const PagedAttentionParams& p) {
  PagedKvParams kv;
  kv.k = p.k_cache;
  kv.v = p.v_cache;
  kv.k_stride_page = p.k_stride_page;
  kv.k_stride_head = p.k_stride_head;
  kv.k_stride_slot = p.k_stride_slot;
  kv.v_stride_page = p.v_stride_page;
  kv.v_stride_head = p.v_stride_head;
  kv.v_stride_slot = p.v_stride_slot;
  kv.block_tables = p.block_tables;
  kv.block_tables_stride = p.block_tables_stride;
  kv.seq_lens = p.seq_lens;
  kv.page_size_log2 = CeilLog2(p.page_size);
  return kv;
}

// Enqueues kernel<<<grid, threads, smem_bytes, stream>>>(args...) and checks the launch.
// Where the sm_90a image runs (DeviceRunsSm90a: its kernels hold the wait below, which the
// sm_80 image compiles out), the launch allows programmatic stream serialization: the
// kernel's CTAs may be scheduled once the previous kernel's CTAs have exited (or, if that
// kernel says so, earlier), before its grid has completed, which takes part of the launch's
// latency off the critical path (0.3-3.4 % on decode calls under 20 us, H100,
// docs/perf_log.md session 46). Every kernel launched here therefore calls
// GridDependencyWait before its first global memory access (ptx.cuh). FlashInfer launches
// its sm_90 decode kernels the same way by default (enable_pdl).
template <typename... Params, typename... Args>
void LaunchKernel(void (*kernel)(Params...), dim3 grid, unsigned threads, size_t smem_bytes, cudaStream_t stream,
                  const char* op, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = DeviceRunsSm90a(op) ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, args...);
  (void)cudaGetLastError();  // a failed launch leaves no sticky error for a later op to report
  CheckCuda(err, op);
}

// Enqueues one launch of num_tiles x num_splits CTAs (kind: decode or prefill tiles). `maps`
// (box_rows > 0) lets the sm_90 decode kernel fetch page runs by tensor copies;
// `split_workers` is the planner's worker count for decode tiles (split-grid CTAs that fit
// on the device at once), `sm_count` the device's SMs (read by head_dim 64's decode route
// only; other calls may pass 0).
template <int kHeadDim>
void LaunchPaged(DType dtype, TileKind kind, const AttentionKernelParams& params, const PagedKvParams& kv,
                 const PagedKvMaps& maps, int64_t num_tiles, int64_t split_workers, int64_t sm_count,
                 cudaStream_t stream, const char* op);
template <int kHeadDim>
void LaunchRagged(DType dtype, TileKind kind, const AttentionKernelParams& params, const RaggedKvParams& kv,
                  int64_t num_tiles, int64_t split_workers, cudaStream_t stream, const char* op);

// CTAs of the paged kernel for (kind, kHeadDim, an fp8 cache or not, tiles of at most
// max_tile_rows query rows) that fit on one SM of the current device.
template <int kHeadDim>
int ResidentCtasPerSm(TileKind kind, bool kv_fp8, int64_t max_tile_rows, const char* op);

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_LAUNCH_H_
