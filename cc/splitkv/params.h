// Parameters of the two operations, as plain pointers, shapes and strides: the C++ core
// never sees a torch tensor, so it builds once and works with any torch version or none.
//
// Conventions: strides are in elements (not bytes) and >= 0; the innermost (head_dim)
// stride of every tensor is 1 (each head's head_dim elements are contiguous). Index arrays
// (block_tables, seq_lens, cu_seqlens_*) are int32. On the CPU backend every pointer is host
// memory; on the CUDA backend every pointer is device memory of the current device
// (cudaSetDevice) and `stream` is the cudaStream_t the call is enqueued on. The caller owns
// every buffer: the launchers never allocate, free or keep a pointer after the call (CPU)
// or after the enqueued work has run (CUDA: keep the buffers alive until then). Inputs are
// only read; out, lse and the workspace are written. Fill a struct field by field from its
// defaults. Null pointers, pointers not aligned to their element size, negative sizes and
// strides, strides that put a tensor's last element 2^63 bytes or more past its first
// (index * stride would wrap), out rows that overlap one another, and out or lse sharing a
// byte with the index arrays, sinks, per-head scales, the workspace (or lse with out) are
// refused (byte spans, first to last element); strides of 0 on inputs are accepted
// (broadcast); whether out or lse overlaps q, k or v is the caller's to ensure (Python checks it).
//
// Units: lengths and counts are tokens, heads, pages or elements as named; byte counts end
// in `bytes`. Logits are in natural-log units (sm_scale multiplies q.k; exp, not exp2).
#ifndef SPLITKV_PARAMS_H_
#define SPLITKV_PARAMS_H_

#include <cstdint>

