// Refused calls: every argument check the launchers make on the CPU backend throws the
// right exception type with a message naming the operation, the argument and the value,
// and leaves the counter region zero and the output untouched. Also: a corrupted counter is
// detected before a split launch, and CheckCounterRegionZero reports the first bad counter.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cc/splitkv/errors.h"
#include "cc/splitkv/launchers.h"
#include "cc/splitkv/workspace_layout.h"
#include "tests/cc/attention_problems.h"
#include "tests/cc/test_check.h"
#include "tests/cc/test_workspace.h"

namespace {

using splitkv::InvalidArgument;
using splitkv::PagedAttentionParams;
using splitkv::RaggedAttentionParams;
using splitkv::UnsupportedError;
using splitkv::WorkspaceError;
using splitkv_test::PagedProblem;
using splitkv_test::ProblemSpec;
using splitkv_test::RaggedProblem;
using splitkv_test::TestWorkspace;

constexpr int64_t kWorkspaceBytes = splitkv::kCounterRegionBytes + (int64_t{2} << 20);
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TestWorkspace& SharedWorkspace() {
  static TestWorkspace* workspace = new TestWorkspace(kWorkspaceBytes);
  return *workspace;
}

// Which exception a bad call must throw.
enum class Kind { kInvalidArgument, kWorkspace, kUnsupported };

// A valid small call (2 forced splits, so a launch that got through would use counters).
ProblemSpec BaseSpec() {
  ProblemSpec spec;
  spec.num_qo_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.kv_lens = {40, 97};
  spec.q_lens = {3, 2};
  spec.page_size = 16;
  return spec;
}

template <typename Problem, typename Params>
struct BadCall {
  std::string name;
  Kind kind;
  std::function<void(Problem&, Params&)> mutate;
  std::vector<std::string> substrings;  // besides "<op>: "
};

template <typename Problem, typename Params>
void CheckRefused(const Problem& base, const char* op, const std::vector<BadCall<Problem, Params>>& calls,
                  splitkv::SplitPlan (*launch)(const Params&)) {
  TestWorkspace& ws = SharedWorkspace();
  for (const auto& call : calls) {
    Problem problem = base;
    Params params = problem.Params(ws.data(), ws.bytes(), 2);
    call.mutate(problem, params);
    std::vector<std::string> wanted = call.substrings;
    wanted.push_back(std::string(op) + ": ");
    // Workspace-size messages say "need N bytes ..., got M" instead (STYLE.md's example).
    if (call.kind != Kind::kWorkspace) wanted.push_back("expected");
    const auto before = problem.out.bytes();
    const std::string label = std::string(op) + " with bad " + call.name;
    const auto run = [&] { launch(params); };
    std::string message;
    switch (call.kind) {
      case Kind::kInvalidArgument:
        message = splitkv_test::ExpectThrows<InvalidArgument>(__FILE__, __LINE__, label.c_str(), run, wanted);
        break;
      case Kind::kWorkspace:
        message = splitkv_test::ExpectThrows<WorkspaceError>(__FILE__, __LINE__, label.c_str(), run, wanted);
        break;
      case Kind::kUnsupported:
        message = splitkv_test::ExpectThrows<UnsupportedError>(__FILE__, __LINE__, label.c_str(), run, wanted);
        break;
    }
    if (!message.empty() && message.rfind(std::string(op) + ": ", 0) != 0) {
      splitkv_test::Fail(__FILE__, __LINE__, call.name + ": message should start with the op: got \"" + message + "\"");
    }
    if (ws.NonzeroCounters() != 0) {
      splitkv_test::Fail(__FILE__, __LINE__, call.name + ": refused call left nonzero counters");
      std::memset(ws.data(), 0, splitkv::kCounterRegionBytes);
    }
    if (problem.out.bytes() != before) splitkv_test::Fail(__FILE__, __LINE__, call.name + ": refused call wrote out");
  }
}

// Checks every caller-visible option and workspace argument of either op.
template <typename Problem, typename Params>
std::vector<BadCall<Problem, Params>> CommonBadCalls() {
  using P = Params;
  using B = BadCall<Problem, Params>;
  const auto ws_data = [](P& p) { return static_cast<unsigned char*>(p.workspace.data); };
  return {
      B{"dtype", Kind::kInvalidArgument, [](Problem&, P& p) { p.dtype = static_cast<splitkv::DType>(7); }, {"dtype", "got 7"}},
      B{"backend", Kind::kInvalidArgument, [](Problem&, P& p) { p.backend = static_cast<splitkv::Backend>(9); },
        {"backend", "got 9"}},
      B{"cuda", Kind::kUnsupported, [](Problem&, P& p) { p.backend = splitkv::Backend::kCuda; },
        {"backend cuda", "not in this build"}},
      B{"num_qo_heads", Kind::kInvalidArgument, [](Problem&, P& p) { p.num_qo_heads = 0; }, {"num_qo_heads", "got 0"}},
      B{"num_kv_heads", Kind::kInvalidArgument, [](Problem&, P& p) { p.num_kv_heads = 0; }, {"num_kv_heads", "got 0"}},
      B{"group", Kind::kInvalidArgument, [](Problem&, P& p) { p.num_qo_heads = 5; },
        {"num_qo_heads is not a multiple of num_kv_heads", "got 5"}},
      B{"head_dim 0", Kind::kInvalidArgument, [](Problem&, P& p) { p.head_dim = 0; }, {"head_dim", "got 0"}},
      B{"head_dim big", Kind::kInvalidArgument, [](Problem&, P& p) { p.head_dim = 1025; }, {"head_dim", "got 1025"}},
      B{"window_left", Kind::kInvalidArgument, [](Problem&, P& p) { p.options.window_left = -2; },
        {"window_left", "got -2"}},
      B{"soft cap negative", Kind::kInvalidArgument, [](Problem&, P& p) { p.options.logits_soft_cap = -1.0f; },
        {"logits_soft_cap", "got -1"}},
      B{"soft cap nan", Kind::kInvalidArgument, [](Problem&, P& p) { p.options.logits_soft_cap = kNaN; },
        {"logits_soft_cap", "nan"}},
      B{"soft cap inf", Kind::kInvalidArgument, [](Problem&, P& p) { p.options.logits_soft_cap = kInf; },
        {"logits_soft_cap", "inf"}},
      B{"sm_scale nan", Kind::kInvalidArgument, [](Problem&, P& p) { p.options.sm_scale = kNaN; }, {"sm_scale", "nan"}},
      B{"sm_scale inf", Kind::kInvalidArgument, [](Problem&, P& p) { p.options.sm_scale = -kInf; }, {"sm_scale", "inf"}},
      B{"out rows overlap", Kind::kInvalidArgument, [](Problem&, P& p) { p.out_stride_head = 0; },
        {"out strides overlap", "out_stride_head = 0"}},
      B{"max_q_len beyond int32", Kind::kInvalidArgument, [](Problem&, P& p) { p.max_q_len = int64_t{1} << 62; },
        {"max_q_len", "2147483648)"}},
      B{"num_splits", Kind::kInvalidArgument, [](Problem&, P& p) { p.options.num_splits = -1; },
        {"num_splits", "got -1"}},
      B{"workspace null", Kind::kWorkspace, [](Problem&, P& p) { p.workspace.data = nullptr; },
        {"workspace is null"}},
      // An empty buffer (torch's 0-element tensor: null data, 0 bytes) is too small, not null.
      B{"workspace empty", Kind::kWorkspace,
        [](Problem&, P& p) {
          p.workspace.data = nullptr;
          p.workspace.bytes = 0;
        },
        {"workspace too small", std::to_string(splitkv::kCounterRegionBytes), "got 0"}},
      B{"workspace misaligned", Kind::kWorkspace,
        [ws_data](Problem&, P& p) {
          p.workspace.data = ws_data(p) + 16;
          p.workspace.bytes -= 16;
        },
        {"workspace misaligned", "256", "= 16"}},
      B{"workspace below counters", Kind::kWorkspace,
        [](Problem&, P& p) { p.workspace.bytes = splitkv::kCounterRegionBytes - 1; },
        {"workspace too small", std::to_string(splitkv::kCounterRegionBytes), "got 8388607"}},
      B{"forced splits too big", Kind::kWorkspace,
        [](Problem&, P& p) {
          p.options.num_splits = 64;
          p.workspace.bytes = splitkv::kCounterRegionBytes + 256;
        },
        {"workspace too small", "num_splits=64", "got 8388864"}},
  };
}

TEST(PagedBadArgumentsAreRefused) {
  using B = BadCall<PagedProblem, PagedAttentionParams>;
  const PagedProblem base = splitkv_test::MakePagedProblem(BaseSpec());
  std::vector<B> calls = CommonBadCalls<PagedProblem, PagedAttentionParams>();
  const std::string capacity = std::to_string(base.max_pages_per_seq * base.spec.page_size);
  const std::vector<B> paged = {
      B{"batch_size", Kind::kInvalidArgument, [](auto&, auto& p) { p.batch_size = -1; }, {"batch_size", "got -1"}},
      B{"total_q", Kind::kInvalidArgument, [](auto&, auto& p) { p.total_q = -1; }, {"total_q", "got -1"}},
      B{"num_pages", Kind::kInvalidArgument, [](auto&, auto& p) { p.num_pages = 0; }, {"num_pages", "got 0"}},
      B{"page_size", Kind::kInvalidArgument, [](auto&, auto& p) { p.page_size = 0; }, {"page_size", "got 0"}},
      B{"max_pages_per_seq", Kind::kInvalidArgument, [](auto&, auto& p) { p.max_pages_per_seq = 0; },
        {"max_pages_per_seq", "got 0"}},
      B{"block_tables_stride", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.block_tables_stride = -1; }, {"block_tables_stride", "or >= max_pages_per_seq", "got -1"}},
      B{"block_tables rows overlapping", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.block_tables_stride = p.max_pages_per_seq - 1; },
        {"block_tables_stride out of range", "0 (one row for every request)"}},
      B{"max_q_len", Kind::kInvalidArgument, [](auto&, auto& p) { p.max_q_len = 0; }, {"max_q_len", "got 0"}},
      B{"max_kv_len", Kind::kInvalidArgument, [](auto&, auto& p) { p.max_kv_len = -1; }, {"max_kv_len", "got -1"}},
      B{"decode total_q", Kind::kInvalidArgument, [](auto&, auto& p) { p.cu_seqlens_q = nullptr; },
        {"total_q mismatch", "batch_size", "got 5"}},
      B{"q stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.q_stride_token = -1; }, {"q strides", "-1"}},
      B{"out stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.out_stride_head = -1; }, {"out strides", "-1"}},
      B{"k_cache stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.k_stride_page = -1; },
        {"k_cache strides", "-1"}},
      B{"v_cache stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.v_stride_head = -1; },
        {"v_cache strides", "-1"}},
      B{"slot stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.v_stride_slot = -1; }, {"slot", "-1"}},
      // Strides whose products pass 2^63 bytes: index * stride would wrap (a float32 out with
      // stride_token 2^62 put every token's row on row 0, past the overlap check).
      B{"out stride wrapping", Kind::kInvalidArgument, [](auto&, auto& p) { p.out_stride_token = int64_t{1} << 62; },
        {"out strides out of range", "elements within 2^63 bytes of the first", "x stride 4611686018427387904"}},
      B{"k_cache page stride wrapping", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.k_stride_page = int64_t{1} << 61; }, {"k_cache strides out of range"}},
      B{"q misaligned", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.q = static_cast<const char*>(p.q) + 1; },
        {"q misaligned", "aligned to its element size", "% 4 = 1"}},
      B{"seq_lens misaligned", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.seq_lens = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(p.seq_lens) + 2); },
        {"seq_lens misaligned", "% 4 = 2"}},
      // out written over what the kernels read meanwhile, or over the workspace: refused (out
      // over seq_lens crashed a CPU launch; out over the counters left them dirty).
      B{"out over seq_lens", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.seq_lens = static_cast<const int32_t*>(p.out) + 4; },
        {"out overlaps seq_lens", "a buffer sharing no byte with seq_lens"}},
      B{"out over the workspace", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.out = static_cast<char*>(p.workspace.data) + 64; },
        {"out overlaps workspace"}},
      B{"lse over out", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.lse = static_cast<float*>(p.out); }, {"lse overlaps out"}},
      B{"block_tables stride wrapping", Kind::kInvalidArgument,
        [](auto&, auto& p) { p.block_tables_stride = int64_t{1} << 62; }, {"block_tables strides out of range"}},
      B{"q null", Kind::kInvalidArgument, [](auto&, auto& p) { p.q = nullptr; }, {"q is null"}},
      B{"out null", Kind::kInvalidArgument, [](auto&, auto& p) { p.out = nullptr; }, {"out is null"}},
      B{"k_cache null", Kind::kInvalidArgument, [](auto&, auto& p) { p.k_cache = nullptr; }, {"k_cache is null"}},
      B{"v_cache null", Kind::kInvalidArgument, [](auto&, auto& p) { p.v_cache = nullptr; }, {"v_cache is null"}},
      B{"block_tables null", Kind::kInvalidArgument, [](auto&, auto& p) { p.block_tables = nullptr; },
        {"block_tables is null"}},
      B{"seq_lens null", Kind::kInvalidArgument, [](auto&, auto& p) { p.seq_lens = nullptr; }, {"seq_lens is null"}},
      B{"cu_seqlens_q[0]", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.cu_q[0] = 1; },
        {"cu_seqlens_q[0]", "got 1"}},
      B{"cu_seqlens_q decreasing", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.cu_q[1] = 6; },
        {"cu_seqlens_q decreases at index 2", "got 5"}},
      B{"cu_seqlens_q end", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.cu_q[2] = 4; },
        {"cu_seqlens_q[batch_size] does not match total_q", "expected 5", "got 4"}},
      B{"max_q_len short", Kind::kInvalidArgument, [](auto&, auto& p) { p.max_q_len = 2; },
        {"max_q_len is below the longest query", ">= 3", "got 2"}},
      B{"seq_lens negative", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.seq_lens[1] = -1; },
        {"seq_lens[1]", "out of range", "got -1"}},
      B{"seq_lens too long", Kind::kInvalidArgument, [capacity](auto& pr, auto&) { pr.seq_lens[0] = std::stoi(capacity) + 1; },
        {"seq_lens[0]", "[0, " + capacity + "]", "got " + std::to_string(std::stoi(capacity) + 1)}},
      B{"page id too big", Kind::kInvalidArgument,
        [](auto& pr, auto&) { pr.block_tables[1 * pr.block_tables_stride + 6] = static_cast<int32_t>(pr.num_pages); },
        {"block_tables[1][6]", "page id", "got " + std::to_string(base.num_pages)}},
      B{"page id negative", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.block_tables[0] = -1; },
        {"block_tables[0][0]", "got -1"}},
      // Keys as shards of longer requests: both pointers or neither, and each shard inside.
      B{"kv_offsets alone", Kind::kInvalidArgument,
        [](auto&, auto& p) {
          static const int32_t offsets[2] = {0, 0};
          p.kv_offsets = offsets;
        },
        {"kv_offsets/full_seq_lens given without the other", "both or neither", "got kv_offsets only"}},
      B{"full_seq_lens alone", Kind::kInvalidArgument,
        [](auto&, auto& p) {
          static const int32_t full[2] = {40, 97};
          p.full_seq_lens = full;
        },
        {"kv_offsets/full_seq_lens given without the other", "got full_seq_lens only"}},
      B{"kv_offsets negative", Kind::kInvalidArgument,
        [](auto&, auto& p) {
          static const int32_t offsets[2] = {-1, 0}, full[2] = {40, 97};
          p.kv_offsets = offsets;
          p.full_seq_lens = full;
        },
        {"kv_offsets[0] out of range", "got kv_offsets -1, seq_lens 40, full_seq_lens 40"}},
      B{"shard past full_seq_lens", Kind::kInvalidArgument,
        [](auto&, auto& p) {
          static const int32_t offsets[2] = {0, 10}, full[2] = {40, 100};
          p.kv_offsets = offsets;
          p.full_seq_lens = full;
        },
        {"kv_offsets[1] out of range", "kv_offsets[b] + seq_lens[b] <= full_seq_lens[b]",
         "got kv_offsets 10, seq_lens 97, full_seq_lens 100"}},
  };
  calls.insert(calls.end(), paged.begin(), paged.end());
  CheckRefused<PagedProblem, PagedAttentionParams>(base, "paged_attention", calls, &splitkv::LaunchPagedAttention);
}

