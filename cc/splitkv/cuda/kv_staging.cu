// The staging copies of kv_staging.h: fp8 bytes in, 16-bit values out, 8 elements a thread
// step through Fp8ChunkTo (attention_kernel.cuh: the backend's one fp8 dequantisation).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cc/splitkv/cuda/attention_kernel.cuh"  // Fp8ChunkTo
#include "cc/splitkv/cuda/kv_staging.h"
#include "cc/splitkv/cuda/launch.h"
#include "cc/splitkv/cuda/ptx.cuh"

namespace splitkv::cuda {
namespace {

constexpr int kStageThreads = 256;

// 8 fp8 elements at src (8-byte aligned), streamed (read once), to 8 of T at dst.
template <typename T>
__device__ __forceinline__ void StageChunk(T* dst, const uint8_t* src) {
  const uint2 w = __ldcs(reinterpret_cast<const uint2*>(src));
  const uint32_t word[2] = {w.x, w.y};
  *reinterpret_cast<uint4*>(dst) = Fp8ChunkTo<T>(word);
}

// Chunk i of [total_kv, num_kv_heads, head_dim / 8] in both k and v (grid-stride).
template <typename T>
__global__ void __launch_bounds__(kStageThreads) StageRaggedKvKernel(const uint8_t* k, const uint8_t* v, T* k_out, T* v_out,
                                                                 int64_t k_stride_token, int64_t k_stride_head,
                                                                 int64_t v_stride_token, int64_t v_stride_head,
                                                                 int32_t num_kv_heads, int32_t chunks_log2,
                                                                 int64_t num_chunks) {
  GridDependencyWait();  // before the first global access (ptx.cuh)
  const int64_t step = int64_t{gridDim.x} * kStageThreads;
  for (int64_t i = int64_t{blockIdx.x} * kStageThreads + threadIdx.x; i < num_chunks; i += step) {
    // 32-bit division (the host checked total_kv * num_kv_heads fits int32): a 64-bit one
    // is a long instruction sequence, per 16 bytes of output.
    const int c = static_cast<int>(i) & ((1 << chunks_log2) - 1);
    const uint32_t row = static_cast<uint32_t>(i >> chunks_log2);
    const int64_t head = row % static_cast<uint32_t>(num_kv_heads), token = row / static_cast<uint32_t>(num_kv_heads);
    StageChunk(k_out + i * 8, k + token * k_stride_token + head * k_stride_head + c * 8);
    StageChunk(v_out + i * 8, v + token * v_stride_token + head * v_stride_head + c * 8);
  }
}

// One CTA a (request, page of its table): the copy's table entry, then the page's slots
// that hold keys (HND out: [page][head][slot][d]).
template <typename T>
__global__ void __launch_bounds__(kStageThreads) StagePagedKvKernel(PagedKvParams kv, T* k_out, T* v_out,
                                                                int32_t* table_out, int32_t max_pages,
                                                                int32_t num_kv_heads, int32_t chunks_log2) {
  GridDependencyWait();
  const int32_t entry = static_cast<int32_t>(blockIdx.x);
  if (threadIdx.x == 0) table_out[entry] = entry;
  const int request = entry / max_pages, page = entry - request * max_pages;
  const int page_size = 1 << kv.page_size_log2;
  const int keys = LoadInput(kv.seq_lens + request) - page * page_size;
  if (keys <= 0) return;
  const int slots = min(keys, page_size);
  const int64_t src_page = LoadInput(kv.block_tables + request * kv.block_tables_stride + page);
  const auto* k = static_cast<const uint8_t*>(kv.k) + src_page * kv.k_stride_page;
  const auto* v = static_cast<const uint8_t*>(kv.v) + src_page * kv.v_stride_page;
  const int64_t page_elems = int64_t{num_kv_heads} << (kv.page_size_log2 + chunks_log2 + 3);
  T* const k_dst = k_out + entry * page_elems;
  T* const v_dst = v_out + entry * page_elems;
  const int chunks = num_kv_heads * slots << chunks_log2;  // int32: the host checked a page's
  for (int i = threadIdx.x; i < chunks; i += kStageThreads) {
    const int c = i & ((1 << chunks_log2) - 1), row = i >> chunks_log2;
    const int head = row / slots, slot = row - head * slots;
    const int64_t dst = ((int64_t{head} << kv.page_size_log2) + slot) * (8 << chunks_log2) + c * 8;
    StageChunk(k_dst + dst, k + head * kv.k_stride_head + slot * kv.k_stride_slot + c * 8);
    StageChunk(v_dst + dst, v + head * kv.v_stride_head + slot * kv.v_stride_slot + c * 8);
  }
}

template <typename T>
void LaunchRagged(const RaggedAttentionParams& p, void* k_out, void* v_out, cudaStream_t stream, const char* op) {
  const int chunks_log2 = CeilLog2(p.head_dim / 8);
  const int64_t num_chunks = p.total_kv * p.num_kv_heads << chunks_log2;
  if (num_chunks == 0) return;
  int device = 0, sms = 0;
  CheckCuda(cudaGetDevice(&device), op);
  CheckCuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), op);
  // Eight CTAs an SM of 256 threads, each thread two chunks a step: enough loads in flight
  // for the DRAM, and few enough CTAs that each loops.
  const int64_t blocks = std::min<int64_t>((num_chunks + kStageThreads - 1) / kStageThreads, int64_t{sms} * 8);
  LaunchKernel(StageRaggedKvKernel<T>, dim3(static_cast<unsigned>(blocks)), kStageThreads, 0, stream, op,
               static_cast<const uint8_t*>(p.k), static_cast<const uint8_t*>(p.v), static_cast<T*>(k_out),
               static_cast<T*>(v_out), p.k_stride_token, p.k_stride_head, p.v_stride_token, p.v_stride_head,
               static_cast<int32_t>(p.num_kv_heads), chunks_log2, num_chunks);
}

template <typename T>
void LaunchPaged(const PagedAttentionParams& p, const PagedKvParams& kv, void* k_out, void* v_out,
                 int32_t* table_out, cudaStream_t stream, const char* op) {
  const int64_t entries = p.batch_size * p.max_pages_per_seq;
  if (entries == 0) return;
  LaunchKernel(StagePagedKvKernel<T>, dim3(static_cast<unsigned>(entries)), kStageThreads, 0, stream, op, kv,
               static_cast<T*>(k_out), static_cast<T*>(v_out), table_out, static_cast<int32_t>(p.max_pages_per_seq),
               static_cast<int32_t>(p.num_kv_heads), CeilLog2(p.head_dim / 8));
}

}  // namespace

void StageRaggedKv(const RaggedAttentionParams& p, void* k_out, void* v_out, cudaStream_t stream, const char* op) {
  p.dtype == DType::kBFloat16 ? LaunchRagged<__nv_bfloat16>(p, k_out, v_out, stream, op)
                              : LaunchRagged<__half>(p, k_out, v_out, stream, op);
}

void StagePagedKv(const PagedAttentionParams& p, const PagedKvParams& kv, void* k_out, void* v_out, int32_t* table_out,
                  cudaStream_t stream, const char* op) {
  p.dtype == DType::kBFloat16 ? LaunchPaged<__nv_bfloat16>(p, kv, k_out, v_out, table_out, stream, op)
                              : LaunchPaged<__half>(p, kv, k_out, v_out, table_out, stream, op);
}

}  // namespace splitkv::cuda
