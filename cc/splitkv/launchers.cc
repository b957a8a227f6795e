#include "cc/splitkv/launchers.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "cc/splitkv/arg_checks.h"
#include "cc/splitkv/backend.h"
#include "cc/splitkv/errors.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv {
namespace {

constexpr const char* kPagedOp = "paged_attention";
constexpr const char* kRaggedOp = "ragged_attention";
constexpr int64_t kMaxCpuHeadDim = 1024;
// A q_len is an int32 difference of cu_seqlens; a larger bound only overflows tile counts.
constexpr int64_t kMaxQLen = INT32_MAX;
// A request's keys: an int32 seq_lens entry or difference of cu_seqlens_kv. Bounds above it
// (a caller's max_kv_len, or the default from block_tables' width) are capped here, so the
// planner's key counts stay far from int64's range.
constexpr int64_t kMaxKvLen = INT32_MAX;

// The shortest text that reads back as `value` ("-1", "1e-10", "nan"): std::to_string prints
// six fixed decimals, so -1e-10 read "-0.000000" in a refusal.
std::string FloatText(float value) {
  char text[32];
  const std::to_chars_result result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

// An fp8 KV cache: q float16/bfloat16, finite scales; otherwise no scales.
void CheckKvStorage(const ArgChecks& check, DType dtype, Backend backend, const KvStorage& kv) {
  if (!kv.fp8_e4m3) {
    if (kv.k_scale != 1.0f || kv.v_scale != 1.0f || kv.k_scales != nullptr || kv.v_scales != nullptr) {
      check.Fail("k_scale/v_scale", "set without an fp8 KV cache",
                 "scales 1 and no per-head scales (they apply to a float8_e4m3fn cache only)",
                 FloatText(kv.k_scale) + ", " + FloatText(kv.v_scale) +
                     (kv.k_scales != nullptr || kv.v_scales != nullptr ? " and per-head scales" : ""));
    }
    return;
  }
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    check.Fail("dtype", "unsupported with a float8_e4m3fn KV cache", "q float16 or bfloat16",
               std::to_string(static_cast<int32_t>(dtype)) + " (float32)");
  }
  if (!std::isfinite(kv.k_scale)) check.Fail("k_scale", "is not finite", "a finite scale", FloatText(kv.k_scale));
  if (!std::isfinite(kv.v_scale)) check.Fail("v_scale", "is not finite", "a finite scale", FloatText(kv.v_scale));
}

// CPU launches: per-head scales are host memory, checked like the floats (values, so at
// launch, with the index values; on CUDA they stay on the device, unchecked).
void CheckHostScales(const ArgChecks& check, const KvStorage& kv, int64_t num_kv_heads) {
  for (const auto& [name, scales] : {std::pair{"k_scale", kv.k_scales}, std::pair{"v_scale", kv.v_scales}}) {
    if (scales == nullptr) continue;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      if (!std::isfinite(scales[h])) {
        check.Fail(std::string(name) + "[" + std::to_string(h) + "]", "is not finite", "a finite scale",
                   FloatText(scales[h]));
      }
    }
  }
}

// A workspace a launch or a counter-region entry point (check, reset, status) is given: a
// non-null buffer that holds the counter region, its base aligned to `alignment` bytes (the
// region is read and written as uint32 words; a shifted view would read a word across two
// and report bytes past the region). `what` names the buffer ("a buffer", "a host buffer").
void CheckHoldsCounterRegion(const std::string& op, const void* data, int64_t bytes, const char* what,
                             int64_t alignment) {
  // A null base with fewer bytes than the counter region is an empty buffer (torch's data
  // pointer of a 0-element tensor): reported below as too small, which says what to pass.
  if (data == nullptr && bytes >= kCounterRegionBytes) {
    throw WorkspaceError(op + ": workspace is null: expected " + what + ", got null");
  }
  const auto base = reinterpret_cast<std::uintptr_t>(data);
  if (base % alignment != 0) {
    throw WorkspaceError(op + ": workspace misaligned: expected a base address aligned to " +
                         std::to_string(alignment) + " bytes, got address % " + std::to_string(alignment) + " = " +
                         std::to_string(base % alignment) +
                         (alignment == kWorkspaceAlignment ? "; allocate it 256-byte aligned (splitkv.Workspace does)"
                                                           : ""));
  }
  if (bytes < kCounterRegionBytes) {
    throw WorkspaceError(op + ": workspace too small: need at least " + std::to_string(kCounterRegionBytes) +
                         " bytes (the counter region), got " + std::to_string(bytes));
  }
}

void CheckOptionValues(const ArgChecks& check, const AttentionOptions& options) {
  if (options.window_left < -1) {
    check.Fail("window_left", "out of range", "-1 (no window) or >= 0", std::to_string(options.window_left));
  }
  if (!(options.logits_soft_cap >= 0.0f) || !std::isfinite(options.logits_soft_cap)) {
    check.Fail("logits_soft_cap", "out of range", "a finite value >= 0 (0 disables it)",
               FloatText(options.logits_soft_cap));
  }
  if (!std::isfinite(options.sm_scale)) {
    check.Fail("sm_scale", "is not finite", "a finite scale", FloatText(options.sm_scale));
  }
  check.AtLeast("num_splits", options.num_splits, 0);
  if (options.batch_invariant && options.num_splits != 0) {
    check.Fail("num_splits", "conflicts with batch_invariant",
               "None (0 in C++: the invariant split rule chooses)",
               std::to_string(options.num_splits));
  }
}

