// splitkv from plain C++ (no Python, no libtorch): one workspace, zeroed once and sized by
// RequiredWorkspaceBytes, serves a paged decode batch and a ragged prefill batch, several
// calls each; the program prints the plans, a few results, and the counter region's state.
//
//   bazel run //cc/examples:attention_example
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cc/examples/example_batches.h"
#include "cc/examples/host_workspace.h"
#include "cc/splitkv/errors.h"
#include "cc/splitkv/launchers.h"
#include "cc/splitkv/workspace_layout.h"

namespace {

using splitkv_example::HostWorkspace;

// The most splits this program lets a call use; the workspace is sized for it.
constexpr int64_t kMaxSplits = 16;

std::string Join(const std::vector<int32_t>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return "[" + s + "]";
}

void PrintPlan(const char* what, const splitkv::SplitPlan& plan) {
  std::printf("  %s: num_splits=%lld over %lld work tiles; bytes used [0, %lld)\n", what,
              static_cast<long long>(plan.num_splits), static_cast<long long>(plan.num_tiles),
              static_cast<long long>(plan.layout.required_bytes));
}

// Head 0 of a token: the first values of out and its lse.
void PrintRow(const char* label, int64_t token, const std::vector<float>& out, const std::vector<float>& lse,
              int64_t num_qo_heads, int64_t head_dim) {
  const float* row = &out[token * num_qo_heads * head_dim];
  std::printf("  %s head 0: out[0:4] = [%+.5f, %+.5f, %+.5f, %+.5f], lse = %.5f\n", label, row[0], row[1], row[2],
              row[3], lse[token * num_qo_heads]);
}

void PrintCounterState(const HostWorkspace& workspace) {
  try {
    splitkv::CheckCounterRegionZero(workspace.data(), workspace.bytes());
    std::printf("  counter region: all %lld counters zero\n", static_cast<long long>(splitkv::kMaxCounters));
  } catch (const splitkv::WorkspaceError& error) {
    std::printf("  counter region: %s\n", error.what());
  }
}

}  // namespace

int main() {
  using splitkv_example::KvLayout;
  // The batches: decode over 1 to 2500 keys; prefill of three prompts (one extends a cached prefix).
  splitkv_example::PagedDecodeBatch decode =
      splitkv_example::MakePagedDecodeBatch({1, 17, 300, 2500}, KvLayout::kHND, /*seed=*/1);
  splitkv_example::RaggedPrefillBatch prefill =
      splitkv_example::MakeRaggedPrefillBatch(/*q_lens=*/{5, 64, 1}, /*kv_lens=*/{5, 80, 700}, /*seed=*/2);

  // One workspace for every call: sized for the largest call at kMaxSplits, zeroed once.
  const int64_t max_total_q = std::max(decode.batch_size(), prefill.total_q());
  const int64_t bytes = splitkv::RequiredWorkspaceBytes(
      splitkv::LayoutShape{max_total_q, decode.num_qo_heads, decode.head_dim}, kMaxSplits);
  const HostWorkspace workspace(bytes);
  std::printf("splitkv C++ example: CPU backend, float32\n");
  std::printf("workspace: %lld bytes = %lld counter region + stats/scratch for %lld splits of %lld tokens\n",
              static_cast<long long>(bytes), static_cast<long long>(splitkv::kCounterRegionBytes),
              static_cast<long long>(kMaxSplits), static_cast<long long>(max_total_q));

  std::printf("\npaged decode: seq_lens %s, %lld qo / %lld kv heads, head_dim %lld, page_size %lld, HND\n",
              Join(decode.seq_lens).c_str(), static_cast<long long>(decode.num_qo_heads),
              static_cast<long long>(decode.num_kv_heads), static_cast<long long>(decode.head_dim),
              static_cast<long long>(decode.page_size));
  PrintPlan("planner's choice", splitkv_example::RunPagedDecode(decode, workspace, /*num_splits=*/0));
  for (int64_t r = 0; r < decode.batch_size(); ++r) {
    const std::string label = "request " + std::to_string(r);
    PrintRow(label.c_str(), r, decode.out, decode.lse, decode.num_qo_heads, decode.head_dim);
  }
  PrintPlan("forced", splitkv_example::RunPagedDecode(decode, workspace, /*num_splits=*/4));
  PrintCounterState(workspace);

  // One long request leaves most workers idle without splitting: the planner splits its keys.
  splitkv_example::PagedDecodeBatch long_decode =
      splitkv_example::MakePagedDecodeBatch({8192}, KvLayout::kNHD, /*seed=*/3);
  std::printf("\npaged decode: seq_lens [8192], NHD\n");
  PrintPlan("planner's choice", splitkv_example::RunPagedDecode(long_decode, workspace, /*num_splits=*/0));
  PrintRow("request 0", 0, long_decode.out, long_decode.lse, long_decode.num_qo_heads, long_decode.head_dim);
  PrintCounterState(workspace);

  std::printf("\nragged prefill: q_lens [5, 64, 1], kv_lens [5, 80, 700], causal\n");
  PrintPlan("planner's choice", splitkv_example::RunRaggedPrefill(prefill, workspace, /*num_splits=*/0));
  for (int64_t r = 0; r < prefill.batch_size(); ++r) {
    const int64_t last = prefill.cu_seqlens_q[r + 1] - 1;  // the request's last query token
    const std::string label = "request " + std::to_string(r) + " token " + std::to_string(last);
    PrintRow(label.c_str(), last, prefill.out, prefill.lse, prefill.num_qo_heads, prefill.head_dim);
  }
  PrintPlan("forced", splitkv_example::RunRaggedPrefill(prefill, workspace, /*num_splits=*/3));
  PrintCounterState(workspace);

  // A forced num_splits beyond what the workspace holds is refused with the bytes needed.
  try {
    splitkv_example::RunRaggedPrefill(prefill, workspace, /*num_splits=*/64);
  } catch (const splitkv::WorkspaceError& error) {
    std::printf("\nforcing num_splits=64: %s\n", error.what());
  }
  PrintCounterState(workspace);
  return 0;
}
