// A C++ program that knows splitkv only through the installed include tree and libsplitkv.a
// (built by static_library_test.sh with plain g++, outside Bazel's cc rules). On the CPU
// backend, in float32, it runs a paged decode batch and a ragged prefill batch on one
// workspace, compares them with a double-precision reference, checks the counter region is
// zero after each call, and checks a bad argument is refused with InvalidArgument.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cc/splitkv/errors.h"
#include "cc/splitkv/launchers.h"
#include "cc/splitkv/params.h"
#include "cc/splitkv/workspace_layout.h"

namespace {

constexpr int64_t kNumKvHeads = 2;
constexpr int64_t kNumQoHeads = 4;
constexpr int64_t kHeadDim = 64;
constexpr int64_t kNumSplits = 4;
constexpr float kTolerance = 1e-4f;

int failures = 0;

std::string Scientific(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2e", x);
  return text;
}

void Expect(bool ok, const std::string& what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

// One request's attention in double, k and v as [kv_len, kNumKvHeads, kHeadDim], causal,
// queries at the last q_len positions. Returns the largest |out - expected| over its rows.
double MaxError(const float* q, const float* k, const float* v, const float* out, int64_t q_len,
                int64_t kv_len) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  double worst = 0;
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t last_key = kv_len - q_len + i;  // causal: keys 0..last_key
    for (int64_t h = 0; h < kNumQoHeads; ++h) {
      const int64_t kv_head = h / (kNumQoHeads / kNumKvHeads);
      const float* qi = q + (i * kNumQoHeads + h) * kHeadDim;
      std::vector<double> logits;
      double max_logit = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= last_key; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < kHeadDim; ++d) dot += qi[d] * k[(j * kNumKvHeads + kv_head) * kHeadDim + d];
        logits.push_back(dot * scale);
        max_logit = std::max(max_logit, logits.back());
      }
      double sum = 0;
      for (double& l : logits) sum += (l = std::exp(l - max_logit));
      for (int64_t d = 0; d < kHeadDim; ++d) {
        double expected = 0;
        for (int64_t j = 0; j <= last_key; ++j) {
          expected += logits[j] / sum * v[(j * kNumKvHeads + kv_head) * kHeadDim + d];
        }
        const float got = out[(i * kNumQoHeads + h) * kHeadDim + d];
        worst = std::max(worst, std::isfinite(got) ? std::fabs(got - expected) : 1e30);
      }
    }
  }
  return worst;
}

struct FreeAligned {
  void operator()(void* p) const { std::free(p); }
};

// A workspace as the contract wants it: 256-byte aligned, zeroed once, never again.
std::unique_ptr<void, FreeAligned> MakeWorkspace(int64_t bytes) {
  void* data = std::aligned_alloc(splitkv::kWorkspaceAlignment, bytes);
  std::memset(data, 0, bytes);
  return std::unique_ptr<void, FreeAligned>(data);
}

void CheckCounters(const void* workspace, int64_t bytes, const char* after) {
  try {
    splitkv::CheckCounterRegionZero(workspace, bytes);
    Expect(true, std::string("counter region zero after ") + after);
  } catch (const splitkv::WorkspaceError& e) {
    Expect(false, std::string("counter region zero after ") + after + ": " + e.what());
  }
}

// Decode over a paged HND cache: one query per request, pages handed out back to front,
// the unused tail of each last page NaN (never read into a result).
void PagedDecode(void* workspace, int64_t workspace_bytes, std::mt19937& rng) {
  const std::vector<int32_t> seq_lens = {1, 97, 300};
  const int64_t page_size = 16, max_pages = 19, batch = 3;
  const int64_t num_pages = batch * max_pages;
  const int64_t page_elems = kNumKvHeads * page_size * kHeadDim;
  std::vector<float> k_cache(num_pages * page_elems, NAN), v_cache(num_pages * page_elems, NAN);
  std::vector<int32_t> block_tables(batch * max_pages);
  std::vector<std::vector<float>> keys, values;
  int32_t next_page = num_pages - 1;
  for (int64_t b = 0; b < batch; ++b) {
    keys.push_back(Random(seq_lens[b] * kNumKvHeads * kHeadDim, rng));
    values.push_back(Random(seq_lens[b] * kNumKvHeads * kHeadDim, rng));
    for (int64_t p = 0; p < max_pages; ++p) block_tables[b * max_pages + p] = next_page--;
    for (int64_t t = 0; t < seq_lens[b]; ++t) {
      const int64_t page = block_tables[b * max_pages + t / page_size], slot = t % page_size;
      for (int64_t h = 0; h < kNumKvHeads; ++h) {
        const int64_t dst = page * page_elems + (h * page_size + slot) * kHeadDim;
        const int64_t src = (t * kNumKvHeads + h) * kHeadDim;
        std::memcpy(&k_cache[dst], &keys[b][src], kHeadDim * sizeof(float));
        std::memcpy(&v_cache[dst], &values[b][src], kHeadDim * sizeof(float));
      }
    }
  }
  std::vector<float> q = Random(batch * kNumQoHeads * kHeadDim, rng);
  std::vector<float> out(q.size(), NAN);

  splitkv::PagedAttentionParams params;
  params.q = q.data();
  params.q_stride_token = kNumQoHeads * kHeadDim;
  params.q_stride_head = kHeadDim;
  params.k_cache = k_cache.data();
  params.v_cache = v_cache.data();
  params.k_stride_page = params.v_stride_page = page_elems;
  params.k_stride_head = params.v_stride_head = page_size * kHeadDim;
  params.k_stride_slot = params.v_stride_slot = kHeadDim;
  params.block_tables = block_tables.data();
  params.block_tables_stride = max_pages;
  params.seq_lens = seq_lens.data();
  params.out = out.data();
  params.out_stride_token = kNumQoHeads * kHeadDim;
  params.out_stride_head = kHeadDim;
  params.batch_size = params.total_q = batch;
  params.num_pages = num_pages;
  params.page_size = page_size;
  params.max_pages_per_seq = max_pages;
  params.num_qo_heads = kNumQoHeads;
  params.num_kv_heads = kNumKvHeads;
  params.head_dim = kHeadDim;
  params.dtype = splitkv::DType::kFloat32;
  params.backend = splitkv::Backend::kCpu;
  params.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  params.options.num_splits = kNumSplits;
  params.workspace = {workspace, workspace_bytes};

  const splitkv::SplitPlan plan = splitkv::LaunchPagedAttention(params);
  Expect(plan.num_splits == kNumSplits, "paged decode ran with the forced num_splits");
  double worst = 0;
  for (int64_t b = 0; b < batch; ++b) {
    worst = std::max(worst, MaxError(&q[b * kNumQoHeads * kHeadDim], keys[b].data(), values[b].data(),
                                     &out[b * kNumQoHeads * kHeadDim], 1, seq_lens[b]));
  }
  Expect(worst < kTolerance, "paged decode matches the reference (max error " + Scientific(worst) + ")");
  CheckCounters(workspace, workspace_bytes, "paged decode");

  params.num_qo_heads = 3;  // not a multiple of num_kv_heads
  try {
    splitkv::LaunchPagedAttention(params);
    Expect(false, "num_qo_heads = 3 with 2 kv heads is refused");
  } catch (const splitkv::InvalidArgument& e) {
    Expect(std::string(e.what()).find("num_qo_heads") != std::string::npos,
           std::string("num_qo_heads = 3 with 2 kv heads is refused: ") + e.what());
  }
}