// Checks shared by both operations: dtype, heads, head_dim, options, workspace.
void CheckCommon(const ArgChecks& check, DType dtype, Backend backend, int64_t num_qo_heads,
                 int64_t num_kv_heads, int64_t head_dim, const AttentionOptions& options,
                 const WorkspaceBuffer& workspace) {
  CheckDTypeKnown(check, dtype);
  CheckBackendKnown(check, backend);
  if (backend == Backend::kCuda) {
    if (!CudaBackendAvailable()) {
      throw UnsupportedError(std::string(check.op()) +
                             ": backend cuda is not in this build: expected a build with "
                             "--config=cuda, got a CPU-only build");
    }
    if (dtype == DType::kFloat32) {
      throw UnsupportedError(std::string(check.op()) +
                             ": dtype float32 is not supported on cuda: expected float16 or "
                             "bfloat16, got float32");
    }
    if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
      throw UnsupportedError(std::string(check.op()) + ": head_dim not supported on cuda: expected "
                             "64, 128 or 256, got " + std::to_string(head_dim));
    }
  }
  check.AtLeast("num_qo_heads", num_qo_heads, 1);
  check.AtLeast("num_kv_heads", num_kv_heads, 1);
  check.MultipleOf("num_qo_heads", num_qo_heads, "num_kv_heads", num_kv_heads);
  check.InRange("head_dim", head_dim, 1, kMaxCpuHeadDim + 1);
  CheckOptionValues(check, options);
  CheckHoldsCounterRegion(check.op(), workspace.data, workspace.bytes, "a buffer", kWorkspaceAlignment);
}

void CheckStrides(const ArgChecks& check, const char* tensor, int64_t a, int64_t b) {
  if (a < 0 || b < 0) {
    check.Fail(std::string(tensor) + " strides", "negative", "strides >= 0",
               std::to_string(a) + ", " + std::to_string(b));
  }
}

int64_t KvBytes(DType dtype, const KvStorage& kv) { return kv.fp8_e4m3 ? 1 : DTypeBytes(dtype); }

// Each tensor's span in bytes (CheckSpan, which refuses one past int64), the one place its
// extent is written: the shape checks validate it, the overlap checks compare it. Params:
// paged or ragged.
template <class Params>
int64_t QuerySpan(const ArgChecks& check, const Params& p) {
  return CheckSpan(check, "q", {{p.total_q, p.q_stride_token}, {p.num_qo_heads, p.q_stride_head}}, p.head_dim,
                   DTypeBytes(p.dtype));
}
template <class Params>
int64_t OutSpan(const ArgChecks& check, const Params& p) {
  return CheckSpan(check, "out", {{p.total_q, p.out_stride_token}, {p.num_qo_heads, p.out_stride_head}}, p.head_dim,
                   DTypeBytes(p.dtype));
}
// A paged cache's K or V: [num_pages][num_kv_heads][page_size] rows of head_dim.
int64_t CacheSpan(const ArgChecks& check, const char* name, const PagedAttentionParams& p, int64_t stride_page,
                  int64_t stride_head, int64_t stride_slot) {
  return CheckSpan(check, name, {{p.num_pages, stride_page}, {p.num_kv_heads, stride_head}, {p.page_size, stride_slot}},
                   p.head_dim, KvBytes(p.dtype, p.kv_storage));
}
// Ragged K or V: [total_kv][num_kv_heads] rows of head_dim.
int64_t RaggedKvSpan(const ArgChecks& check, const char* name, const RaggedAttentionParams& p, int64_t stride_token,
                     int64_t stride_head) {
  return CheckSpan(check, name, {{p.total_kv, stride_token}, {p.num_kv_heads, stride_head}}, p.head_dim,
                   KvBytes(p.dtype, p.kv_storage));
}
int64_t BlockTablesSpan(const ArgChecks& check, const PagedAttentionParams& p) {
  return CheckSpan(check, "block_tables", {{p.batch_size, p.block_tables_stride}}, p.max_pages_per_seq, 4);
}

// q's and out's spans, then out's rows disjoint; strides already >= 0. Params: paged or
// ragged.
template <class Params>
void CheckQueryAndOut(const ArgChecks& check, const Params& p) {
  QuerySpan(check, p);
  OutSpan(check, p);
  CheckDisjointRows(check, "out", p.total_q, p.out_stride_token, p.num_qo_heads, p.out_stride_head, p.head_dim);
}

// Every pointer aligned to its element size: q, out and lse, then the op's own (`inputs`:
// K/V and index arrays), then sinks and the per-head scales. Params: paged or ragged.
template <class Params>
void CheckAlignedPointers(const ArgChecks& check, const Params& p, std::initializer_list<ArgChecks::PointerOf> inputs) {
  const int64_t bytes = DTypeBytes(p.dtype);
  check.Aligned({{"q", p.q, bytes}, {"out", p.out, bytes}, {"lse", p.lse, 4}});
  check.Aligned(inputs);
  check.Aligned({{"sinks", p.options.sinks, 4}, {"k_scale", p.kv_storage.k_scales, 4}, {"v_scale", p.kv_storage.v_scales, 4}});
}

