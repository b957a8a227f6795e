// The C++ embedding example (cc/examples): its batches' results match the float64
// reference, and its one workspace, zeroed once, keeps a zero counter region over many
// calls with repeats bitwise identical.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cc/examples/example_batches.h"
#include "cc/examples/host_workspace.h"
#include "cc/splitkv/launchers.h"
#include "cc/splitkv/workspace_layout.h"
#include "tests/cc/reference.h"
#include "tests/cc/test_check.h"

namespace {

using splitkv_example::HostWorkspace;
using splitkv_example::KvLayout;
using splitkv_example::PagedDecodeBatch;
using splitkv_example::RaggedPrefillBatch;

constexpr int64_t kMaxSplits = 16;

std::vector<double> ToDouble(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

splitkv_test::ReferenceOptions Options(int64_t head_dim) {
  splitkv_test::ReferenceOptions options;
  options.causal = true;
  options.sm_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));  // the float the example passes
  return options;
}

// The decode batch's keys and values, gathered from its pages with this test's own indexing.
splitkv_test::ReferenceResult PagedReference(const PagedDecodeBatch& b) {
  const int64_t h = b.num_kv_heads, ps = b.page_size, d = b.head_dim;
  std::vector<int32_t> cu_q(1, 0), cu_kv(1, 0);
  std::vector<double> k, v;
  for (int64_t r = 0; r < b.batch_size(); ++r) {
    cu_q.push_back(cu_q.back() + 1);
    cu_kv.push_back(cu_kv.back() + b.seq_lens[r]);
    for (int64_t j = 0; j < b.seq_lens[r]; ++j) {
      const int64_t page = b.block_tables[r * b.max_pages_per_seq + j / ps], slot = j % ps;
      for (int64_t head = 0; head < h; ++head) {
        const int64_t within = b.layout == KvLayout::kHND ? (head * ps + slot) * d : (slot * h + head) * d;
        const int64_t k_at = page * 2 * h * ps * d + within;
        for (int64_t e = 0; e < d; ++e) {
          k.push_back(b.kv_cache[k_at + e]);
          v.push_back(b.kv_cache[k_at + h * ps * d + e]);
        }
      }
    }
  }
  return splitkv_test::ReferenceAttention(ToDouble(b.q), k, v, cu_q, cu_kv, b.num_qo_heads, h, d, Options(d));
}

splitkv_test::ReferenceResult RaggedReference(const RaggedPrefillBatch& b) {
  return splitkv_test::ReferenceAttention(ToDouble(b.q), ToDouble(b.k), ToDouble(b.v), b.cu_seqlens_q,
                                          b.cu_seqlens_kv, b.num_qo_heads, b.num_kv_heads, b.head_dim,
                                          Options(b.head_dim));
}

bool CounterRegionZero(const HostWorkspace& ws) {
  try {
    splitkv::CheckCounterRegionZero(ws.data(), ws.bytes());
    return true;
  } catch (const std::exception& error) {
    splitkv_test::Fail(__FILE__, __LINE__, error.what());
    return false;
  }
}

HostWorkspace MakeWorkspace(int64_t max_total_q) {
  return HostWorkspace(splitkv::RequiredWorkspaceBytes(splitkv::LayoutShape{max_total_q, 8, 64}, kMaxSplits));
}

// Runs `run(num_splits)` for the planner's choice, 1 and 4 splits, 5 times each, checking
// every result against `ref`, the repeats bitwise, and the counters after every call.
template <typename Batch, typename Run>
void CheckBatch(Batch& batch, const HostWorkspace& ws, const splitkv_test::ReferenceResult& ref, const Run& run,
                const std::string& label) {
  for (int32_t num_splits : {0, 1, 4}) {
    std::vector<float> first_out, first_lse;
    for (int repeat = 0; repeat < 5; ++repeat) {
      std::fill(batch.out.begin(), batch.out.end(), -99.0f);
      const splitkv::SplitPlan plan = run(num_splits);
      if (num_splits > 0) EXPECT_EQ(int64_t{num_splits}, plan.num_splits);
      EXPECT_TRUE(CounterRegionZero(ws));
      if (repeat == 0) {
        const std::string what = label + " num_splits=" + std::to_string(num_splits);
        EXPECT_ALLCLOSE(what + " out", ref.out, ToDouble(batch.out), 2e-5, 1e-4);
        EXPECT_ALLCLOSE(what + " lse", ref.lse, ToDouble(batch.lse), 2e-4, 2e-5);
        first_out = batch.out;
        first_lse = batch.lse;
      } else {
        EXPECT_TRUE(std::memcmp(first_out.data(), batch.out.data(), first_out.size() * 4) == 0);
        EXPECT_TRUE(std::memcmp(first_lse.data(), batch.lse.data(), first_lse.size() * 4) == 0);
      }
    }
  }
}