// Causal prefill of packed requests; k and v [total_kv, kNumKvHeads, kHeadDim].
void RaggedPrefill(void* workspace, int64_t workspace_bytes, std::mt19937& rng) {
  const std::vector<int32_t> cu_seqlens_q = {0, 5, 45}, cu_seqlens_kv = {0, 5, 205};
  const int64_t total_q = 45, total_kv = 205;
  std::vector<float> q = Random(total_q * kNumQoHeads * kHeadDim, rng);
  std::vector<float> k = Random(total_kv * kNumKvHeads * kHeadDim, rng);
  std::vector<float> v = Random(total_kv * kNumKvHeads * kHeadDim, rng);
  std::vector<float> out(q.size(), NAN);

  splitkv::RaggedAttentionParams params;
  params.q = q.data();
  params.q_stride_token = kNumQoHeads * kHeadDim;
  params.q_stride_head = kHeadDim;
  params.k = k.data();
  params.v = v.data();
  params.k_stride_token = params.v_stride_token = kNumKvHeads * kHeadDim;
  params.k_stride_head = params.v_stride_head = kHeadDim;
  params.cu_seqlens_q = cu_seqlens_q.data();
  params.cu_seqlens_kv = cu_seqlens_kv.data();
  params.out = out.data();
  params.out_stride_token = kNumQoHeads * kHeadDim;
  params.out_stride_head = kHeadDim;
  params.batch_size = 2;
  params.total_q = total_q;
  params.total_kv = total_kv;
  params.num_qo_heads = kNumQoHeads;
  params.num_kv_heads = kNumKvHeads;
  params.head_dim = kHeadDim;
  params.max_q_len = 40;
  params.dtype = splitkv::DType::kFloat32;
  params.backend = splitkv::Backend::kCpu;
  params.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  params.options.num_splits = kNumSplits;
  params.workspace = {workspace, workspace_bytes};

  splitkv::LaunchRaggedAttention(params);
  double worst = 0;
  for (int b = 0; b < 2; ++b) {
    const int64_t q0 = cu_seqlens_q[b], kv0 = cu_seqlens_kv[b];
    worst = std::max(worst, MaxError(&q[q0 * kNumQoHeads * kHeadDim], &k[kv0 * kNumKvHeads * kHeadDim],
                                     &v[kv0 * kNumKvHeads * kHeadDim], &out[q0 * kNumQoHeads * kHeadDim],
                                     cu_seqlens_q[b + 1] - q0, cu_seqlens_kv[b + 1] - kv0));
  }
  Expect(worst < kTolerance, "ragged prefill matches the reference (max error " + Scientific(worst) + ")");
  CheckCounters(workspace, workspace_bytes, "ragged prefill");
}

}  // namespace

int main() {
  // Sized for the largest call (45 query tokens) at kNumSplits: one buffer serves both.
  const int64_t bytes = splitkv::RequiredWorkspaceBytes({45, kNumQoHeads, kHeadDim}, kNumSplits);
  std::unique_ptr<void, FreeAligned> workspace = MakeWorkspace(bytes);
  std::mt19937 rng(2024);
  std::printf("workspace %lld bytes; cuda backend in this build: %s\n", static_cast<long long>(bytes),
              splitkv::CudaBackendAvailable() ? "yes" : "no");
  for (int round = 0; round < 2; ++round) {  // the second round reuses the un-rezeroed workspace
    PagedDecode(workspace.get(), bytes, rng);
    RaggedPrefill(workspace.get(), bytes, rng);
  }
  std::printf("%s\n", failures == 0 ? "all checks passed" : "checks FAILED");
  return failures == 0 ? 0 : 1;
}