TEST(RaggedBadArgumentsAreRefused) {
  using B = BadCall<RaggedProblem, RaggedAttentionParams>;
  const RaggedProblem base = splitkv_test::MakeRaggedProblem(BaseSpec());
  std::vector<B> calls = CommonBadCalls<RaggedProblem, RaggedAttentionParams>();
  const std::vector<B> ragged = {
      B{"batch_size", Kind::kInvalidArgument, [](auto&, auto& p) { p.batch_size = -1; }, {"batch_size", "got -1"}},
      B{"total_q", Kind::kInvalidArgument, [](auto&, auto& p) { p.total_q = -1; }, {"total_q", "got -1"}},
      B{"total_kv", Kind::kInvalidArgument, [](auto&, auto& p) { p.total_kv = -1; }, {"total_kv", "got -1"}},
      B{"max_q_len", Kind::kInvalidArgument, [](auto&, auto& p) { p.max_q_len = -1; }, {"max_q_len", "got -1"}},
      B{"max_kv_len", Kind::kInvalidArgument, [](auto&, auto& p) { p.max_kv_len = -1; }, {"max_kv_len", "got -1"}},
      B{"q stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.q_stride_head = -1; }, {"q strides", "-1"}},
      B{"k stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.k_stride_token = -1; }, {"k strides", "-1"}},
      B{"v stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.v_stride_head = -1; }, {"v strides", "-1"}},
      B{"out stride", Kind::kInvalidArgument, [](auto&, auto& p) { p.out_stride_token = -1; }, {"out strides", "-1"}},
      B{"out stride wrapping", Kind::kInvalidArgument, [](auto&, auto& p) { p.out_stride_token = int64_t{1} << 62; },
        {"out strides out of range"}},
      B{"q head stride wrapping", Kind::kInvalidArgument, [](auto&, auto& p) { p.q_stride_head = int64_t{1} << 62; },
        {"q strides out of range"}},
      B{"v token stride wrapping", Kind::kInvalidArgument, [](auto&, auto& p) { p.v_stride_token = INT64_MAX / 2; },
        {"v strides out of range"}},
      B{"cu_seqlens_q null", Kind::kInvalidArgument, [](auto&, auto& p) { p.cu_seqlens_q = nullptr; },
        {"cu_seqlens_q is null"}},
      B{"cu_seqlens_kv null", Kind::kInvalidArgument, [](auto&, auto& p) { p.cu_seqlens_kv = nullptr; },
        {"cu_seqlens_kv is null"}},
      B{"q null", Kind::kInvalidArgument, [](auto&, auto& p) { p.q = nullptr; }, {"q is null"}},
      B{"out null", Kind::kInvalidArgument, [](auto&, auto& p) { p.out = nullptr; }, {"out is null"}},
      B{"k null", Kind::kInvalidArgument, [](auto&, auto& p) { p.k = nullptr; }, {"k is null"}},
      B{"v null", Kind::kInvalidArgument, [](auto&, auto& p) { p.v = nullptr; }, {"v is null"}},
      B{"cu_seqlens_q[0]", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.cu_q[0] = 2; },
        {"cu_seqlens_q[0]", "got 2"}},
      B{"cu_seqlens_kv decreasing", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.cu_kv[1] = 140; },
        {"cu_seqlens_kv decreases at index 2", "got 137"}},
      B{"cu_seqlens_kv end", Kind::kInvalidArgument, [](auto&, auto& p) { p.total_kv = 136; },
        {"cu_seqlens_kv[batch_size] does not match total_kv", "expected 136", "got 137"}},
      B{"cu_seqlens_q end", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.cu_q[2] = 6; },
        {"cu_seqlens_q[batch_size] does not match total_q", "expected 5", "got 6"}},
      B{"max_q_len short", Kind::kInvalidArgument, [](auto&, auto& p) { p.max_q_len = 2; },
        {"max_q_len is below the longest query", ">= 3", "got 2"}},
      // Refused before any value is read (the host check of their values read them shifted,
      // one byte past the array's end, and named a value never written).
      B{"cu_seqlens_q misaligned", Kind::kInvalidArgument,
        [](auto&, auto& p) {
          p.cu_seqlens_q = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(p.cu_seqlens_q) + 1);
        },
        {"cu_seqlens_q misaligned", "% 4 = 1"}},
      B{"cu_seqlens_kv misaligned", Kind::kInvalidArgument,
        [](auto&, auto& p) {
          p.cu_seqlens_kv = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(p.cu_seqlens_kv) + 2);
        },
        {"cu_seqlens_kv misaligned", "% 4 = 2"}},
  };
  calls.insert(calls.end(), ragged.begin(), ragged.end());
  CheckRefused<RaggedProblem, RaggedAttentionParams>(base, "ragged_attention", calls, &splitkv::LaunchRaggedAttention);
}

