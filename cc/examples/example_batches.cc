#include "cc/examples/example_batches.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace splitkv_example {
namespace {

// A small deterministic generator (the same numbers on every platform, unlike <random>'s
// distributions): uniform floats in [-1, 1).
class Uniform {
 public:
  explicit Uniform(uint32_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float operator()() {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(state_ >> 40) * 0x1.0p-23f - 1.0f;  // 24 bits -> [-1, 1)
  }

 private:
  uint64_t state_;
};

std::vector<float> RandomVector(int64_t n, Uniform& rng) {
  std::vector<float> values(n);
  for (float& x : values) x = rng();
  return values;
}

}  // namespace

PagedDecodeBatch MakePagedDecodeBatch(const std::vector<int32_t>& seq_lens, KvLayout layout, uint32_t seed) {
  Uniform rng(seed);
  PagedDecodeBatch b;
  b.layout = layout;
  b.seq_lens = seq_lens;
  int64_t pages_needed = 0;
  for (int32_t len : seq_lens) {
    const int64_t pages = (len + b.page_size - 1) / b.page_size;
    pages_needed += pages;
    b.max_pages_per_seq = std::max(b.max_pages_per_seq, pages);
  }
  b.max_pages_per_seq = std::max<int64_t>(b.max_pages_per_seq, 1);
  b.num_pages = pages_needed + 1;  // one page nobody owns
  // The i-th page handed out is (7 i + 3) mod num_pages: a permutation unless 7 divides it.
  std::vector<int32_t> order(b.num_pages);
  for (int64_t p = 0; p < b.num_pages; ++p) order[p] = static_cast<int32_t>((p * 7 + 3) % b.num_pages);
  if (std::gcd(int64_t{7}, b.num_pages) != 1) std::iota(order.begin(), order.end(), 0);
  b.block_tables.assign(b.batch_size() * b.max_pages_per_seq, 0);
  int64_t next = 0;
  for (int64_t r = 0; r < b.batch_size(); ++r) {
    const int64_t pages = (seq_lens[r] + b.page_size - 1) / b.page_size;
    for (int64_t i = 0; i < pages; ++i) b.block_tables[r * b.max_pages_per_seq + i] = order[next++];
  }
  b.q = RandomVector(b.batch_size() * b.num_qo_heads * b.head_dim, rng);
  // The whole cache is filled, slots past a sequence's end included: they must not matter.
  b.kv_cache = RandomVector(b.num_pages * 2 * b.num_kv_heads * b.page_size * b.head_dim, rng);
  b.out.assign(b.q.size(), 0.0f);
  b.lse.assign(b.batch_size() * b.num_qo_heads, 0.0f);
  return b;
}

RaggedPrefillBatch MakeRaggedPrefillBatch(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens,
                                          uint32_t seed) {
  Uniform rng(seed);
  RaggedPrefillBatch b;
  b.cu_seqlens_q.assign(1, 0);
  b.cu_seqlens_kv.assign(1, 0);
  for (size_t i = 0; i < q_lens.size(); ++i) {
    b.cu_seqlens_q.push_back(b.cu_seqlens_q.back() + q_lens[i]);
    b.cu_seqlens_kv.push_back(b.cu_seqlens_kv.back() + kv_lens[i]);
  }
  const int64_t total_kv = b.cu_seqlens_kv.back();
  b.q = RandomVector(b.total_q() * b.num_qo_heads * b.head_dim, rng);
  b.k = RandomVector(total_kv * b.num_kv_heads * b.head_dim, rng);
  b.v = RandomVector(total_kv * b.num_kv_heads * b.head_dim, rng);
  b.out.assign(b.q.size(), 0.0f);
  b.lse.assign(b.total_q() * b.num_qo_heads, 0.0f);
  return b;
}

splitkv::SplitPlan RunPagedDecode(PagedDecodeBatch& b, const HostWorkspace& workspace, int32_t num_splits) {
  const PagedKvStrides kv = CombinedCacheStrides(b.layout, b.num_kv_heads, b.page_size, b.head_dim);
  splitkv::PagedAttentionParams p;
  p.q = b.q.data();
  p.q_stride_token = b.num_qo_heads * b.head_dim;
  p.q_stride_head = b.head_dim;
  p.k_cache = b.kv_cache.data();
  p.v_cache = b.kv_cache.data() + kv.v_offset;
  p.k_stride_page = p.v_stride_page = kv.page;
  p.k_stride_head = p.v_stride_head = kv.head;
  p.k_stride_slot = p.v_stride_slot = kv.slot;
  p.block_tables = b.block_tables.data();
  p.block_tables_stride = b.max_pages_per_seq;
  p.seq_lens = b.seq_lens.data();
  p.cu_seqlens_q = nullptr;  // decode: one query token per request
  p.out = b.out.data();
  p.out_stride_token = b.num_qo_heads * b.head_dim;
  p.out_stride_head = b.head_dim;
  p.lse = b.lse.data();
  p.batch_size = b.batch_size();
  p.total_q = b.batch_size();
  p.num_pages = b.num_pages;
  p.page_size = b.page_size;
  p.max_pages_per_seq = b.max_pages_per_seq;
  p.num_qo_heads = b.num_qo_heads;
  p.num_kv_heads = b.num_kv_heads;
  p.head_dim = b.head_dim;
  p.max_q_len = 1;
  p.max_kv_len = b.seq_lens.empty() ? 0 : *std::max_element(b.seq_lens.begin(), b.seq_lens.end());
  p.dtype = splitkv::DType::kFloat32;
  p.backend = splitkv::Backend::kCpu;
  p.options.causal = true;
  p.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(b.head_dim));
  p.options.num_splits = num_splits;
  p.workspace = workspace.buffer();
  return splitkv::LaunchPagedAttention(p);
}

