// Where a (request, kv head)'s keys live. The kernel asks a bound source for key j's and
// value j's rows (head_dim contiguous elements each), j in [0, kv_len).
#ifndef SPLITKV_CUDA_KV_SOURCE_CUH_
#define SPLITKV_CUDA_KV_SOURCE_CUH_

#include <cstdint>

#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/cuda/ptx.cuh"

namespace splitkv::cuda {

// One byte of a float8 e4m3fn KV cache (attention_kernel.cuh's CopyChunk dequantises it).
struct Fp8E4M3 {
  uint8_t bits;
};

template <typename T>
struct PagedKvSource {
  using Params = PagedKvParams;
  using Elem = T;  // what a row holds
  const T* k;
  const T* v;
  const int32_t* pages;
  int64_t k_stride_page, k_stride_slot, v_stride_page, v_stride_slot;
  int32_t shift, slot_mask;
  int32_t kv_len;

  __device__ PagedKvSource(const PagedKvParams& p, int32_t request, int32_t kv_head)
      : k(static_cast<const T*>(p.k) + kv_head * p.k_stride_head),
        v(static_cast<const T*>(p.v) + kv_head * p.v_stride_head),
        pages(p.block_tables + request * p.block_tables_stride),
        k_stride_page(p.k_stride_page),
        k_stride_slot(p.k_stride_slot),
        v_stride_page(p.v_stride_page),
        v_stride_slot(p.v_stride_slot),
        shift(p.page_size_log2),
        slot_mask((1 << p.page_size_log2) - 1),
        kv_len(LoadInput(p.seq_lens + request)) {}

  // Key j's and value j's rows (one page-table read for both).
  __device__ void Rows(int32_t j, const T*& key, const T*& value) const { RowsInPage(PageOf(j), j, key, value); }

  // The two halves of Rows, so a caller can read the page id well before it needs the rows.
  __device__ int32_t PageOf(int32_t j) const { return LoadInput(pages + (j >> shift)); }
  __device__ void RowsInPage(int64_t page, int32_t j, const T*& key, const T*& value) const {
    const int64_t slot = j & slot_mask;
    key = k + page * k_stride_page + slot * k_stride_slot;
    value = v + page * v_stride_page + slot * v_stride_slot;
  }
};

template <typename T>
struct RaggedKvSource {
  using Params = RaggedKvParams;
  using Elem = T;
  const T* k;
  const T* v;
  int64_t k_stride_token, v_stride_token;
  int32_t kv_len;

  __device__ RaggedKvSource(const RaggedKvParams& p, int32_t request, int32_t kv_head)
      : k_stride_token(p.k_stride_token), v_stride_token(p.v_stride_token) {
    const int32_t begin = LoadInput(p.cu_seqlens_kv + request);
    kv_len = LoadInput(p.cu_seqlens_kv + request + 1) - begin;
    k = static_cast<const T*>(p.k) + begin * p.k_stride_token + kv_head * p.k_stride_head;
    v = static_cast<const T*>(p.v) + begin * p.v_stride_token + kv_head * p.v_stride_head;
  }

  __device__ void Rows(int32_t j, const T*& key, const T*& value) const {
    key = k + j * k_stride_token;
    value = v + j * v_stride_token;
  }

  // The paged source's two halves, with a page of one row (the sm_90 decode kernel's row
  // copies read rows this way; batch-invariant ragged calls run that kernel).
  static constexpr int32_t slot_mask = 0;
  __device__ int32_t PageOf(int32_t j) const { return j; }
  __device__ void RowsInPage(int64_t page, int32_t, const T*& key, const T*& value) const {
    Rows(static_cast<int32_t>(page), key, value);
  }
};

// The sources of an fp8 cache, for a kernel whose q and out are T (the mma.sync kernel,
// which takes its source as a template of T).
template <typename T>
struct PagedFp8KvSource : PagedKvSource<Fp8E4M3> {
  using PagedKvSource<Fp8E4M3>::PagedKvSource;
};
template <typename T>
struct RaggedFp8KvSource : RaggedKvSource<Fp8E4M3> {
  using RaggedKvSource<Fp8E4M3>::RaggedKvSource;
};

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_KV_SOURCE_CUH_