// A call without query rows (every request's q_len 0) computes nothing, yet the CPU refuses
// the index values the same call with query rows would (launchers.h); only null index arrays,
// which a C++ caller may pass when no query row needs them, go unread.
TEST(IndexValuesAreCheckedWithoutQueryRows) {
  ProblemSpec spec = BaseSpec();
  spec.q_lens = {0, 0};
  using R = BadCall<RaggedProblem, RaggedAttentionParams>;
  CheckRefused<RaggedProblem, RaggedAttentionParams>(
      splitkv_test::MakeRaggedProblem(spec), "ragged_attention",
      {R{"cu_seqlens_kv decreasing", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.cu_kv[1] = 140; },
         {"cu_seqlens_kv decreases at index 2", "got 137"}},
       R{"cu_seqlens_q[0]", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.cu_q[0] = 2; },
         {"cu_seqlens_q[0]", "got 2"}}},
      &splitkv::LaunchRaggedAttention);
  using P = BadCall<PagedProblem, PagedAttentionParams>;
  const PagedProblem paged = splitkv_test::MakePagedProblem(spec);
  CheckRefused<PagedProblem, PagedAttentionParams>(
      paged, "paged_attention",
      {P{"seq_lens negative", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.seq_lens[1] = -1; },
         {"seq_lens[1]", "out of range", "got -1"}},
       P{"page id negative", Kind::kInvalidArgument, [](auto& pr, auto&) { pr.block_tables[0] = -1; },
         {"block_tables[0][0]", "got -1"}}},
      &splitkv::LaunchPagedAttention);
  TestWorkspace& ws = SharedWorkspace();
  PagedProblem unread = paged;
  PagedAttentionParams params = unread.Params(ws.data(), ws.bytes(), 2);
  params.seq_lens = nullptr;
  params.block_tables = nullptr;
  EXPECT_EQ(int64_t{2}, splitkv::LaunchPagedAttention(params).num_splits);
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
}

