// Parameters of the two operations, as plain pointers, shapes and strides: the C++ core
// never sees a torch tensor, so it builds once and works with any torch version or none.
//
// Conventions: strides are in elements (not bytes); the innermost (head_dim) stride of
// every tensor is 1. Index arrays (block_tables, seq_lens, cu_seqlens_*) are int32. On the
// CPU backend every pointer is host memory; on the CUDA backend every pointer is device
// memory of the current device and `stream` is the cudaStream_t the call runs on.
#ifndef SPLITKV_PARAMS_H_
#define SPLITKV_PARAMS_H_

#include <cstdint>

namespace splitkv {

// Element type of q, k, v and out (codes are stable: the Python binding passes them).
enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Where the call runs.
enum class Backend : int32_t { kCpu = 0, kCuda = 1 };

// Options shared by both operations.
struct AttentionOptions {
  // Mask the upper triangle, aligned to the end of the KV: query token i of a request
  // with q_len queries and kv_len keys sees keys j <= kv_len - q_len + i.
  bool causal = true;
  // Sliding window: -1 for none, else a query at position p sees keys j >= p - window_left.
  int32_t window_left = -1;
  // Soft cap c > 0 replaces a scaled logit s by c * tanh(s / c); 0 disables it.
  float logits_soft_cap = 0.0f;
  // Multiplies q.k before the softmax (natural units); the caller sets it, usually
  // 1/sqrt(head_dim).
  float sm_scale = 1.0f;
  // 0: the planner chooses (and lowers it to fit the workspace); >= 1: forced, and the
  // call is refused if the workspace cannot hold it.
  int32_t num_splits = 0;
};

// The caller's workspace: bytes [0, kCounterRegionBytes) must be zero at rest (zeroed
// once when made); the base must be kWorkspaceAlignment-aligned. The call never frees it.
struct WorkspaceBuffer {
  void* data = nullptr;
  int64_t bytes = 0;  // the buffer's real size
};

// Attention over a paged KV cache (decode, speculative decode, chunked prefill).
struct PagedAttentionParams {
  // q [total_q, num_qo_heads, head_dim]; request b owns rows cu_seqlens_q[b]..cu_seqlens_q[b+1]
  // (one row per request when cu_seqlens_q is null).
  const void* q = nullptr;
  int64_t q_stride_token = 0;
  int64_t q_stride_head = 0;
  // k and v pages: element (page, kv_head, slot, d) is at
  // page * k_stride_page + kv_head * k_stride_head + slot * k_stride_slot + d (same for v).
  // HND [num_pages, num_kv_heads, page_size, head_dim] and NHD
  // [num_pages, page_size, num_kv_heads, head_dim] are two choices of these strides.
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  int64_t k_stride_page = 0, k_stride_head = 0, k_stride_slot = 0;
  int64_t v_stride_page = 0, v_stride_head = 0, v_stride_slot = 0;
  // block_tables [batch_size, max_pages_per_seq]: page ids of each request, in order.
  const int32_t* block_tables = nullptr;
  int64_t block_tables_stride = 0;  // elements between rows
  // seq_lens [batch_size]: KV length of each request (tokens, including its new queries).
  const int32_t* seq_lens = nullptr;
  // cu_seqlens_q [batch_size + 1] or null (then total_q == batch_size).
  const int32_t* cu_seqlens_q = nullptr;
  // out [total_q, num_qo_heads, head_dim], same dtype as q.
  void* out = nullptr;
  int64_t out_stride_token = 0;
  int64_t out_stride_head = 0;
  // lse [total_q, num_qo_heads] float32 contiguous, or null: natural-log log-sum-exp of
  // the scaled (and capped) logits over the visible keys; -inf for a row that sees none.
  float* lse = nullptr;

  int64_t batch_size = 0;
  int64_t total_q = 0;
  int64_t num_pages = 0;
  int64_t page_size = 0;
  int64_t max_pages_per_seq = 0;
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // Upper bound on q_len over requests (1 for decode); sizes the tile grid.
  int64_t max_q_len = 1;
  // Upper bound on seq_lens (guides the num_splits heuristic only); 0 means
  // max_pages_per_seq * page_size.
  int64_t max_kv_len = 0;

  DType dtype = DType::kFloat16;
  Backend backend = Backend::kCpu;
  void* stream = nullptr;  // cudaStream_t for Backend::kCuda; unused on the CPU
  AttentionOptions options;
  WorkspaceBuffer workspace;
};

// Attention over ragged (variable-length, packed) q, k, v: prefill.
struct RaggedAttentionParams {
  // q [total_q, num_qo_heads, head_dim]; k, v [total_kv, num_kv_heads, head_dim].
  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  const void* k = nullptr;
  int64_t k_stride_token = 0, k_stride_head = 0;
  const void* v = nullptr;
  int64_t v_stride_token = 0, v_stride_head = 0;
  // cu_seqlens_q, cu_seqlens_kv [batch_size + 1]: prefix sums of q_len and kv_len, from 0.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_kv = nullptr;
  void* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0;
  float* lse = nullptr;  // [total_q, num_qo_heads] float32 contiguous, or null

  int64_t batch_size = 0;
  int64_t total_q = 0;
  int64_t total_kv = 0;
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_q_len = 0;   // upper bound on q_len over requests; 0 means total_q
  int64_t max_kv_len = 0;  // upper bound on kv_len (heuristic only); 0 means total_kv

  DType dtype = DType::kFloat16;
  Backend backend = Backend::kCpu;
  void* stream = nullptr;
  AttentionOptions options;
  WorkspaceBuffer workspace;
};

}  // namespace splitkv

#endif  // SPLITKV_PARAMS_H_
