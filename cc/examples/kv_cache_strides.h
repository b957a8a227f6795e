// Element strides of a combined paged KV cache, for PagedAttentionParams. splitkv's public
// headers describe HND and NHD only in a comment (params.h), so the example spells them out:
//
//   HND: kv_cache [num_pages, 2, num_kv_heads, page_size, head_dim]
//   NHD: kv_cache [num_pages, 2, page_size, num_kv_heads, head_dim]
//
// In both, index 0 of the second dimension is k and 1 is v, so v_cache = k_cache + v_offset.
#ifndef SPLITKV_EXAMPLES_KV_CACHE_STRIDES_H_
#define SPLITKV_EXAMPLES_KV_CACHE_STRIDES_H_

#include <cstdint>

namespace splitkv_example {

enum class KvLayout { kHND, kNHD };

struct PagedKvStrides {
  int64_t page;      // between pages (k and v of a page together)
  int64_t head;      // between kv heads
  int64_t slot;      // between tokens of a page
  int64_t v_offset;  // from a page's k to its v
};

constexpr PagedKvStrides CombinedCacheStrides(KvLayout layout, int64_t num_kv_heads, int64_t page_size,
                                              int64_t head_dim) {
  const int64_t half = num_kv_heads * page_size * head_dim;
  if (layout == KvLayout::kHND) return {2 * half, page_size * head_dim, head_dim, half};
  return {2 * half, head_dim, num_kv_heads * head_dim, half};
}

}  // namespace splitkv_example

#endif  // SPLITKV_EXAMPLES_KV_CACHE_STRIDES_H_