// Inputs a C++ caller placed inside the workspace, which the launch writes (counters, the
// in-use word, partials) while its kernels read them: refused before anything is read or
// written (an index array in the in-use word was overwritten after its check and crashed).
// And a page_size near INT64_MAX, whose page count once wrapped and skipped the page-id check.
TEST(InputsInTheWorkspaceAndHugePagesAreRefused) {
  const auto inside = [](auto& p, int64_t offset) {
    return static_cast<unsigned char*>(p.workspace.data) + splitkv::kCounterRegionBytes + offset;
  };
  using P = BadCall<PagedProblem, PagedAttentionParams>;
  const PagedProblem paged = splitkv_test::MakePagedProblem(BaseSpec());
  CheckRefused<PagedProblem, PagedAttentionParams>(
      paged, "paged_attention",
      {P{"block_tables in the workspace", Kind::kInvalidArgument,
         [inside](auto&, auto& p) { p.block_tables = reinterpret_cast<const int32_t*>(inside(p, -4)); },
         {"workspace overlaps block_tables"}},
       P{"q in the workspace", Kind::kInvalidArgument, [inside](auto&, auto& p) { p.q = inside(p, 4096); },
         {"workspace overlaps q"}},
       P{"v_cache in the workspace", Kind::kInvalidArgument, [inside](auto&, auto& p) { p.v_cache = inside(p, 0); },
         {"workspace overlaps v_cache"}},
       P{"page_size near INT64_MAX", Kind::kInvalidArgument,
         [](auto& pr, auto& p) {
           p.page_size = INT64_MAX;
           p.k_stride_slot = p.v_stride_slot = 0;
           p.max_pages_per_seq = 1;
           pr.block_tables[0] = static_cast<int32_t>(pr.num_pages);
         },
         {"block_tables[0][0]", "page id", "got " + std::to_string(paged.num_pages)}},
       P{"max_kv_len past int32", Kind::kInvalidArgument,
         [](auto&, auto& p) { p.max_kv_len = int64_t{1} << 40; }, {"max_kv_len", "out of range", "2147483648)"}}},
      &splitkv::LaunchPagedAttention);
  using R = BadCall<RaggedProblem, RaggedAttentionParams>;
  CheckRefused<RaggedProblem, RaggedAttentionParams>(
      splitkv_test::MakeRaggedProblem(BaseSpec()), "ragged_attention",
      {R{"k in the workspace", Kind::kInvalidArgument, [inside](auto&, auto& p) { p.k = inside(p, 256); },
         {"workspace overlaps k"}}},
      &splitkv::LaunchRaggedAttention);
}