TEST(WorkspaceIsAlignedAndStartsZero) {
  const HostWorkspace ws = MakeWorkspace(70);
  EXPECT_EQ(std::uintptr_t{0}, reinterpret_cast<std::uintptr_t>(ws.data()) % splitkv::kWorkspaceAlignment);
  EXPECT_GT(ws.bytes(), splitkv::kCounterRegionBytes);
  EXPECT_TRUE(CounterRegionZero(ws));
}

TEST(PagedDecodeMatchesReference) {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    PagedDecodeBatch batch = splitkv_example::MakePagedDecodeBatch({1, 17, 300, 2500}, layout, 1);
    const HostWorkspace ws = MakeWorkspace(batch.batch_size());
    const auto ref = PagedReference(batch);
    CheckBatch(batch, ws, ref, [&](int32_t s) { return splitkv_example::RunPagedDecode(batch, ws, s); },
               layout == KvLayout::kHND ? "paged HND" : "paged NHD");
  }
}

TEST(LongDecodeIsSplitByThePlanner) {
  PagedDecodeBatch batch = splitkv_example::MakePagedDecodeBatch({8192}, KvLayout::kNHD, 3);
  const HostWorkspace ws = MakeWorkspace(1);
  EXPECT_GT(splitkv_example::RunPagedDecode(batch, ws, 0).num_splits, int64_t{1});
  CheckBatch(batch, ws, PagedReference(batch),
             [&](int32_t s) { return splitkv_example::RunPagedDecode(batch, ws, s); }, "long decode");
}

TEST(RaggedPrefillMatchesReference) {
  RaggedPrefillBatch batch = splitkv_example::MakeRaggedPrefillBatch({5, 64, 1}, {5, 80, 700}, 2);
  const HostWorkspace ws = MakeWorkspace(batch.total_q());
  CheckBatch(batch, ws, RaggedReference(batch),
             [&](int32_t s) { return splitkv_example::RunRaggedPrefill(batch, ws, s); }, "ragged");
}

// The example's pattern: one workspace shared by both operations, call after call.
TEST(OneWorkspaceServesBothOperations) {
  PagedDecodeBatch decode = splitkv_example::MakePagedDecodeBatch({1, 17, 300, 2500}, KvLayout::kHND, 1);
  RaggedPrefillBatch prefill = splitkv_example::MakeRaggedPrefillBatch({5, 64, 1}, {5, 80, 700}, 2);
  const HostWorkspace ws = MakeWorkspace(prefill.total_q());
  const auto decode_ref = PagedReference(decode);
  const auto prefill_ref = RaggedReference(prefill);
  for (int round = 0; round < 4; ++round) {
    const int32_t splits = round % 2 ? 3 : 0;
    splitkv_example::RunPagedDecode(decode, ws, splits);
    EXPECT_TRUE(CounterRegionZero(ws));
    splitkv_example::RunRaggedPrefill(prefill, ws, splits);
    EXPECT_TRUE(CounterRegionZero(ws));
    EXPECT_ALLCLOSE("shared decode out", decode_ref.out, ToDouble(decode.out), 2e-5, 1e-4);
    EXPECT_ALLCLOSE("shared prefill out", prefill_ref.out, ToDouble(prefill.out), 2e-5, 1e-4);
  }
}

}  // namespace

int main() {
  setenv("SPLITKV_NUM_THREADS", "2", /*overwrite=*/0);
  return splitkv_test::RunAllTests();
}