namespace splitkv {

// Element type of q, k, v and out (codes are stable: the Python binding passes them).
// float16 is IEEE binary16, bfloat16 the upper half of a float32; kFloat32 runs on the CPU
// backend only (UnsupportedError on CUDA). Accumulation is float32 whatever the dtype.
enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Bytes of one element of `dtype` (q, out; k and v unless fp8_e4m3).
inline int64_t DTypeBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// How k and v are stored. By default they are `dtype`, like q. fp8_e4m3: they are float8
// e4m3fn bytes (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities,
// 0x7f/0xff are NaN) whose true value is stored x scale: k_scale for k and v_scale for v,
// or the per-kv-head arrays when given. q and out are then float16 or bfloat16. Both
// backends (on CUDA: sm_90 decode tiles at head_dim 64/128/256 through the sm_90 decode
// kernel; sm_90 prefill tiles the wgmma prefill would serve over 16-bit K/V through a 16-bit
// copy in the workspace when it has room (StagedKvLayout); everything else through the
// mma.sync kernel). See the README's fp8 paragraph.
// Without fp8_e4m3 the scales must stay at their defaults (1, null).
struct KvStorage {
  bool fp8_e4m3 = false;
  float k_scale = 1.0f;  // per-tensor scales, finite; used where the arrays below are null
  float v_scale = 1.0f;
  // Per-kv-head scales, float32 [num_kv_heads] (memory of the call's backend), or null.
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
};

// Where the call runs. kCuda needs a build with the CUDA backend (CudaBackendAvailable()).
enum class Backend : int32_t { kCpu = 0, kCuda = 1 };

// Options shared by both operations.
struct AttentionOptions {
  // Mask the upper triangle, aligned to the end of the KV: query token i of a request
  // with q_len queries and kv_len keys sees keys j <= kv_len - q_len + i.
  bool causal = true;
  // Sliding window: -1 for none, else a query at position p sees keys j >= p - window_left
  // (with causal, at most window_left + 1 keys). Below -1 is refused.
  int32_t window_left = -1;
  // Soft cap c > 0 replaces a scaled logit s by c * tanh(s / c); 0 disables it. Negative or
  // non-finite is refused.
  float logits_soft_cap = 0.0f;
  // Multiplies q.k before the softmax (natural units); the caller sets it, usually
  // 1/sqrt(head_dim) (the default 1.0 is NOT that). Must be finite. The scaled logits are
  // float32 and unchecked: one past its range becomes an infinity; a +inf logit makes its row
  // NaN, and a row whose logits are all -inf reads as seeing no key (out 0, lse -inf).
  float sm_scale = 1.0f;
  // Splits of each request's KV. 0: the planner chooses (at most 64, lowered until the
  // workspace and the counter region hold it; 1 needs no scratch). >= 1: forced, and the
  // call is refused (WorkspaceError) if the workspace or the counter region cannot hold it.
  int32_t num_splits = 0;
  // Batch invariance: a request's out and lse bits depend only on its own q, KV and the
  // other options, not on the batch, the workspace size, the CPU thread count, how its
  // prefill is chunked or whether a token is computed in a prefill or a decode. Splits are
  // cut at absolute KV positions (BackendTraits::invariant_split_keys keys each, split_plan.h
  // InvariantSplitKeyRange), every row takes one reduction order, and the merge runs in split
  // order. Bits are the same for one build and instruction set (the CPU's SPLITKV_CPU_ISA);
  // they differ from the default mode's. Requires num_splits == 0 (the split rule is fixed).
  bool batch_invariant = false;
  // Attention sinks, or null for none: sinks[h] (float32, num_qo_heads entries; host memory
  // on the CPU backend, device memory on CUDA) is one extra logit of every row of qo head h,
  // in natural-log units, NOT multiplied by sm_scale nor soft-capped, whose value vector is
  // zero: p_j = exp(s_j) / (exp(sinks[h]) + sum_k exp(s_k)), and lse becomes
  // log(exp(sinks[h]) + sum_k exp(s_k)). A row that sees no key gets out 0 and lse sinks[h].
  // The sink enters each row once, when its result is written (with num_splits > 1: in the
  // merge, never in a partial). -inf means no sink for that head; NaN or +inf give NaN rows
  // (values are not checked).
  const float* sinks = nullptr;
};

// The caller's workspace (workspace_layout.h): bytes [0, kCounterRegionBytes) must be zero
// at rest (zeroed once when made, never again: every launch leaves them zero); the base
// must be kWorkspaceAlignment (256)-aligned; at least kCounterRegionBytes bytes. Host memory
// for kCpu, device memory for kCuda. The caller owns it; the call never frees or keeps it.
// One launch at a time per workspace: two threads or two streams need two workspaces.
struct WorkspaceBuffer {
  void* data = nullptr;
  int64_t bytes = 0;  // the buffer's real size in bytes (not a maximum: the planner fits to it)
  // CUDA, optional: kStatusWords uint32 of pinned host memory (cudaHostAlloc / cudaMallocHost;
  // the device writes it through unified addressing), zeroed once, kept with this workspace
  // for its life. A launch that finds a counter the split protocol cannot have left also
  // writes its status record (workspace_layout.h) here, so the next launch on the workspace
  // sees it without a sync: that launch then zeroes the counter region on its stream and
  // throws WorkspaceError instead of running. Null: only CheckWorkspaceStatus reports it.
  uint32_t* status_host = nullptr;
};

// Attention over a paged KV cache (decode, speculative decode, chunked prefill).
//
// Request b owns KV tokens 0 .. seq_lens[b] - 1, token t stored in page
// block_tables[b][t / page_size] at slot t % page_size; its q_len queries are its last
// q_len tokens (query i at position seq_lens[b] - q_len + i), unless kv_offsets and
// full_seq_lens place the keys inside a longer request (below). A row that sees no key
// (seq_lens[b] 0, q_len > seq_lens[b] under causal, a window excluding all) gets out 0 and
// lse -inf (options.sinks: lse sinks[h]). KV slots past seq_lens[b] and pages not listed are
// never read into a result.
struct PagedAttentionParams {
  // q [total_q, num_qo_heads, head_dim] of `dtype`; request b owns rows
  // cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 (row b when cu_seqlens_q is null).
  const void* q = nullptr;
  int64_t q_stride_token = 0;
  int64_t q_stride_head = 0;
  // k and v pages: element (page, kv_head, slot, d) is at
  // page * k_stride_page + kv_head * k_stride_head + slot * k_stride_slot + d (same for v).
  // HND [num_pages, num_kv_heads, page_size, head_dim] and NHD
  // [num_pages, page_size, num_kv_heads, head_dim] are two choices of these strides; k and
  // v may be two halves of one [num_pages, 2, ...] allocation or separate ones. `dtype`.
  // Contiguous HND: stride_page = num_kv_heads * page_size * head_dim,
  // stride_head = page_size * head_dim, stride_slot = head_dim.
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  int64_t k_stride_page = 0, k_stride_head = 0, k_stride_slot = 0;
  int64_t v_stride_page = 0, v_stride_head = 0, v_stride_slot = 0;
  // block_tables [batch_size, max_pages_per_seq]: page ids in [0, num_pages) of each
  // request, in order; entries past ceil(seq_lens[b] / page_size) are ignored.
  const int32_t* block_tables = nullptr;
  int64_t block_tables_stride = 0;  // elements between rows, >= max_pages_per_seq
  // seq_lens [batch_size]: KV length of each request (tokens, including its new queries), in
  // [0, max_pages_per_seq * page_size].
  const int32_t* seq_lens = nullptr;
  // cu_seqlens_q [batch_size + 1] or null (then total_q == batch_size): prefix sums of
  // q_len from 0, ending at total_q.
  const int32_t* cu_seqlens_q = nullptr;
  // Key positions in a longer request (context parallelism: this call holds one shard of
  // each request's keys), or both null (the default: kv_offsets 0, full_seq_lens seq_lens).
  // [batch_size] int32 each, memory of the call's backend, both or neither. Request b's
  // seq_lens[b] keys are positions kv_offsets[b] .. kv_offsets[b] + seq_lens[b] - 1 of a
  // request of full_seq_lens[b] keys, and its q_len queries sit at positions
  // full_seq_lens[b] - q_len + i; the causal and window masks compare those positions, so
  // query i sees local key t when t <= full_seq_lens[b] - kv_offsets[b] - q_len + i (causal)
  // and t >= that - window_left (window). Required: 0 <= kv_offsets[b] and
  // kv_offsets[b] + seq_lens[b] <= full_seq_lens[b] (checked on the CPU backend; on CUDA the
  // values are not read on the host). Only the difference full_seq_lens[b] - kv_offsets[b]
  // enters the masks: a query past the shard's last key sees all of it (within the window),
  // one before its first key sees none.
  const int32_t* kv_offsets = nullptr;
  const int32_t* full_seq_lens = nullptr;
  // out [total_q, num_qo_heads, head_dim], same dtype as q; every row is written. It must
  // not overlap any input (the index tensors included) or the workspace.
  void* out = nullptr;
  int64_t out_stride_token = 0;
  int64_t out_stride_head = 0;
  // lse [total_q, num_qo_heads] float32 contiguous, or null: natural-log log-sum-exp of
  // the scaled (and capped) logits over the visible keys, plus the sink when options.sinks
  // is set; -inf (or sinks[h]) for a row that sees none.
  float* lse = nullptr;