// cu_seqlens must start at 0, never decrease, end at `total`; returns the largest length.
int64_t CheckCuSeqlens(const ArgChecks& check, const char* arg, const int32_t* cu, int64_t batch_size,
                       int64_t total, const char* total_name) {
  if (cu[0] != 0) check.Fail(std::string(arg) + "[0]", "is not 0", "0", std::to_string(cu[0]));
  int64_t longest = 0;
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t len = int64_t{cu[b + 1]} - cu[b];
    if (len < 0) {
      check.Fail(std::string(arg), "decreases at index " + std::to_string(b + 1),
                 "a non-decreasing prefix sum (>= " + std::to_string(cu[b]) + ")", std::to_string(cu[b + 1]));
    }
    longest = len > longest ? len : longest;
  }
  if (cu[batch_size] != total) {
    check.Fail(std::string(arg) + "[batch_size]", "does not match " + std::string(total_name),
               std::to_string(total), std::to_string(cu[batch_size]));
  }
  return longest;
}

BackendTraits TraitsFor(Backend backend, int64_t group_size, int64_t head_dim, int64_t max_q_len,
                        void* stream, bool batch_invariant, bool kv_fp8) {
  if (backend == Backend::kCuda) {
    return cuda::Traits(group_size, head_dim, max_q_len, stream, batch_invariant, kv_fp8);
  }
  return cpu::Traits(group_size, head_dim);
}

SplitPlan Plan(const char* op, const BackendTraits& traits, int64_t total_q, int64_t num_qo_heads,
               int64_t head_dim, int64_t batch_size, int64_t num_kv_heads, int64_t max_q_len,
               int64_t max_kv_len, const AttentionOptions& options, const WorkspaceBuffer& workspace) {
  SplitPlanRequest request;
  request.op = op;
  request.layout_shape = LayoutShape{total_q, num_qo_heads, head_dim};
  request.batch_size = batch_size;
  request.num_kv_heads = num_kv_heads;
  request.max_q_tiles = CeilDiv(max_q_len > 0 ? max_q_len : 1, traits.q_tile_tokens);
  request.max_kv_len = max_kv_len;
  request.num_workers = traits.num_workers;
  request.fill_workers = traits.fill_workers;
  request.min_keys_per_split = traits.min_keys_per_split;
  request.max_splits = traits.max_splits;
  request.split_block_keys = traits.split_block_keys;
  request.split_merge_blocks = traits.split_merge_blocks;
  request.short_split_keys = traits.short_split_keys;
  request.short_split_workers = traits.short_split_workers;
  request.one_wave_splits = traits.one_wave_splits;
  request.tail_split_workers = traits.tail_split_workers;
  request.tail_keep_tiles = traits.tail_keep_tiles;
  request.wave_split_workers = traits.wave_split_workers;
  request.fill_wave_workers = traits.fill_wave_workers;
  request.fill_wave_min_tiles = traits.fill_wave_min_tiles;
  request.forced_num_splits = options.num_splits;
  request.workspace_bytes = workspace.bytes;
  request.batch_invariant = options.batch_invariant;
  request.invariant_split_keys = traits.invariant_split_keys;
  request.in_task_splits = traits.invariant_in_task_splits;
  request.in_task_splits_if_short = traits.invariant_in_task_if_short;
  return PlanSplits(request);
}

// Byte offset of the in-use word (workspace_layout.h kStatusInUseWord), the region's last. A
// CPU launch that finds the region dirty zeroes the bytes before it, all but the word the
// launch itself holds (CpuWorkspaceClaim below): zeroing that would let a second launch in.
constexpr int64_t kInUseWordOffset = kStatusOffset + kStatusInUseWord * kCounterBytes;
static_assert(kInUseWordOffset + kCounterBytes == kCounterRegionBytes, "the in-use word ends the region");

// A CPU workspace's status record, but for the in-use word: the CPU never writes it, so a
// nonzero word is bytes someone else wrote (the docs' dirty-region row): the region is zeroed
// and the call refused.
void CheckCpuStatusRecord(const char* op, const WorkspaceBuffer& ws) {
  const auto* status = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(ws.data) + kStatusOffset);
  for (int64_t w = 0; w < kStatusBytes / kCounterBytes; ++w) {
    if (w != kStatusInUseWord && status[w] != 0) {
      const uint32_t found = status[w];
      std::memset(ws.data, 0, kInUseWordOffset);
      throw WorkspaceError(std::string(op) + ": workspace counter region corrupted: expected the status record (bytes " +
                           std::to_string(kStatusOffset) + ".." + std::to_string(kCounterRegionBytes) +
                           ") to be 0 at rest, got " + std::to_string(found) + " in its word " + std::to_string(w) +
                           "; nothing was computed and the counter region was reset to zero (was the workspace "
                           "zeroed when made, or written by someone else?)");
    }
  }
}

// Host-side counter check before a CPU launch: a stale counter would make the wrong task
// merge (the bug class this project exists to prevent), so the launch zeroes the counter
// region (healed: the next call is right) and refuses clearly instead of computing. The status
// record is checked on every call, split or not; the counters, by a split call.
void CheckCountersBeforeCpuLaunch(const char* op, const SplitPlan& plan, const WorkspaceBuffer& ws) {
  CheckCpuStatusRecord(op, ws);
  if (plan.num_splits <= 1) return;
  auto* counters = static_cast<uint32_t*>(ws.data);
  for (int64_t i = 0; i < plan.num_tiles; ++i) {
    if (counters[i] != 0) {
      const uint32_t found = counters[i];
      std::memset(ws.data, 0, kInUseWordOffset);
      throw WorkspaceError(std::string(op) + ": workspace counter region corrupted: expected counter " +
                           std::to_string(i) + " (bytes " + std::to_string(i * kCounterBytes) + ".." +
                           std::to_string((i + 1) * kCounterBytes) + ") to be 0 at rest, got " +
                           std::to_string(found) +
                           "; nothing was computed and the counter region was reset to zero (was the "
                           "workspace zeroed when made, or shared by concurrent launches?)");
    }
  }
}