splitkv::SplitPlan RunRaggedPrefill(RaggedPrefillBatch& b, const HostWorkspace& workspace, int32_t num_splits) {
  splitkv::RaggedAttentionParams p;
  p.q = b.q.data();
  p.q_stride_token = b.num_qo_heads * b.head_dim;
  p.q_stride_head = b.head_dim;
  p.k = b.k.data();
  p.v = b.v.data();
  p.k_stride_token = p.v_stride_token = b.num_kv_heads * b.head_dim;
  p.k_stride_head = p.v_stride_head = b.head_dim;
  p.cu_seqlens_q = b.cu_seqlens_q.data();
  p.cu_seqlens_kv = b.cu_seqlens_kv.data();
  p.out = b.out.data();
  p.out_stride_token = b.num_qo_heads * b.head_dim;
  p.out_stride_head = b.head_dim;
  p.lse = b.lse.data();
  p.batch_size = b.batch_size();
  p.total_q = b.total_q();
  p.total_kv = b.cu_seqlens_kv.back();
  p.num_qo_heads = b.num_qo_heads;
  p.num_kv_heads = b.num_kv_heads;
  p.head_dim = b.head_dim;
  // Bounds that size the tile grid and guide the planner (0 would mean total_q / total_kv).
  for (int64_t r = 0; r < b.batch_size(); ++r) {
    p.max_q_len = std::max<int64_t>(p.max_q_len, b.cu_seqlens_q[r + 1] - b.cu_seqlens_q[r]);
    p.max_kv_len = std::max<int64_t>(p.max_kv_len, b.cu_seqlens_kv[r + 1] - b.cu_seqlens_kv[r]);
  }
  p.dtype = splitkv::DType::kFloat32;
  p.backend = splitkv::Backend::kCpu;
  p.options.causal = true;
  p.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(b.head_dim));
  p.options.num_splits = num_splits;
  p.workspace = workspace.buffer();
  return splitkv::LaunchRaggedAttention(p);
}

}  // namespace splitkv_example