// A nonzero counter that a split launch would use: refused before any task runs, and the
// counter region zeroed (healed), so the same call then runs.
TEST(CorruptedCounterIsDetectedAndHealed) {
  TestWorkspace ws(kWorkspaceBytes);
  PagedProblem paged = splitkv_test::MakePagedProblem(BaseSpec());
  const auto params = paged.Params(ws.data(), ws.bytes(), 2);
  const int64_t tiles = splitkv::PlanPagedAttention(params).num_tiles;
  for (int64_t index : {int64_t{0}, tiles - 1}) {
    ws.counters()[index] = 3;
    const auto before = paged.out.bytes();
    EXPECT_THROWS(WorkspaceError, splitkv::LaunchPagedAttention(params), "paged_attention: ",
                  "counter region corrupted", "counter " + std::to_string(index), "got 3",
                  "bytes " + std::to_string(index * 4) + ".." + std::to_string(index * 4 + 4));
    EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());  // healed
    EXPECT_TRUE(paged.out.bytes() == before);     // refused: out untouched
  }
  RaggedProblem ragged = splitkv_test::MakeRaggedProblem(BaseSpec());
  ws.counters()[1] = 1;
  ws.counters()[splitkv::kMaxCounters - 1] = 5;  // one no launch here uses: zeroed all the same
  EXPECT_THROWS(WorkspaceError, splitkv::LaunchRaggedAttention(ragged.Params(ws.data(), ws.bytes(), 2)),
                "ragged_attention: ", "counter region corrupted", "counter 1", "reset to zero");
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  // Healed: the same calls run and leave the region zero.
  splitkv::LaunchPagedAttention(params);
  splitkv::LaunchRaggedAttention(ragged.Params(ws.data(), ws.bytes(), 2));
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
}

