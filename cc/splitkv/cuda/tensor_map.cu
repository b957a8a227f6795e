#include "cc/splitkv/cuda/tensor_map.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

namespace splitkv::cuda {
namespace {

// cuTensorMapEncodeTiled's signature (driver API), reached through the runtime.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn EncodeTiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();  // not sticky; leave no error for the next check
      return EncodeTiledFn{nullptr};
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A box of 8 rows of 128 bytes is one 128-byte-swizzle atom (1024 bytes; 8 rows of 64 bytes
// one 64-byte-swizzle atom, 512), so every box lands on an atom boundary in shared memory and
// the kernel's swizzled addressing holds; smaller pages keep row copies.
constexpr int64_t kMinBoxRows = 8;

}  // namespace

bool TensorMapsDisabled() {
  const char* v = std::getenv("SPLITKV_DISABLE_SM90");
  return v != nullptr && v[0] != '\0' && !(v[0] == '0' && v[1] == '\0');
}

bool EncodeTensorMap(CUtensorMap* map, DType dtype, const void* base, int rank, const int64_t* dims,
                     const int64_t* strides, const uint32_t* box, CUtensorMapL2promotion l2_promotion) {
  const EncodeTiledFn encode = EncodeTiled();
  if (encode == nullptr || rank < 1 || rank > 5) return false;
  cuuint64_t global_dims[5], global_strides[4];
  cuuint32_t box_dims[5], element_strides[5];
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 1) return false;
    global_dims[i] = static_cast<cuuint64_t>(dims[i]);
    box_dims[i] = box[i];
    element_strides[i] = 1;
    if (i > 0) {
      if (strides[i - 1] < 1) return false;
      global_strides[i - 1] = static_cast<cuuint64_t>(strides[i - 1]) * 2;
    }
  }
  // The swizzle spans a box row: 128 bytes, or 64 (an fp8 cache's rows at head_dim 64).
  if (box[0] * 2 != 128 && box[0] * 2 != 64) return false;
  const CUtensorMapSwizzle swizzle = box[0] * 2 == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const CUtensorMapDataType type =
      dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), global_dims, global_strides,
                box_dims, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

namespace {

// What a paged cache's maps depend on: a serving loop passes the same cache every step, so
// the last two encodings are kept per thread and the driver's encoding runs once per cache
// (two: an fp8 cache's decode calls alternate with its prefill chunks' 16-bit copy in the
// workspace, prefill_sm90.cu).
struct PagedMapsKey {
  const void* k;
  const void* v;
  int64_t k_strides[3], v_strides[3];
  int64_t num_pages, page_size, num_kv_heads, head_dim;
  DType dtype;
  bool fp8;
  int block_keys;

