// The example's two batches, in float32 on the CPU: a paged decode batch (one new token per
// request over a paged KV cache) and a ragged prefill batch (packed prompts). Each Make*
// fills deterministic pseudo-random data; each Run* fills a params struct and launches.
#ifndef SPLITKV_EXAMPLES_EXAMPLE_BATCHES_H_
#define SPLITKV_EXAMPLES_EXAMPLE_BATCHES_H_

#include <cstdint>
#include <vector>

#include "cc/examples/host_workspace.h"
#include "cc/examples/kv_cache_strides.h"
#include "cc/splitkv/launchers.h"

namespace splitkv_example {

struct PagedDecodeBatch {
  int64_t num_qo_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  int64_t page_size = 16;
  KvLayout layout = KvLayout::kHND;
  int64_t num_pages = 0;
  int64_t max_pages_per_seq = 0;
  std::vector<int32_t> seq_lens;      // [batch_size], KV length of each request
  std::vector<int32_t> block_tables;  // [batch_size, max_pages_per_seq], page ids
  std::vector<float> q;               // [batch_size, num_qo_heads, head_dim]
  std::vector<float> kv_cache;        // [num_pages, 2, ...] in `layout`
  std::vector<float> out;             // [batch_size, num_qo_heads, head_dim]
  std::vector<float> lse;             // [batch_size, num_qo_heads]

  int64_t batch_size() const { return static_cast<int64_t>(seq_lens.size()); }
};

struct RaggedPrefillBatch {
  int64_t num_qo_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  std::vector<int32_t> cu_seqlens_q;   // [batch_size + 1]
  std::vector<int32_t> cu_seqlens_kv;  // [batch_size + 1]
  std::vector<float> q;                // [total_q, num_qo_heads, head_dim]
  std::vector<float> k, v;             // [total_kv, num_kv_heads, head_dim]
  std::vector<float> out;              // [total_q, num_qo_heads, head_dim]
  std::vector<float> lse;              // [total_q, num_qo_heads]

  int64_t batch_size() const { return static_cast<int64_t>(cu_seqlens_q.size()) - 1; }
  int64_t total_q() const { return cu_seqlens_q.back(); }
};

// Pages are handed out in a scrambled order, as a page allocator would after some churn.
PagedDecodeBatch MakePagedDecodeBatch(const std::vector<int32_t>& seq_lens, KvLayout layout, uint32_t seed);
RaggedPrefillBatch MakeRaggedPrefillBatch(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens,
                                          uint32_t seed);

// num_splits: 0 lets the planner choose (and fit the workspace); >= 1 forces it.
// Returns the plan the call used. Throws splitkv::InvalidArgument (and subclasses).
splitkv::SplitPlan RunPagedDecode(PagedDecodeBatch& batch, const HostWorkspace& workspace, int32_t num_splits);
splitkv::SplitPlan RunRaggedPrefill(RaggedPrefillBatch& batch, const HostWorkspace& workspace, int32_t num_splits);

}  // namespace splitkv_example

#endif  // SPLITKV_EXAMPLES_EXAMPLE_BATCHES_H_