std::string DescribeStatus(const char* op, const uint32_t* words) {
  const int64_t index = words[1];
  if (words[0] != kStatusDirtyCounter || index >= kMaxCounters || words[3] != 0) {  // not a launch's: stray bytes
    return std::string(op) + ": workspace counter region corrupted: expected the status record (bytes " +
           std::to_string(kStatusOffset) + ".." + std::to_string(kStatusOffset + kStatusWords * kCounterBytes) +
           ") to be 0 or a launch's report {" + std::to_string(kStatusDirtyCounter) + ", counter < " +
           std::to_string(kMaxCounters) + ", value, 0}, got {" + std::to_string(words[0]) + ", " +
           std::to_string(words[1]) + ", " + std::to_string(words[2]) + ", " + std::to_string(words[3]) +
           "}; the counter region was reset to zero, so calls from now on are right (was the workspace zeroed "
           "when made, or written by someone else?)";
  }
  return std::string(op) + ": workspace counter region corrupted: an earlier launch on this workspace found counter " +
         std::to_string(index) + " (bytes " + std::to_string(index * kCounterBytes) + ".." +
         std::to_string((index + 1) * kCounterBytes) + ") holding " + std::to_string(words[2]) +
         " when a split arrived, a value the split protocol cannot leave (status code " + std::to_string(words[0]) +
         "); that launch's outputs are invalid. The counter region was reset to zero, so calls from now on are "
         "right (was the workspace zeroed when made, written by someone else, or shared by concurrent launches?)";
}

void ClearStatusHost(const WorkspaceBuffer& ws) {
  if (ws.status_host == nullptr) return;
  volatile uint32_t* host = ws.status_host;
  for (int64_t w = 0; w < kStatusWords; ++w) host[w] = 0;
}

// CUDA: an earlier launch's record of a dirty counter, seen in the pinned host mirror without
// a sync, is reported before anything else runs on the workspace (and the region zeroed).
void SurfaceRecordedStatus(const char* op, const WorkspaceBuffer& ws, Backend backend, void* stream) {
  if (ws.status_host == nullptr || backend != Backend::kCuda) return;
  const volatile uint32_t* host = ws.status_host;
  if (host[0] == 0) return;
  const uint32_t words[kStatusWords] = {host[0], host[1], host[2], host[3]};
  ResetCounterRegion(ws, backend, stream);
  throw WorkspaceError(DescribeStatus(op, words));
}

// Runs a CPU launch; if a task threw (out of memory, say) after others had counted in,
// every task has still finished when the pool rethrows, so the launch's counters can be
// put back to zero here before the error leaves: the workspace stays usable.
template <typename Launch>
void RunCpuLaunch(const SplitPlan& plan, const WorkspaceBuffer& ws, const Launch& launch) {
  try {
    launch();
  } catch (...) {
    if (plan.num_splits > 1) std::memset(ws.data, 0, plan.num_tiles * kCounterBytes);
    throw;
  }
}

// A CPU launch's claim on its workspace (workspace_layout.h kStatusInUseWord), held from
// before its counter check to its end: two launches on one workspace at once would zero or
// count each other's counters and share scratch, so the second is refused, touching nothing.
// A word holding neither 0 nor the claim is stray bytes: the region is healed and the call
// refused, as for a dirty counter.
class CpuWorkspaceClaim {
 public:
  CpuWorkspaceClaim(const char* op, const WorkspaceBuffer& ws)
      : word_(static_cast<uint32_t*>(ws.data)[kInUseWordOffset / kCounterBytes]) {
    std::atomic_ref<uint32_t> word(word_);
    uint32_t expected = 0;
    if (word.compare_exchange_strong(expected, kStatusInUseClaim, std::memory_order_acquire)) return;
    if (expected != kStatusInUseClaim && word.compare_exchange_strong(expected, kStatusInUseClaim, std::memory_order_acquire)) {
      const uint32_t found = expected;
      std::memset(ws.data, 0, kInUseWordOffset);
      word.store(0u, std::memory_order_release);
      throw WorkspaceError(std::string(op) + ": workspace counter region corrupted: expected its in-use word (bytes " +
                           std::to_string(kInUseWordOffset) + ".." + std::to_string(kCounterRegionBytes) +
                           ") to be 0 at rest, got " + std::to_string(found) +
                           "; nothing was computed and the counter region was reset to zero (was the workspace "
                           "zeroed when made, or written by someone else?)");
    }
    throw WorkspaceError(std::string(op) + ": workspace in use: expected its in-use word (bytes " +
                         std::to_string(kInUseWordOffset) + ".." + std::to_string(kCounterRegionBytes) +
                         ") to be 0, got " + std::to_string(kStatusInUseClaim) +
                         " (a launch's claim); another launch is running on it (use one workspace per thread), or "
                         "its bytes were copied from a workspace in use (if no launch is running, "
                         "ResetCounterRegion / splitkv.reset_counter_region clears it); nothing was computed");
  }
  ~CpuWorkspaceClaim() { std::atomic_ref<uint32_t>(word_).store(0u, std::memory_order_release); }
  CpuWorkspaceClaim(const CpuWorkspaceClaim&) = delete;
  CpuWorkspaceClaim& operator=(const CpuWorkspaceClaim&) = delete;

