// Random paged and ragged attention problems for the launcher tests, in any dtype, with a
// float64 copy of the same (rounded) values for the reference. Buffers are deliberately
// awkward: q and out have padded token strides, out's padding holds a sentinel, unused
// cache slots and pages hold NaN, unused block_tables entries hold a page id far out of range.
#ifndef SPLITKV_TESTS_CC_ATTENTION_PROBLEMS_H_
#define SPLITKV_TESTS_CC_ATTENTION_PROBLEMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/splitkv/params.h"
#include "tests/cc/reference.h"
#include "tests/cc/test_dtypes.h"

namespace splitkv_test {

// Sentinel in out's padding: a call must not write there.
inline constexpr double kOutSentinel = 7.0;

struct ProblemSpec {
  splitkv::DType dtype = splitkv::DType::kFloat32;
  int64_t num_qo_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  std::vector<int32_t> kv_lens;
  // Queries per request. Paged: empty means decode (one token each, no cu_seqlens_q).
  std::vector<int32_t> q_lens;
  // Paged only.
  int64_t page_size = 16;
  bool nhd = false;  // kv_cache [num_pages, 2, page_size, num_kv_heads, head_dim] instead of HND
  // Separate k and v caches [num_pages, ...], k in the layout `nhd` picks and v in the other.
  bool separate_kv = false;
  // Both empty, or [batch_size] each: the keys as shards of longer requests (params.h).
  std::vector<int32_t> kv_offsets, full_seq_lens;
  // sm_scale is set to 1/sqrt(head_dim) when left at 0.
  splitkv::AttentionOptions options = {.causal = true, .window_left = -1, .logits_soft_cap = 0.0f, .sm_scale = 0.0f,
                                       .num_splits = 0};
  uint32_t seed = 1;

  std::string Describe() const;
};

// What both problem kinds share: q, out, lse and the reference's packed copy.
struct ProblemBase {
  ProblemSpec spec;
  int64_t batch_size = 0, total_q = 0, max_q_len = 0;
  TypedArray q;  // [total_q, q_stride_token] with q_stride_head = head_dim
  int64_t q_stride_token = 0;
  TypedArray out;  // [total_q, out_stride_token], padding = kOutSentinel
  int64_t out_stride_token = 0;
  std::vector<float> lse;
  std::vector<int32_t> cu_q, cu_kv;  // prefix sums, for the reference (and the ragged call)
  std::vector<double> q_ref, k_ref, v_ref;

  // out as [total_q, num_qo_heads, head_dim] doubles.
  std::vector<double> Out() const;
  std::vector<double> Lse() const { return std::vector<double>(lse.begin(), lse.end()); }
  // True when no padding element of out changed.
  bool OutPaddingIntact() const;
  // Resets out to the sentinel and lse to NaN, so a result is never left over.
  void ClearOutputs();
  ReferenceResult Reference() const;
};

// Where k (or v) lives: element (page, kv_head, slot, d) of the cache is at
// base + page * page_stride + kv_head * head_stride + slot * slot_stride + d in `array`.
struct CacheView {
  TypedArray* array;
  int64_t base, page_stride, head_stride, slot_stride;
};

struct PagedProblem : ProblemBase {
  TypedArray kv_cache;          // [num_pages, 2, ...] unless spec.separate_kv
  TypedArray k_cache, v_cache;  // [num_pages, ...] when spec.separate_kv
  std::vector<int32_t> block_tables;  // [batch_size, block_tables_stride]; columns past a
  int64_t block_tables_stride = 0;    // request's pages hold a page id far out of range
  std::vector<int32_t> seq_lens;
  int64_t num_pages = 0, max_pages_per_seq = 0;

  CacheView KView();
  CacheView VView();

  splitkv::PagedAttentionParams Params(void* workspace, int64_t workspace_bytes, int32_t num_splits);
};

struct RaggedProblem : ProblemBase {
  // k and v interleaved per head: kv [total_kv, num_kv_heads, 2, head_dim].
  TypedArray kv;
  int64_t total_kv = 0;

  splitkv::RaggedAttentionParams Params(void* workspace, int64_t workspace_bytes, int32_t num_splits);
};

PagedProblem MakePagedProblem(const ProblemSpec& spec);
RaggedProblem MakeRaggedProblem(const ProblemSpec& spec);

// Tolerances for out in the given dtype (atol, rtol), beyond the float64 reference.
struct Tolerance {
  double atol, rtol;
};
Tolerance OutTolerance(splitkv::DType dtype);
// lse is float32 for every dtype.
inline constexpr Tolerance kLseTolerance = {2e-4, 2e-5};

}  // namespace splitkv_test

#endif  // SPLITKV_TESTS_CC_ATTENTION_PROBLEMS_H_