  int64_t batch_size = 0;         // requests, >= 0
  int64_t total_q = 0;            // query tokens (rows of q and out), >= 0; 0 launches nothing
  int64_t num_pages = 0;          // pages in the cache, >= 1
  int64_t page_size = 0;          // tokens per page, >= 1 (a power of two on CUDA)
  int64_t max_pages_per_seq = 0;  // columns of block_tables, >= 1
  // A multiple of num_kv_heads (GQA/MQA): qo head h reads kv head h / (num_qo_heads /
  // num_kv_heads) (consecutive qo heads share a kv head).
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;       // >= 1
  int64_t head_dim = 0;           // elements per head: 1..1024 on the CPU, 64/128/256 on CUDA
  // Upper bound on q_len over requests (1 for decode), >= 1; sizes the tile grid. The CPU
  // backend checks it against cu_seqlens_q; on CUDA a bound that is too small is not
  // detected (rows past it are not computed).
  int64_t max_q_len = 1;
  // Upper bound on seq_lens (guides the num_splits heuristic only); 0 means
  // max_pages_per_seq * page_size.
  int64_t max_kv_len = 0;

  DType dtype = DType::kFloat16;
  KvStorage kv_storage;  // k_cache / v_cache as `dtype` (default) or fp8 with scales
  Backend backend = Backend::kCpu;
  // cudaStream_t for Backend::kCuda (null: the legacy default stream); unused on the CPU.
  void* stream = nullptr;
  AttentionOptions options;
  WorkspaceBuffer workspace;
};

// Attention over ragged (variable-length, packed) q, k, v: prefill.
//
// Request b owns q rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 and k/v rows
// cu_seqlens_kv[b] .. cu_seqlens_kv[b+1] - 1; its queries are the last q_len of its kv_len
// tokens (query i at position kv_len - q_len + i). Empty requests are allowed; a row that
// sees no key gets out 0 and lse -inf (or sinks[h]). Field meanings, units and memory as in
// PagedAttentionParams.
struct RaggedAttentionParams {
  // q [total_q, num_qo_heads, head_dim]; k, v [total_kv, num_kv_heads, head_dim]; `dtype`;
  // element (token, head, d) at token * stride_token + head * stride_head + d.
  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  const void* k = nullptr;
  int64_t k_stride_token = 0, k_stride_head = 0;
  const void* v = nullptr;
  int64_t v_stride_token = 0, v_stride_head = 0;
  // cu_seqlens_q, cu_seqlens_kv [batch_size + 1], never null: prefix sums of q_len and
  // kv_len from 0, ending at total_q and total_kv.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_kv = nullptr;
  // out [total_q, num_qo_heads, head_dim] of `dtype`, every row written; must not overlap
  // the inputs or the workspace.
  void* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0;
  // [total_q, num_qo_heads] float32 contiguous, or null: as PagedAttentionParams::lse.
  float* lse = nullptr;

  int64_t batch_size = 0;     // requests, >= 0
  int64_t total_q = 0;        // query tokens, >= 0; 0 launches nothing
  int64_t total_kv = 0;       // key/value tokens, >= 0
  int64_t num_qo_heads = 0;   // a multiple of num_kv_heads; kv head mapping as PagedAttentionParams
  int64_t num_kv_heads = 0;   // >= 1
  int64_t head_dim = 0;       // 1..1024 on the CPU, 64/128/256 on CUDA
  // Upper bound on q_len over requests; 0 means total_q. Sizes the tile grid; the CPU
  // backend checks it against cu_seqlens_q, CUDA does not (rows past it are not computed).
  int64_t max_q_len = 0;
  int64_t max_kv_len = 0;  // upper bound on kv_len (heuristic only); 0 means total_kv

  DType dtype = DType::kFloat16;
  KvStorage kv_storage;  // k / v as `dtype` (default) or fp8 with scales
  Backend backend = Backend::kCpu;
  void* stream = nullptr;  // cudaStream_t for Backend::kCuda (null: default stream)
  AttentionOptions options;
  WorkspaceBuffer workspace;
};

}  // namespace splitkv

#endif  // SPLITKV_PARAMS_H_