 private:
  uint32_t& word_;
};

// ---- paged ----

void CheckPagedShapes(const ArgChecks& check, const PagedAttentionParams& p) {
  CheckCommon(check, p.dtype, p.backend, p.num_qo_heads, p.num_kv_heads, p.head_dim, p.options, p.workspace);
  CheckKvStorage(check, p.dtype, p.backend, p.kv_storage);
  check.AtLeast("batch_size", p.batch_size, 0);
  check.AtLeast("total_q", p.total_q, 0);
  check.AtLeast("num_pages", p.num_pages, 1);
  check.AtLeast("page_size", p.page_size, 1);
  if (p.backend == Backend::kCuda && (p.page_size & (p.page_size - 1)) != 0) {
    check.Fail("page_size", "not supported on cuda", "a power of two", std::to_string(p.page_size));
  }
  check.AtLeast("max_pages_per_seq", p.max_pages_per_seq, 1);
  // 0 is allowed: every request then reads the same row of pages (a shared prefix). Between
  // 0 and max_pages_per_seq rows would overlap (params.h asks for >= max_pages_per_seq).
  // max_pages_per_seq * page_size (the longest request) is counted in int64.
  if (p.page_size >= 1 && p.max_pages_per_seq > INT64_MAX / p.page_size) {
    check.Fail("max_pages_per_seq * page_size", "out of range", "below 2^63",
               std::to_string(p.max_pages_per_seq) + " * " + std::to_string(p.page_size));
  }
  if (p.block_tables_stride != 0 && p.block_tables_stride < p.max_pages_per_seq) {
    check.Fail("block_tables_stride", "out of range",
               "0 (one row for every request) or >= max_pages_per_seq = " + std::to_string(p.max_pages_per_seq),
               std::to_string(p.block_tables_stride));
  }
  check.InRange("max_q_len", p.max_q_len, 1, kMaxQLen + 1);
  check.InRange("max_kv_len", p.max_kv_len, 0, kMaxKvLen + 1);
  if (p.cu_seqlens_q == nullptr) check.Equal("total_q", p.total_q, p.batch_size, "batch_size (one token per request)");
  CheckStrides(check, "q", p.q_stride_token, p.q_stride_head);
  CheckStrides(check, "out", p.out_stride_token, p.out_stride_head);
  CheckQueryAndOut(check, p);
  const int64_t kv_bytes = KvBytes(p.dtype, p.kv_storage);
  CheckStrides(check, "k_cache", p.k_stride_page, p.k_stride_head);
  CheckStrides(check, "v_cache", p.v_stride_page, p.v_stride_head);
  CheckStrides(check, "k_cache/v_cache slot", p.k_stride_slot, p.v_stride_slot);
  CacheSpan(check, "k_cache", p, p.k_stride_page, p.k_stride_head, p.k_stride_slot);
  CacheSpan(check, "v_cache", p, p.v_stride_page, p.v_stride_head, p.v_stride_slot);
  BlockTablesSpan(check, p);
  if (p.total_q > 0) {
    check.NotNull("q", p.q);
    check.NotNull("out", p.out);
    check.NotNull("k_cache", p.k_cache);
    check.NotNull("v_cache", p.v_cache);
    check.NotNull("block_tables", p.block_tables);
    check.NotNull("seq_lens", p.seq_lens);
  }
  CheckAlignedPointers(check, p,
                       {{"k_cache", p.k_cache, kv_bytes},
                        {"v_cache", p.v_cache, kv_bytes},
                        {"block_tables", p.block_tables, 4},
                        {"seq_lens", p.seq_lens, 4},
                        {"cu_seqlens_q", p.cu_seqlens_q, 4},
                        {"kv_offsets", p.kv_offsets, 4},
                        {"full_seq_lens", p.full_seq_lens, 4}});
  if ((p.kv_offsets == nullptr) != (p.full_seq_lens == nullptr)) {
    check.Fail("kv_offsets/full_seq_lens", "given without the other", "both or neither",
               p.kv_offsets == nullptr ? "full_seq_lens only" : "kv_offsets only");
  }
}

// Host-readable index data (CPU backend): every value the kernels will use. cu_seqlens were
// checked before the plan (CheckHostCuSeqlens), which gave `longest_q`.
void CheckPagedIndices(const ArgChecks& check, const PagedAttentionParams& p, int64_t longest_q) {
  CheckHostScales(check, p.kv_storage, p.num_kv_heads);
  if (longest_q > p.max_q_len) {
    check.Fail("max_q_len", "is below the longest query", ">= " + std::to_string(longest_q), std::to_string(p.max_q_len));
  }
  const int64_t capacity = p.max_pages_per_seq * p.page_size;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int64_t kv_len = p.seq_lens[b];
    if (kv_len < 0 || kv_len > capacity) {
      check.Fail("seq_lens[" + std::to_string(b) + "]", "out of range",
                 "a length in [0, " + std::to_string(capacity) + "] (max_pages_per_seq * page_size)",
                 std::to_string(kv_len));
    }
    if (p.kv_offsets != nullptr) {
      const int64_t offset = p.kv_offsets[b], full = p.full_seq_lens[b];
      if (offset < 0 || offset + kv_len > full) {
        check.Fail("kv_offsets[" + std::to_string(b) + "]", "out of range",
                   "0 <= kv_offsets[b] and kv_offsets[b] + seq_lens[b] <= full_seq_lens[b]",
                   "kv_offsets " + std::to_string(offset) + ", seq_lens " + std::to_string(kv_len) +
                       ", full_seq_lens " + std::to_string(full));
      }
    }
    const int32_t* row = p.block_tables + b * p.block_tables_stride;
    const int64_t pages = CeilDiv(kv_len, p.page_size);
    for (int64_t i = 0; i < pages; ++i) {
      if (row[i] < 0 || row[i] >= p.num_pages) {  // the name is built only for the message
        const std::string name = "block_tables[" + std::to_string(b) + "][" + std::to_string(i) + "] (a page id)";
        check.InRange(name.c_str(), row[i], 0, p.num_pages);
      }
    }
  }
}