// The in-use word: a launch's claim (kStatusInUseClaim) left set makes every launch refuse
// "workspace in use", touching nothing, until ResetCounterRegion clears it; any other value
// there is stray bytes, healed and refused like a dirty counter (by check_workspace too). A set
// status record word is refused and healed (one-split calls too: the CPU never writes it).
TEST(StaleInUseWordAndStatusRecordOnTheCpu) {
  TestWorkspace ws(kWorkspaceBytes);
  PagedProblem paged = splitkv_test::MakePagedProblem(BaseSpec());
  uint32_t* status = ws.counters() + splitkv::kStatusOffset / splitkv::kCounterBytes;
  splitkv::WorkspaceBuffer buffer;
  buffer.data = ws.data();
  buffer.bytes = ws.bytes();
  status[splitkv::kStatusInUseWord] = splitkv::kStatusInUseClaim;
  ws.counters()[3] = 9;  // a dirty counter too: untouched by a refused claim
  EXPECT_THROWS(WorkspaceError, splitkv::LaunchPagedAttention(paged.Params(ws.data(), ws.bytes(), 2)),
                "paged_attention: workspace in use", "(bytes 8388604..8388608) to be 0, got " +
                std::to_string(splitkv::kStatusInUseClaim) + " (a launch's claim)",
                "if no launch is running, ResetCounterRegion / splitkv.reset_counter_region clears it",
                "nothing was computed");
  EXPECT_THROWS(WorkspaceError, splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr),
                "check_workspace: workspace in use");
  EXPECT_EQ(9u, ws.counters()[3]);
  EXPECT_EQ(splitkv::kStatusInUseClaim, status[splitkv::kStatusInUseWord]);
  splitkv::ResetCounterRegion(buffer, splitkv::Backend::kCpu, nullptr);
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  splitkv::LaunchPagedAttention(paged.Params(ws.data(), ws.bytes(), 2));
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  for (const uint32_t stray : {1u, splitkv::kStatusInUseClaim + 1, 0xFFFFFFFFu}) {
    status[splitkv::kStatusInUseWord] = stray;
    ws.counters()[3] = 9;
    EXPECT_THROWS(WorkspaceError, splitkv::LaunchPagedAttention(paged.Params(ws.data(), ws.bytes(), 1)),
                  "paged_attention: workspace counter region corrupted: expected its in-use word (bytes "
                  "8388604..8388608) to be 0 at rest, got " + std::to_string(stray),
                  "nothing was computed and the counter region was reset to zero");
    EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
    status[splitkv::kStatusInUseWord] = stray;
    EXPECT_THROWS(WorkspaceError, splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr),
                  "check_workspace: workspace counter region corrupted: expected its in-use word",
                  "got " + std::to_string(stray));
    EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
    splitkv::LaunchPagedAttention(paged.Params(ws.data(), ws.bytes(), 2));  // healed
    EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  }
  status[1] = 4;
  EXPECT_THROWS(WorkspaceError, splitkv::LaunchPagedAttention(paged.Params(ws.data(), ws.bytes(), 1)),
                "paged_attention: workspace counter region corrupted: expected the status record",
                "got 4 in its word 1", "reset to zero");
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  status[2] = 4;  // CheckWorkspaceStatus on the CPU sees every word, not only the code word
  EXPECT_THROWS(WorkspaceError, splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr),
                "check_workspace: workspace counter region corrupted", "got 4 in its word 2");
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  // An unknown backend value is refused, never taken for the CPU's host memset.
  const auto unknown = static_cast<splitkv::Backend>(7);
  ws.counters()[3] = 9;
  EXPECT_THROWS(InvalidArgument, splitkv::ResetCounterRegion(buffer, unknown, nullptr),
                "reset_counter_region: backend unknown", "got 7");
  EXPECT_THROWS(InvalidArgument, splitkv::CheckWorkspaceStatus("check_workspace", buffer, unknown, nullptr),
                "check_workspace: backend unknown", "got 7");
  // A null op name is refused with our exception, not std::string's std::logic_error.
  EXPECT_THROWS(InvalidArgument, splitkv::CheckWorkspaceStatus(nullptr, buffer, splitkv::Backend::kCpu, nullptr),
                "check_workspace_status: op is null");
  // A shifted view of the workspace (its words straddling two) is refused, touching nothing:
  // read as it is, its status word would take in a byte past the region.
  for (const int64_t shift : {1, 4}) {
    const splitkv::WorkspaceBuffer shifted{static_cast<uint8_t*>(buffer.data) + shift, buffer.bytes - shift};
    EXPECT_THROWS(WorkspaceError, splitkv::ResetCounterRegion(shifted, splitkv::Backend::kCpu, nullptr),
                  "reset_counter_region: workspace misaligned: expected a base address aligned to 256 bytes",
                  "= " + std::to_string(shift));
    EXPECT_THROWS(WorkspaceError, splitkv::CheckWorkspaceStatus("check_workspace", shifted, splitkv::Backend::kCpu,
                                                                nullptr),
                  "check_workspace: workspace misaligned");
  }
  EXPECT_THROWS(WorkspaceError, splitkv::CheckCounterRegionZero(static_cast<uint8_t*>(buffer.data) + 2, buffer.bytes - 2),
                "check_counter_region: workspace misaligned: expected a base address aligned to 4 bytes", "= 2");
  EXPECT_EQ(9u, ws.counters()[3]);  // untouched by the refused calls
  splitkv::ResetCounterRegion(buffer, splitkv::Backend::kCpu, nullptr);
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
}

