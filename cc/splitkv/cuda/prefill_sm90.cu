// Host side of the Hopper ragged-prefill kernel: eligibility, the three TMA tensor maps
// (tensor_map.h), the launch.
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cc/splitkv/cuda/launch.h"
#include "cc/splitkv/cuda/prefill_sm90.cuh"
#include "cc/splitkv/cuda/prefill_sm90.h"
#include "cc/splitkv/cuda/tensor_map.h"

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

template <typename T, int kHeadDim>
void Launch(const CUtensorMap& q, const CUtensorMap& k, const CUtensorMap& v, const PrefillSm90Params& params,
            int64_t num_ctas, cudaStream_t stream, const char* op) {
  using S = PrefillSm90Shape<kHeadDim>;
  constexpr auto kernel = PrefillSm90Kernel<T, kHeadDim>;
  static std::atomic<uint64_t> done_devices{0};
  int device = 0;
  CheckCuda(cudaGetDevice(&device), op);
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit == 0 || (done_devices.load(std::memory_order_acquire) & bit) == 0) {
    CheckCuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(S::kSmemBytes)),
              op);
    done_devices.fetch_or(bit, std::memory_order_acq_rel);
  }
  kernel<<<static_cast<unsigned>(num_ctas), S::kThreads, S::kSmemBytes, stream>>>(
      q, k, v, params);
  CheckCuda(cudaGetLastError(), op);
}

}  // namespace

bool DeviceRunsSm90a(const char* op) {
  static std::mutex mutex;
  static std::vector<int> known;  // per device: 0 unknown, 1 yes, 2 no
  int device = 0;
  CheckCuda(cudaGetDevice(&device), op);
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(known.size()) <= device) known.resize(device + 1, 0);
  if (known[device] == 0) {
    int major = 0, minor = 0;
    CheckCuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), op);
    CheckCuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), op);
    known[device] = major == 9 && minor == 0 ? 1 : 2;
  }
  return known[device] == 1;
}

bool LaunchRaggedPrefillSm90(const RaggedAttentionParams& p, const SplitPlan& plan, const AttentionKernelParams& k,
                             cudaStream_t stream, const char* op) {
  if ((p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) || plan.num_splits != 1) return false;
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) return false;
  if (p.kv_storage.fp8_e4m3) return false;  // fp8 runs the mma.sync kernel
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  constexpr int kRows = PrefillSm90Shape<128>::kRows;  // the same for every head_dim
  const uint32_t block_n = PrefillSm90BlockKeys(static_cast<int>(p.head_dim));
  if (group < 1 || group > kRows || kRows % group != 0) return false;
  // TMA: 16-byte aligned bases and strides (k.q_vec / k.kv_vec say exactly that).
  if (!k.q_vec || !k.kv_vec || p.total_kv < 1 || p.total_q < 1) return false;
  if (TensorMapsDisabled() || !DeviceRunsSm90a(op)) return false;

  const int64_t tile_tokens = kRows / group;
  const int64_t max_q = p.max_q_len > 0 ? p.max_q_len : p.total_q;
  const int64_t num_q_tiles = (max_q + tile_tokens - 1) / tile_tokens;
  const int64_t num_ctas = p.batch_size * p.num_kv_heads * num_q_tiles;
  if (num_ctas < 1 || num_ctas > 2147483647) return false;

  CUtensorMap tm_q, tm_k, tm_v;
  if (!EncodeMap(&tm_q, p.dtype, p.q, p.head_dim, p.num_qo_heads, p.total_q, p.q_stride_head, p.q_stride_token,
                 static_cast<uint32_t>(group), static_cast<uint32_t>(tile_tokens)) ||
      !EncodeMap(&tm_k, p.dtype, p.k, p.head_dim, p.num_kv_heads, p.total_kv, p.k_stride_head, p.k_stride_token,
                 1, block_n) ||
      !EncodeMap(&tm_v, p.dtype, p.v, p.head_dim, p.num_kv_heads, p.total_kv, p.v_stride_head, p.v_stride_token,
                 1, block_n)) {
    return false;
  }

  PrefillSm90Params params;
  params.p = k;
  params.cu_seqlens_kv = p.cu_seqlens_kv;
  params.q_tile_tokens = static_cast<int32_t>(tile_tokens);
  params.num_q_tiles = static_cast<int32_t>(num_q_tiles);
  const bool bf16 = p.dtype == DType::kBFloat16;
  if (p.head_dim == 64) {
    bf16 ? Launch<__nv_bfloat16, 64>(tm_q, tm_k, tm_v, params, num_ctas, stream, op)
         : Launch<__half, 64>(tm_q, tm_k, tm_v, params, num_ctas, stream, op);
  } else if (p.head_dim == 256) {
    bf16 ? Launch<__nv_bfloat16, 256>(tm_q, tm_k, tm_v, params, num_ctas, stream, op)
         : Launch<__half, 256>(tm_q, tm_k, tm_v, params, num_ctas, stream, op);
  } else {
    bf16 ? Launch<__nv_bfloat16, 128>(tm_q, tm_k, tm_v, params, num_ctas, stream, op)
         : Launch<__half, 128>(tm_q, tm_k, tm_v, params, num_ctas, stream, op);
  }
  return true;
}

}  // namespace splitkv::cuda