// A launch's out and lse (not a plan's: it has neither) share no byte with what the kernels
// read meanwhile, or with the workspace (CheckDisjointFrom): for each of out and lse, the
// op's index arrays (`indices`), then sinks, the per-head scales, the workspace and out. After
// the shape checks, whose span checks these spans passed. Params: paged or ragged.
template <class Params>
void CheckOutputsDisjoint(const ArgChecks& check, const Params& p, std::initializer_list<ByteRange> indices,
                          std::initializer_list<ByteRange> operands) {
  const int64_t out_bytes = OutSpan(check, p);
  const auto floats = [](const void* x, int64_t count) { return x == nullptr ? 0 : count * 4; };
  const ByteRange shared[] = {{"sinks", p.options.sinks, floats(p.options.sinks, p.num_qo_heads)},
                              {"k_scale", p.kv_storage.k_scales, floats(p.kv_storage.k_scales, p.num_kv_heads)},
                              {"v_scale", p.kv_storage.v_scales, floats(p.kv_storage.v_scales, p.num_kv_heads)},
                              {"workspace", p.workspace.data, p.workspace.bytes},
                              {"out", p.out, out_bytes}};
  for (const ByteRange& output :
       {ByteRange{"out", p.out, out_bytes}, ByteRange{"lse", p.lse, floats(p.lse, p.total_q * p.num_qo_heads)}}) {
    CheckDisjointFrom(check, output, indices);
    CheckDisjointFrom(check, output, shared);
  }
  // The workspace is written too (counters, the in-use word, split partials) while the
  // kernels read every input: a C++ caller's index array inside it was overwritten between
  // its check and its use (the Python layer refuses these before the launch).
  const ByteRange workspace{"workspace", p.workspace.data, p.workspace.bytes};
  CheckDisjointFrom(check, workspace, indices);
  CheckDisjointFrom(check, workspace, shared);
  CheckDisjointFrom(check, workspace, operands);
}

void CheckPagedOutputs(const ArgChecks& check, const PagedAttentionParams& p) {
  const int64_t per_request = p.batch_size * 4;
  const auto given = [](const void* x, int64_t bytes) { return x == nullptr ? 0 : bytes; };
  CheckOutputsDisjoint(
      check, p,
      {{"block_tables", p.block_tables, BlockTablesSpan(check, p)},
       {"seq_lens", p.seq_lens, per_request},
       {"cu_seqlens_q", p.cu_seqlens_q, given(p.cu_seqlens_q, per_request + 4)},
       {"kv_offsets", p.kv_offsets, given(p.kv_offsets, per_request)},
       {"full_seq_lens", p.full_seq_lens, given(p.full_seq_lens, per_request)}},
      {{"q", p.q, QuerySpan(check, p)},
       {"k_cache", p.k_cache, CacheSpan(check, "k_cache", p, p.k_stride_page, p.k_stride_head, p.k_stride_slot)},
       {"v_cache", p.v_cache, CacheSpan(check, "v_cache", p, p.v_stride_page, p.v_stride_head, p.v_stride_slot)}});
}

void CheckRaggedOutputs(const ArgChecks& check, const RaggedAttentionParams& p) {
  const int64_t cu_bytes = p.batch_size >= 0 ? (p.batch_size + 1) * 4 : 0;
  CheckOutputsDisjoint(check, p,
                       {{"cu_seqlens_q", p.cu_seqlens_q, cu_bytes}, {"cu_seqlens_kv", p.cu_seqlens_kv, cu_bytes}},
                       {{"q", p.q, QuerySpan(check, p)},
                        {"k", p.k, RaggedKvSpan(check, "k", p, p.k_stride_token, p.k_stride_head)},
                        {"v", p.v, RaggedKvSpan(check, "v", p, p.v_stride_token, p.v_stride_head)}});
}

SplitPlan PlanPaged(const ArgChecks& check, const PagedAttentionParams& p) {
  CheckPagedShapes(check, p);
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_kv = p.max_kv_len > 0 ? p.max_kv_len : std::min(p.max_pages_per_seq * p.page_size, kMaxKvLen);
  BackendTraits traits = TraitsFor(p.backend, group, p.head_dim, p.max_q_len, p.stream,
                                   p.options.batch_invariant, p.kv_storage.fp8_e4m3);
  if (p.backend == Backend::kCuda && p.options.batch_invariant) {
    traits.invariant_in_task_if_short = cuda::InvariantSplitsInCta(p);
  }
  return Plan(check.op(), traits, p.total_q, p.num_qo_heads, p.head_dim, p.batch_size, p.num_kv_heads,
              p.max_q_len, max_kv, p.options, p.workspace);
}

// ---- ragged ----