TEST(OneSplitLaunchesNeitherReadNorWriteCounters) {
  TestWorkspace ws(kWorkspaceBytes);
  PagedProblem paged = splitkv_test::MakePagedProblem(BaseSpec());
  ws.counters()[0] = 5;
  EXPECT_EQ(int64_t{1}, splitkv::LaunchPagedAttention(paged.Params(ws.data(), ws.bytes(), 1)).num_splits);
  EXPECT_EQ(5u, ws.counters()[0]);
  EXPECT_EQ(int64_t{1}, ws.NonzeroCounters());
}

// A CUDA launch's report in the host mirror is reported by CheckWorkspaceStatus, which zeroes
// the region and the mirror first; a record in a CPU workspace is stray bytes (no CPU launch
// writes one), named so; a clean workspace passes; ResetCounterRegion zeroes by hand.
TEST(CheckWorkspaceStatusReportsAndHeals) {
  TestWorkspace ws(kWorkspaceBytes);
  uint32_t mirror[splitkv::kStatusWords] = {};
  splitkv::WorkspaceBuffer buffer;
  buffer.data = ws.data();
  buffer.bytes = ws.bytes();
  buffer.status_host = mirror;
  splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr);
  splitkv_test::Pass();
  uint32_t* status = ws.counters() + splitkv::kStatusOffset / splitkv::kCounterBytes;
  status[0] = splitkv::kStatusDirtyCounter, status[1] = 77, status[2] = 0xFFFFFFFFu;
  ws.counters()[77] = 0xFFFFFFFFu;
  EXPECT_THROWS(WorkspaceError, splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr),
                "check_workspace: workspace counter region corrupted: expected the status record (bytes "
                "8388352..8388608) to be 0 at rest, got 1 in its word 0",
                "reset to zero");
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  // The mirror (a CUDA launch's report) is reported as the launch's, and is cleared.
  mirror[0] = splitkv::kStatusDirtyCounter, mirror[1] = 3, mirror[2] = 65536;
  EXPECT_THROWS(WorkspaceError, splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr),
                "found counter 3 (bytes 12..16) holding 65536");
  EXPECT_EQ(0u, mirror[0]);
  splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr);
  // A record no launch writes (another code, a counter past the region) is named as stray
  // bytes, not read as a counter index.
  const uint32_t stray[][splitkv::kStatusWords] = {
      {splitkv::kStatusDirtyCounter, static_cast<uint32_t>(splitkv::kMaxCounters), 9, 0}, {7, 5, 9, 0}, {1, 5, 9, 4}};
  for (const auto& words : stray) {
    for (int w = 0; w < splitkv::kStatusWords; ++w) mirror[w] = words[w];
    EXPECT_THROWS(WorkspaceError, splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr),
                  "check_workspace: workspace counter region corrupted: expected the status record (bytes "
                  "8388352..8388368) to be 0 or a launch's report {1, counter < 2097088, value, 0}, got {" +
                  std::to_string(words[0]) + ", " + std::to_string(words[1]) + ", 9, " + std::to_string(words[3]) + "}",
                  "reset to zero");
    EXPECT_EQ(0u, mirror[0]);
  }
  ws.counters()[5] = 1;
  splitkv::ResetCounterRegion(buffer, splitkv::Backend::kCpu, nullptr);
  EXPECT_EQ(int64_t{0}, ws.NonzeroCounters());
  buffer.bytes = 1024;
  EXPECT_THROWS(WorkspaceError, splitkv::CheckWorkspaceStatus("check_workspace", buffer, splitkv::Backend::kCpu, nullptr),
                "too small", "got 1024");
}

