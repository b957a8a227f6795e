// MergeStates on CUDA (merge_states.h): one warp per (token, head) row. Each lane derives
// the row's M and total from the row's lses itself (n loads of one broadcast line), then
// merges its columns: kVec elements a load where the rows allow 16-byte vectors. The same
// float32 arithmetic and state order as the CPU loop (cpu/merge_cpu.cc).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "cc/splitkv/backend.h"
#include "cc/splitkv/cuda/launch.h"
#include "cc/splitkv/merge_states.h"

namespace splitkv::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void Store(float* p, float x) { *p = x; }
__device__ __forceinline__ void Store(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// kVec elements of T as 16 bytes (kVec * sizeof(T) == 16), or one element (kVec == 1).
template <typename T, int kVec>
struct Chunk {
  T v[kVec];
};

template <typename T, int kVec>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) MergeStatesKernel(MergeStatesParams p) {
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.total_q * p.num_qo_heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = row / p.num_qo_heads;
  const int64_t h = row % p.num_qo_heads;
  const float* lses = p.lses + t * p.lses_stride_token + h * p.lses_stride_head;
  float m = -INFINITY;
  for (int64_t s = 0; s < p.num_states; ++s) {
    const float x = lses[s * p.lses_stride_state];
    if (x > m || isnan(x)) m = isnan(m) ? m : x;
  }
  if (m == -INFINITY) m = 0.0f;  // no state saw a key: keeps exp away from -inf - -inf
  float total = 0.0f;
  for (int64_t s = 0; s < p.num_states; ++s) {
    const float x = lses[s * p.lses_stride_state];
    total += x == -INFINITY ? 0.0f : expf(x - m);
  }
  const float safe_total = total > 0.0f ? total : 1.0f;
  const T* outs = static_cast<const T*>(p.outs) + t * p.outs_stride_token + h * p.outs_stride_head;
  T* out = static_cast<T*>(p.out) + t * p.out_stride_token + h * p.out_stride_head;
  for (int64_t d = int64_t{lane} * kVec; d < p.head_dim; d += 32 * kVec) {
    float acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
    for (int64_t s = 0; s < p.num_states; ++s) {
      const float x = lses[s * p.lses_stride_state];
      const float w = x == -INFINITY ? 0.0f : expf(x - m);
      if (w == 0.0f) continue;  // exactly 0, even where outs[s] is NaN
      const float scale = __fdiv_rn(w, safe_total);
      const Chunk<T, kVec> c = *reinterpret_cast<const Chunk<T, kVec>*>(outs + s * p.outs_stride_state + d);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(scale, Load(&c.v[i])));
    }
    Chunk<T, kVec> r;
#pragma unroll
    for (int i = 0; i < kVec; ++i) Store(&r.v[i], acc[i]);
    *reinterpret_cast<Chunk<T, kVec>*>(out + d) = r;
  }
  if (lane == 0) p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = m + logf(total);
}

template <typename T>
void LaunchTyped(const MergeStatesParams& p) {
  constexpr int kVec = 16 / sizeof(T);
  // 16-byte vectors when every row start is 16-byte aligned and head_dim fills them.
  const bool vec = p.head_dim % kVec == 0 && reinterpret_cast<uintptr_t>(p.outs) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.outs_stride_state % kVec == 0 &&
                   p.outs_stride_token % kVec == 0 && p.outs_stride_head % kVec == 0 &&
                   p.out_stride_token % kVec == 0 && p.out_stride_head % kVec == 0;
  const int64_t rows = p.total_q * p.num_qo_heads;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 2147483647) {
    throw InvalidArgument("merge_states: total_q * num_qo_heads out of range: expected at most " +
                          std::to_string(int64_t{2147483647} * kWarpsPerBlock) + " rows, got " +
                          std::to_string(rows));
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (vec) {
    MergeStatesKernel<T, kVec><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(p);
  } else {
    MergeStatesKernel<T, 1><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(p);
  }
  CheckCuda(cudaGetLastError(), "merge_states");
}

}  // namespace

void MergeStates(const MergeStatesParams& p) {
  switch (p.dtype) {
    case DType::kFloat32: return LaunchTyped<float>(p);
    case DType::kFloat16: return LaunchTyped<__half>(p);
    case DType::kBFloat16: return LaunchTyped<__nv_bfloat16>(p);
  }
}

}  // namespace splitkv::cuda