void CheckRaggedShapes(const ArgChecks& check, const RaggedAttentionParams& p) {
  CheckCommon(check, p.dtype, p.backend, p.num_qo_heads, p.num_kv_heads, p.head_dim, p.options, p.workspace);
  CheckKvStorage(check, p.dtype, p.backend, p.kv_storage);
  check.AtLeast("batch_size", p.batch_size, 0);
  check.AtLeast("total_q", p.total_q, 0);
  check.AtLeast("total_kv", p.total_kv, 0);
  check.InRange("max_q_len", p.max_q_len, 0, kMaxQLen + 1);
  check.InRange("max_kv_len", p.max_kv_len, 0, kMaxKvLen + 1);
  CheckStrides(check, "q", p.q_stride_token, p.q_stride_head);
  CheckStrides(check, "k", p.k_stride_token, p.k_stride_head);
  CheckStrides(check, "v", p.v_stride_token, p.v_stride_head);
  CheckStrides(check, "out", p.out_stride_token, p.out_stride_head);
  CheckQueryAndOut(check, p);
  const int64_t kv_bytes = KvBytes(p.dtype, p.kv_storage);
  RaggedKvSpan(check, "k", p, p.k_stride_token, p.k_stride_head);
  RaggedKvSpan(check, "v", p, p.v_stride_token, p.v_stride_head);
  check.NotNull("cu_seqlens_q", p.cu_seqlens_q);
  check.NotNull("cu_seqlens_kv", p.cu_seqlens_kv);
  if (p.total_q > 0) {
    check.NotNull("q", p.q);
    check.NotNull("out", p.out);
  }
  if (p.total_kv > 0) {
    check.NotNull("k", p.k);
    check.NotNull("v", p.v);
  }
  CheckAlignedPointers(check, p,
                       {{"k", p.k, kv_bytes},
                        {"v", p.v, kv_bytes},
                        {"cu_seqlens_q", p.cu_seqlens_q, 4},
                        {"cu_seqlens_kv", p.cu_seqlens_kv, 4}});
}

// As CheckPagedIndices: cu_seqlens_q and cu_seqlens_kv were checked before the plan.
void CheckRaggedIndices(const ArgChecks& check, const RaggedAttentionParams& p, int64_t longest_q) {
  CheckHostScales(check, p.kv_storage, p.num_kv_heads);
  const int64_t max_q = p.max_q_len > 0 ? p.max_q_len : p.total_q;
  if (longest_q > max_q) check.Fail("max_q_len", "is below the longest query", ">= " + std::to_string(longest_q), std::to_string(max_q));
}

SplitPlan PlanRagged(const ArgChecks& check, const RaggedAttentionParams& p) {
  CheckRaggedShapes(check, p);
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_q = p.max_q_len > 0 ? p.max_q_len : p.total_q;
  const int64_t max_kv = p.max_kv_len > 0 ? p.max_kv_len : std::min(p.total_kv, kMaxKvLen);
  BackendTraits traits = TraitsFor(p.backend, group, p.head_dim, max_q, p.stream, p.options.batch_invariant,
                                   p.kv_storage.fp8_e4m3);
  if (p.backend == Backend::kCuda && p.options.batch_invariant) {
    traits.invariant_in_task_if_short = cuda::InvariantSplitsInCta(p);
  }
  return Plan(check.op(), traits, p.total_q, p.num_qo_heads, p.head_dim, p.batch_size, p.num_kv_heads,
              max_q, max_kv, p.options, p.workspace);
}

// A CPU launch's cu_seqlens are host memory: checked once, before the plan and before
// max_q_len, which the Python layer may have derived from them, so a decreasing entry is named
// rather than the bound or the tile count it led to. Returns the longest segment (0 without
// `cu`, or with sizes the shape checks will refuse). Plans read no index values (launchers.h);
// nor does a call with no query rows, which launches nothing.
// The pointer's alignment is checked here first, as the later checks would refuse it: a
// misaligned array would otherwise be read before that, its values shifted by its offset.
int64_t CheckHostCuSeqlens(const ArgChecks& check, const char* arg, const int32_t* cu, int64_t batch_size,
                           int64_t total, const char* total_name) {
  if (cu == nullptr || batch_size < 0 || total < 0) return 0;
  check.Aligned(arg, cu, 4);
  return CheckCuSeqlens(check, arg, cu, batch_size, total, total_name);
}

}  // namespace

void CheckOptions(const char* op, const AttentionOptions& options) {
  // `op` only names the caller in messages; a null one would reach std::string's constructor
  // (std::logic_error, not one of ours) as soon as an option is refused.
  if (op == nullptr) ArgChecks("check_options").Fail("op", "is null", "the caller's name for messages", "null");
  CheckOptionValues(ArgChecks(op), options);
}

SplitPlan PlanPagedAttention(const PagedAttentionParams& params) {
  return PlanPaged(ArgChecks(kPagedOp), params);
}

SplitPlan PlanRaggedAttention(const RaggedAttentionParams& params) {
  return PlanRagged(ArgChecks(kRaggedOp), params);
}