// CheckOptions names its caller's op; a null op is refused with our exception (not the
// std::logic_error of std::string(nullptr)), whether or not the options are valid.
TEST(CheckOptionsWithANullOp) {
  splitkv::AttentionOptions bad;
  bad.window_left = -5;
  EXPECT_THROWS(InvalidArgument, splitkv::CheckOptions(nullptr, bad), "check_options: op is null");
  EXPECT_THROWS(InvalidArgument, splitkv::CheckOptions(nullptr, splitkv::AttentionOptions{}), "check_options: op is null");
  EXPECT_THROWS(InvalidArgument, splitkv::CheckOptions("runner", bad), "runner: window_left out of range", "got -5");
}

TEST(CheckCounterRegionZeroNamesTheFirstNonzeroCounter) {
  TestWorkspace ws(splitkv::kCounterRegionBytes);
  splitkv::CheckCounterRegionZero(ws.data(), ws.bytes());
  splitkv_test::Pass();
  const int64_t last = splitkv::kMaxCounters - 1;
  ws.counters()[last] = 9;
  ws.counters()[12345] = 1;
  EXPECT_THROWS(WorkspaceError, splitkv::CheckCounterRegionZero(ws.data(), ws.bytes()), "counter region not zero",
                "got 2 nonzero", "index 12345", "byte " + std::to_string(12345 * 4), "holding 1");
  ws.counters()[12345] = 0;
  EXPECT_THROWS(WorkspaceError, splitkv::CheckCounterRegionZero(ws.data(), ws.bytes()), "got 1 nonzero",
                "index " + std::to_string(last), "byte " + std::to_string(last * 4), "holding 9");
  EXPECT_THROWS(WorkspaceError, splitkv::CheckCounterRegionZero(ws.data(), 1024), "too small", "got 1024");
}

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
