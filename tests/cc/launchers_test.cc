// Paged and ragged attention on the CPU backend against the float64 reference, in float32,
// float16 and bfloat16, with 1, forced several, and planner-chosen splits, and the workspace
// contract around every call: counters zero after it, NaN in the softmax/scratch regions
// harmless, repeats bitwise identical, out's padding untouched.
#include "cc/splitkv/launchers.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cc/splitkv/workspace_layout.h"
#include "tests/cc/attention_problems.h"
#include "tests/cc/test_check.h"
#include "tests/cc/test_workspace.h"

namespace {

using splitkv::DType;
using splitkv_test::MakePagedProblem;
using splitkv_test::MakeRaggedProblem;
using splitkv_test::PagedProblem;
using splitkv_test::ProblemSpec;
using splitkv_test::RaggedProblem;
using splitkv_test::TestWorkspace;

constexpr int64_t kWorkspaceBytes = splitkv::kCounterRegionBytes + (int64_t{8} << 20);

// One workspace for the whole binary, zeroed once: every call must leave it reusable.
TestWorkspace& SharedWorkspace() {
  static TestWorkspace* workspace = new TestWorkspace(kWorkspaceBytes);
  return *workspace;
}

splitkv::SplitPlan Launch(const splitkv::PagedAttentionParams& p) { return splitkv::LaunchPagedAttention(p); }
splitkv::SplitPlan Launch(const splitkv::RaggedAttentionParams& p) { return splitkv::LaunchRaggedAttention(p); }
splitkv::SplitPlan PlanOnly(const splitkv::PagedAttentionParams& p) { return splitkv::PlanPagedAttention(p); }
splitkv::SplitPlan PlanOnly(const splitkv::RaggedAttentionParams& p) { return splitkv::PlanRaggedAttention(p); }

struct Snapshot {
  std::vector<unsigned char> out;
  std::vector<float> lse;
};

template <typename Problem>
Snapshot Take(const Problem& p) {
  return {p.out.bytes(), p.lse};
}

bool BitwiseEqual(const Snapshot& a, const Snapshot& b) {
  return a.out == b.out && a.lse.size() == b.lse.size() &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

// Runs `problem` with `num_splits` (0: planner's choice) three times: on the shared
// workspace as found, again, and after NaN-filling everything past the counter region.
// Returns the plan's num_splits.
template <typename Problem>
int64_t CheckProblem(Problem& problem, int32_t num_splits, const std::string& label) {
  TestWorkspace& ws = SharedWorkspace();
  const std::string what = label + " num_splits=" + std::to_string(num_splits) + " " + problem.spec.Describe();
  const splitkv_test::ReferenceResult ref = problem.Reference();
  const auto tol = splitkv_test::OutTolerance(problem.spec.dtype);

  problem.ClearOutputs();
  const auto params = problem.Params(ws.data(), ws.bytes(), num_splits);
  const splitkv::SplitPlan plan = Launch(params);
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  if (num_splits > 0) {
    EXPECT_EQ(int64_t{num_splits}, plan.num_splits);
  } else {
    EXPECT_EQ(PlanOnly(params).num_splits, plan.num_splits);
  }
  EXPECT_ALLCLOSE(what + " out", ref.out, problem.Out(), tol.atol, tol.rtol);
  EXPECT_ALLCLOSE(what + " lse", ref.lse, problem.Lse(), splitkv_test::kLseTolerance.atol,
                  splitkv_test::kLseTolerance.rtol);
  EXPECT_TRUE(problem.OutPaddingIntact());
  const Snapshot first = Take(problem);

  problem.ClearOutputs();
  Launch(params);
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  if (!BitwiseEqual(first, Take(problem))) splitkv_test::Fail(__FILE__, __LINE__, what + ": repeat not bitwise identical");

  ws.PoisonAfterCounters();
  problem.ClearOutputs();
  Launch(params);
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  if (!BitwiseEqual(first, Take(problem))) {
    splitkv_test::Fail(__FILE__, __LINE__, what + ": NaN in the softmax/scratch regions changed the result");
  }
  return plan.num_splits;
}

#if SPLITKV_TEST_TSAN
// TSAN looks for races, which do not depend on the dtype; one keeps the run short.
const DType kDtypes[] = {DType::kBFloat16};
#else
const DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
#endif
const int32_t kSplitModes[] = {1, 3, 0};

ProblemSpec Spec(int64_t hq, int64_t hkv, int64_t d, std::vector<int32_t> kv_lens, std::vector<int32_t> q_lens) {
  ProblemSpec spec;
  spec.num_qo_heads = hq;
  spec.num_kv_heads = hkv;
  spec.head_dim = d;
  spec.kv_lens = std::move(kv_lens);
  spec.q_lens = std::move(q_lens);
  return spec;
}

void CheckPagedAllModes(ProblemSpec spec, const std::string& label) {
  for (DType dtype : kDtypes) {
    for (bool nhd : {false, true}) {
      spec.dtype = dtype;
      spec.nhd = nhd;
      PagedProblem problem = MakePagedProblem(spec);
      for (int32_t splits : kSplitModes) CheckProblem(problem, splits, label);
    }
  }
}

void CheckRaggedAllModes(ProblemSpec spec, const std::string& label) {
  for (DType dtype : kDtypes) {
    spec.dtype = dtype;
    RaggedProblem problem = MakeRaggedProblem(spec);
    for (int32_t splits : kSplitModes) CheckProblem(problem, splits, label);
  }
}

// ---- paged ----

TEST(PagedDecodeGqaWithAnEmptySequence) {
  CheckPagedAllModes(Spec(4, 2, 64, {1, 97, 600, 0, 33}, {}), "paged decode");
}

TEST(PagedDecodePageSizeOneMqa) {
  ProblemSpec spec = Spec(4, 1, 32, {1, 97, 130}, {});
  spec.page_size = 1;
  CheckPagedAllModes(spec, "paged decode page_size=1");
}

TEST(PagedMultiTokenCausalWithEmptyRows) {
  // Request 2 has more queries than keys (its first row sees nothing); request 3 has no keys.
  CheckPagedAllModes(Spec(8, 2, 64, {97, 300, 2, 0}, {1, 5, 3, 4}), "paged chunked prefill");
}

TEST(PagedWindowAndSoftCap) {
  ProblemSpec spec = Spec(4, 4, 64, {200, 450}, {7, 1});
  spec.options.window_left = 37;
  spec.options.logits_soft_cap = 1.0f;
  CheckPagedAllModes(spec, "paged window+soft cap");
}

TEST(PagedShardsOfLongerRequestsWithWindows) {
  // kv_offsets / full_seq_lens: rows before the shard (request 1's first 10), inside it and
  // past it; a shard wholly before its query's window (request 2); an empty shard.
  ProblemSpec spec = Spec(4, 2, 64, {64, 20, 50, 0}, {16, 40, 1, 3});
  spec.kv_offsets = {0, 100, 10, 5};
  spec.full_seq_lens = {64, 130, 400, 5};
  for (int32_t window : {-1, 25}) {
    spec.options.window_left = window;
    CheckPagedAllModes(spec, "paged shards, window " + std::to_string(window));
  }
  spec.q_lens = {};  // decode
  spec.options.window_left = 100;
  CheckPagedAllModes(spec, "paged decode shards");
}

TEST(PagedNonCausalAndNonCausalWindow) {
  ProblemSpec spec = Spec(4, 2, 40, {70, 5, 300}, {6, 2, 9});  // head_dim 40: not a multiple of 8
  spec.options.causal = false;
  CheckPagedAllModes(spec, "paged non-causal");
  spec.options.window_left = 10;
  CheckPagedAllModes(spec, "paged non-causal window");
}

TEST(PagedSeveralQueryTilesPerRequest) {
  // Group 8 puts 8 query tokens in a tile: 20 queries span 3 tiles, each with its own counter.
  ProblemSpec spec = Spec(8, 1, 128, {150, 9}, {20, 9});
  spec.page_size = 8;
  CheckPagedAllModes(spec, "paged q tiles");
}

TEST(PagedSeparateKAndVCachesInDifferentLayouts) {
  // k HND with v NHD and the reverse: each tensor must be read with its own strides.
  ProblemSpec spec = Spec(4, 2, 32, {97, 40, 260}, {3, 1, 6});
  spec.separate_kv = true;
  CheckPagedAllModes(spec, "paged separate k/v");
}

TEST(PagedManyMoreSplitsThanKeyChunks) {
  // 64 forced splits over at most 2 key blocks: most splits are empty and add nothing.
  for (DType dtype : kDtypes) {
    ProblemSpec spec = Spec(4, 2, 64, {1, 97, 130, 50}, {1, 3, 2, 0});  // the last has no queries
    spec.dtype = dtype;
    PagedProblem problem = MakePagedProblem(spec);
    CheckProblem(problem, 64, "paged 64 splits");
  }
}

TEST(PagedAutoSplitsBatchOneLongKv) {
  for (DType dtype : kDtypes) {
    ProblemSpec spec = Spec(4, 2, 64, {2048}, {});
    spec.dtype = dtype;
    PagedProblem problem = MakePagedProblem(spec);
    EXPECT_GT(CheckProblem(problem, 0, "paged auto long kv"), int64_t{1});
  }
}

// ---- ragged ----

TEST(RaggedCausalGqaWithEmptyRows) {
  // Request 1 has no keys; request 2 has more queries than keys.
  CheckRaggedAllModes(Spec(4, 2, 64, {97, 0, 3, 400}, {97, 2, 5, 17}), "ragged causal");
}

TEST(RaggedEmptyRequestsAndNoQueries) {
  // A request with no queries (and keys) between others.
  CheckRaggedAllModes(Spec(4, 1, 32, {10, 50, 1}, {10, 0, 1}), "ragged zero q_len");
}

TEST(RaggedWindowAndSoftCap) {
  ProblemSpec spec = Spec(8, 2, 64, {160, 65}, {150, 64});
  spec.options.window_left = 50;
  spec.options.logits_soft_cap = 1.5f;
  CheckRaggedAllModes(spec, "ragged window+soft cap");
}

TEST(RaggedNonCausal) {
  ProblemSpec spec = Spec(2, 2, 40, {33, 129}, {7, 20});
  spec.options.causal = false;
  CheckRaggedAllModes(spec, "ragged non-causal");
  spec.options.window_left = 4;
  CheckRaggedAllModes(spec, "ragged non-causal window");
}

TEST(RaggedSmallAndLargeHeadDims) {
  for (int64_t d : {1, 7, 256}) {
    CheckRaggedAllModes(Spec(2, 1, d, {5, 70}, {2, 3}), "ragged head_dim=" + std::to_string(d));
  }
}

TEST(LargeGqaGroups) {
  // Groups of 32 and 128 qo heads per kv head: a tile holds 2 tokens, then a single one.
  CheckRaggedAllModes(Spec(32, 1, 16, {100, 3}, {5, 3}), "ragged group 32");
  CheckPagedAllModes(Spec(128, 1, 8, {70, 300}, {3, 2}), "paged group 128");
}

TEST(RaggedAutoSplitsBatchOneLongKv) {
  for (DType dtype : kDtypes) {
    ProblemSpec spec = Spec(4, 2, 64, {4096}, {1});
    spec.dtype = dtype;
    RaggedProblem problem = MakeRaggedProblem(spec);
    EXPECT_GT(CheckProblem(problem, 0, "ragged auto long kv"), int64_t{1});
  }
}

// ---- edges ----

TEST(EmptyCallsTouchNothing) {
  TestWorkspace& ws = SharedWorkspace();
  PagedProblem paged = MakePagedProblem(Spec(4, 2, 64, {5}, {}));
  auto params = paged.Params(ws.data(), ws.bytes(), 4);
  params.batch_size = 0;
  params.total_q = 0;
  EXPECT_EQ(int64_t{4}, splitkv::LaunchPagedAttention(params).num_splits);
  EXPECT_TRUE(paged.OutPaddingIntact());
  RaggedProblem ragged = MakeRaggedProblem(Spec(4, 2, 64, {0, 0}, {0, 0}));
  EXPECT_GE(splitkv::LaunchRaggedAttention(ragged.Params(ws.data(), ws.bytes(), 0)).num_splits, int64_t{1});
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
}

TEST(PlanMatchesLaunchAndLowersToFitASmallWorkspace) {
  // A workspace with room for exactly 2 splits: the planner's choice (more) is lowered to 2.
  ProblemSpec spec = Spec(4, 2, 64, {2048}, {});
  PagedProblem problem = MakePagedProblem(spec);
  const splitkv::LayoutShape shape{problem.total_q, 4, 64};
  TestWorkspace small(splitkv::RequiredWorkspaceBytes(shape, 2));
  const auto params = problem.Params(small.data(), small.bytes(), 0);
  const auto planned = splitkv::PlanPagedAttention(params);
  EXPECT_EQ(int64_t{2}, planned.num_splits);
  EXPECT_EQ(planned.num_splits, splitkv::LaunchPagedAttention(params).num_splits);
  EXPECT_EQ(int64_t{0}, small.NonzeroCounters());
  const auto ref = problem.Reference();
  EXPECT_ALLCLOSE("lowered plan out", ref.out, problem.Out(), 2e-5, 1e-4);
  // Only the counter region: one split, output written directly.
  TestWorkspace minimal(splitkv::kCounterRegionBytes);
  problem.ClearOutputs();
  EXPECT_EQ(int64_t{1}, splitkv::LaunchPagedAttention(problem.Params(minimal.data(), minimal.bytes(), 0)).num_splits);
  EXPECT_ALLCLOSE("counter-region-only out", ref.out, problem.Out(), 2e-5, 1e-4);
  EXPECT_EQ(int64_t{0}, minimal.NonzeroCounters());
}

// Two threads, each with its own workspace and outputs, launching at the same time: the
// results match the single-threaded ones bit for bit (run under TSAN for the pool + atomics).
TEST(ConcurrentCallersWithTheirOwnWorkspaces) {
  ProblemSpec spec = Spec(8, 2, 64, {700, 97, 300}, {3, 1, 17});
  spec.dtype = DType::kBFloat16;
  const PagedProblem base = MakePagedProblem(spec);
  const int32_t modes[2] = {4, 0};  // forced, and the planner's choice
  std::vector<unsigned char> expected[2];
  {
    TestWorkspace ws(kWorkspaceBytes);
    for (int m = 0; m < 2; ++m) {
      PagedProblem p = base;
      splitkv::LaunchPagedAttention(p.Params(ws.data(), ws.bytes(), modes[m]));
      expected[m] = p.out.bytes();
    }
  }
  constexpr int kThreads = 2, kRepeats = 10;
  std::vector<PagedProblem> problems(kThreads, base);
  std::vector<int> mismatches(kThreads, 0), nonzero(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TestWorkspace ws(kWorkspaceBytes);
      for (int r = 0; r < kRepeats; ++r) {
        const int m = (r + t) % 2;
        problems[t].ClearOutputs();
        splitkv::LaunchPagedAttention(problems[t].Params(ws.data(), ws.bytes(), modes[m]));
        mismatches[t] += problems[t].out.bytes() != expected[m];
        nonzero[t] += ws.NonzeroCounters() != 0;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(0, mismatches[t]);
    EXPECT_EQ(0, nonzero[t]);
  }
}

// Two threads sharing ONE workspace (against launchers.h's ownership rule): each call either
// runs alone, bit for bit the single-threaded result, or is refused "workspace in use"
// (its out untouched); never a wrong or half-written output. The region is zero after.
TEST(TwoCallersSharingOneWorkspaceAreRefusedNeverWrong) {
  ProblemSpec spec = Spec(8, 2, 64, {700, 97, 300}, {3, 1, 17});
  const PagedProblem base = MakePagedProblem(spec);
  TestWorkspace ws(kWorkspaceBytes);
  std::vector<unsigned char> expected;
  {
    PagedProblem p = base;
    splitkv::LaunchPagedAttention(p.Params(ws.data(), ws.bytes(), 4));
    expected = p.out.bytes();
  }
  // Each thread runs until kRuns of its calls have run (a refused call returns at once, so
  // a thread may be refused many times while the other holds the workspace).
  constexpr int kThreads = 2, kRuns = 50, kMaxAttempts = 1000000;
  std::vector<PagedProblem> problems(kThreads, base);
  std::vector<int> ran(kThreads, 0), wrong(kThreads, 0), refused(kThreads, 0), other(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int attempt = 0; ran[t] < kRuns && attempt < kMaxAttempts; ++attempt) {
        problems[t].ClearOutputs();
        const std::vector<unsigned char> cleared = problems[t].out.bytes();
        try {
          splitkv::LaunchPagedAttention(problems[t].Params(ws.data(), ws.bytes(), 4));
          ++ran[t];
          wrong[t] += problems[t].out.bytes() != expected;
        } catch (const splitkv::WorkspaceError& e) {
          const bool in_use = std::string(e.what()).find("workspace in use") != std::string::npos;
          refused[t] += in_use;
          other[t] += !in_use || problems[t].out.bytes() != cleared;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(kRuns, ran[t]);
    EXPECT_EQ(0, wrong[t]);
    EXPECT_EQ(0, other[t]);
  }
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
}

}  // namespace

int main() {
  // More pool threads than this machine's cores, so tasks interleave; fixed, so the
  // planner's choices do not depend on the machine. Must precede the pool's first use.
  setenv("SPLITKV_NUM_THREADS", "4", /*overwrite=*/0);
  return splitkv_test::RunAllTests();
}