SplitPlan LaunchPagedAttention(const PagedAttentionParams& params) {
  const ArgChecks check(kPagedOp);
  int64_t longest_q = 0;
  // The CPU reads index values on the host, and refuses bad ones whether or not the call has
  // query rows (a call whose requests all have q_len 0 is checked as the same call with one).
  if (params.backend == Backend::kCpu) {
    longest_q = CheckHostCuSeqlens(check, "cu_seqlens_q", params.cu_seqlens_q, params.batch_size, params.total_q,
                                   "total_q");
  }
  const SplitPlan plan = PlanPaged(check, params);
  CheckPagedOutputs(check, params);
  SurfaceRecordedStatus(kPagedOp, params.workspace, params.backend, params.stream);
  if (params.total_q == 0) {
    // Without query rows a C++ caller may pass null index arrays (nothing is read then).
    if (params.backend == Backend::kCpu && params.seq_lens != nullptr && params.block_tables != nullptr) {
      CheckPagedIndices(check, params, longest_q);
    }
    return plan;
  }
  if (params.backend == Backend::kCuda) {
    cuda::PagedAttention(params, plan);
  } else {
    CheckPagedIndices(check, params, longest_q);
    const CpuWorkspaceClaim claim(kPagedOp, params.workspace);
    CheckCountersBeforeCpuLaunch(kPagedOp, plan, params.workspace);
    RunCpuLaunch(plan, params.workspace, [&] { cpu::PagedAttention(params, plan); });
  }
  return plan;
}

SplitPlan LaunchRaggedAttention(const RaggedAttentionParams& params) {
  const ArgChecks check(kRaggedOp);
  int64_t longest_q = 0;
  // As LaunchPagedAttention: index values are checked on the CPU with or without query rows.
  if (params.backend == Backend::kCpu) {
    longest_q = CheckHostCuSeqlens(check, "cu_seqlens_q", params.cu_seqlens_q, params.batch_size, params.total_q,
                                   "total_q");
    CheckHostCuSeqlens(check, "cu_seqlens_kv", params.cu_seqlens_kv, params.batch_size, params.total_kv, "total_kv");
  }
  const SplitPlan plan = PlanRagged(check, params);
  CheckRaggedOutputs(check, params);
  SurfaceRecordedStatus(kRaggedOp, params.workspace, params.backend, params.stream);
  if (params.total_q == 0) {
    if (params.backend == Backend::kCpu) CheckRaggedIndices(check, params, longest_q);
    return plan;
  }
  if (params.backend == Backend::kCuda) {
    cuda::RaggedAttention(params, plan);
  } else {
    CheckRaggedIndices(check, params, longest_q);
    const CpuWorkspaceClaim claim(kRaggedOp, params.workspace);
    CheckCountersBeforeCpuLaunch(kRaggedOp, plan, params.workspace);
    RunCpuLaunch(plan, params.workspace, [&] { cpu::RaggedAttention(params, plan); });
  }
  return plan;
}

bool CudaBackendAvailable() { return cuda::Available(); }

void CheckCounterRegionZero(const void* workspace, int64_t workspace_bytes) {
  // A host copy may sit in any buffer of uint32 words.
  CheckHoldsCounterRegion("check_counter_region", workspace, workspace_bytes, "a host buffer", kCounterBytes);
  const auto* counters = static_cast<const uint32_t*>(workspace);
  int64_t nonzero = 0;
  int64_t first = -1;
  constexpr int64_t kWords = kCounterRegionBytes / kCounterBytes;  // the counters and the status record
  for (int64_t i = 0; i < kWords; ++i) {
    if (counters[i] != 0) {
      if (first < 0) first = i;
      ++nonzero;
    }
  }
  if (nonzero > 0) {
    throw WorkspaceError("check_counter_region: counter region not zero: expected all " +
                         std::to_string(kWords) + " words (counters and status record) 0, got " + std::to_string(nonzero) +
                         " nonzero, the first at index " + std::to_string(first) + " (byte " +
                         std::to_string(first * kCounterBytes) + ") holding " + std::to_string(counters[first]));
  }
}

void ResetCounterRegion(const WorkspaceBuffer& workspace, Backend backend, void* stream) {
  CheckBackendKnown(ArgChecks("reset_counter_region"), backend);
  CheckHoldsCounterRegion("reset_counter_region", workspace.data, workspace.bytes, "a buffer", kWorkspaceAlignment);
  if (backend == Backend::kCuda) {
    cuda::ZeroCounterRegion(workspace.data, stream);
  } else {
    std::memset(workspace.data, 0, kCounterRegionBytes);
  }
  ClearStatusHost(workspace);
}

void CheckWorkspaceStatus(const char* op, const WorkspaceBuffer& workspace, Backend backend, void* stream) {
  // `op` only names the caller in messages, but a null one would reach std::string's
  // constructor (std::logic_error, not one of ours).
  if (op == nullptr) ArgChecks("check_workspace_status").Fail("op", "is null", "the caller's name for messages", "null");
  CheckBackendKnown(ArgChecks(op), backend);
  CheckHoldsCounterRegion(op, workspace.data, workspace.bytes, "a buffer", kWorkspaceAlignment);
  uint32_t words[kStatusWords] = {};
  if (backend == Backend::kCuda) {
    cuda::ReadStatusRecord(workspace.data, stream, words);
  } else {
    // No CPU launch writes the record: any nonzero word is stray bytes, named as a CPU launch
    // names them, holding the workspace as a launch does (a stray in-use word is healed and
    // refused here too).
    const CpuWorkspaceClaim claim(op, workspace);
    CheckCpuStatusRecord(op, workspace);
  }
  if (words[0] == 0 && workspace.status_host != nullptr) {  // a CUDA launch's report, seen by the host
    const volatile uint32_t* host = workspace.status_host;
    for (int64_t w = 0; w < kStatusWords; ++w) words[w] = host[w];
  }
  if (words[0] == 0) return;
  ResetCounterRegion(workspace, backend, stream);  // enqueued before anything the caller runs next
  throw WorkspaceError(DescribeStatus(op, words));
}

}  // namespace splitkv