  bool operator==(const PagedMapsKey& o) const {
    return k == o.k && v == o.v && std::equal(k_strides, k_strides + 3, o.k_strides) &&
           std::equal(v_strides, v_strides + 3, o.v_strides) && num_pages == o.num_pages &&
           page_size == o.page_size && num_kv_heads == o.num_kv_heads && head_dim == o.head_dim &&
           dtype == o.dtype && fp8 == o.fp8 && block_keys == o.block_keys;
  }
};

PagedKvMaps EncodePagedKvMaps(const PagedAttentionParams& p, int block_keys) {
  PagedKvMaps maps{};  // box_rows 0 until both maps are encoded
  if ((p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) || p.page_size < kMinBoxRows) return maps;
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) return maps;
  // An fp8 cache's bytes travel as 16-bit words (the decode kernel converts them): a row of
  // head_dim bytes is head_dim / 2 words; at head_dim 64 that is a 64-byte box row, staged
  // with the 64-byte swizzle (decode_kernel.cuh RowSwizzle).
  const int64_t per_word = p.kv_storage.fp8_e4m3 ? 2 : 1;
  const uint32_t box_cols = static_cast<uint32_t>(std::min<int64_t>(64, p.head_dim / per_word));
  if (p.num_pages > 2147483647 || !Aligned16(p.k_cache) || !Aligned16(p.v_cache)) return maps;
  // Dimensions in ascending stride order: slot then head (HND), or head then slot (NHD).
  const bool slot_inner = p.k_stride_slot <= p.k_stride_head;
  if (slot_inner != (p.v_stride_slot <= p.v_stride_head)) return maps;
  const int64_t rows = std::min<int64_t>(p.page_size, block_keys);
  const int64_t mid[2] = {slot_inner ? p.page_size : p.num_kv_heads, slot_inner ? p.num_kv_heads : p.page_size};
  const uint32_t box[4] = {box_cols, static_cast<uint32_t>(slot_inner ? rows : 1),
                           static_cast<uint32_t>(slot_inner ? 1 : rows), 1};
  const int64_t dims[4] = {p.head_dim / per_word, mid[0], mid[1], p.num_pages};
  int64_t k_strides[3] = {slot_inner ? p.k_stride_slot : p.k_stride_head,
                          slot_inner ? p.k_stride_head : p.k_stride_slot, p.k_stride_page};
  int64_t v_strides[3] = {slot_inner ? p.v_stride_slot : p.v_stride_head,
                          slot_inner ? p.v_stride_head : p.v_stride_slot, p.v_stride_page};
  for (int64_t& s : k_strides) {
    if (s % (8 * per_word) != 0) return maps;
    s /= per_word;
  }
  for (int64_t& s : v_strides) {
    if (s % (8 * per_word) != 0) return maps;
    s /= per_word;
  }
  // Requests stay the boxes' 128-byte lines (an fp8 cache at head_dim 64 has 64-byte rows: a
  // line then takes the next row's or, NHD, the next head's bytes too; measured on HND only).
  // Widened to 256 bytes (what the prefill maps use) the same decode kernel took 6-8 % longer on
  // grids of many CTAs at head_dim 64, 128 and 256 (64 x 4096 d128: 262.5 against 245.3 us; 16 x
  // 4096 70.3 / 65.1; 1 x 32768 39.5 / 37.1) on the H200, K/V read once at evict-first priority;
  // d256 split grids (one CTA an SM) moved under 1 %. Not over-fetch: at head_dim 64 a box's
  // rows are one contiguous run and it cost as much. 64 bytes and no promotion measured the same
  // as 128. Measured on HND caches; NHD maps take the same setting (docs/perf_log.md, sixth
  // session).
  constexpr CUtensorMapL2promotion kPromotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  if (!EncodeTensorMap(&maps.k, p.dtype, p.k_cache, 4, dims, k_strides, box, kPromotion) ||
      !EncodeTensorMap(&maps.v, p.dtype, p.v_cache, 4, dims, v_strides, box, kPromotion)) {
    return maps;
  }
  maps.box_rows = static_cast<int32_t>(rows);
  maps.slot_inner = slot_inner;
  return maps;
}

}  // namespace

PagedKvMaps PagedKvMapsFor(const PagedAttentionParams& p, int block_keys) {
  // The environment switch is read every call (tests flip it), so it is not part of the cache.
  if (TensorMapsDisabled()) return PagedKvMaps{};
  const PagedMapsKey key{p.k_cache,
                         p.v_cache,
                         {p.k_stride_page, p.k_stride_head, p.k_stride_slot},
                         {p.v_stride_page, p.v_stride_head, p.v_stride_slot},
                         p.num_pages,
                         p.page_size,
                         p.num_kv_heads,
                         p.head_dim,
                         p.dtype,
                         p.kv_storage.fp8_e4m3,
                         block_keys};
  struct Entry {
    bool used = false;
    PagedMapsKey key;
    PagedKvMaps maps;
  };
  thread_local Entry entries[2];  // entries[0] the most recent
  if (entries[0].used && entries[0].key == key) return entries[0].maps;
  if (entries[1].used && entries[1].key == key) {
    std::swap(entries[0], entries[1]);
    return entries[0].maps;
  }
  entries[1] = entries[0];
  entries[0].maps = EncodePagedKvMaps(p, block_keys);
  entries[0].key = key;
  entries[0].used = true;
  return entries[0].maps;
}

}  // namespace splitkv::cuda
