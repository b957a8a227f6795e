// Host time of the C++ launchers on a tiny paged decode (issue 15: the launcher alone, plan
// + validate + launch, within 5 us): batch 1, 16 keys in one page, 4 qo / 4 kv heads,
// head_dim 64, float32, CPU backend. Prints the median time per call of
// PlanPagedAttention (validate + plan), LaunchPagedAttention (validate + plan + the tiny
// attention itself, synchronous on the CPU) and, for scale, the attention alone
// (LaunchPagedAttention minus the plan is not separable, so no such row).
//   bazel run //cc/splitkv:launcher_bench -- [iters]
// The CUDA launcher's host time is measured from Python on the GPU machine
// (tools/bench/overhead.py, row "C++ LaunchPagedAttention"), where a device exists.
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "cc/splitkv/launchers.h"
#include "cc/splitkv/workspace_layout.h"

namespace {

double MedianMicros(const std::function<void()>& call, int iters) {
  for (int i = 0; i < std::min(iters, 100); ++i) call();  // warm-up (thread pool, caches)
  std::vector<double> times(iters);
  for (int i = 0; i < iters; ++i) {
    timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    call();
    clock_gettime(CLOCK_MONOTONIC, &end);
    times[i] = (end.tv_sec - start.tv_sec) * 1e6 + (end.tv_nsec - start.tv_nsec) * 1e-3;
  }
  std::nth_element(times.begin(), times.begin() + iters / 2, times.end());
  return times[iters / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20000;
  constexpr int64_t kHeads = 4, kDim = 64, kPage = 16;
  std::vector<float> q(kHeads * kDim, 0.5f), out(q.size()), kv(2 * kHeads * kPage * kDim, 0.25f);
  std::vector<int32_t> block_tables = {0}, seq_lens = {16};
  const int64_t workspace_bytes = splitkv::kCounterRegionBytes;
  std::vector<unsigned char> storage(workspace_bytes + 256, 0);
  void* workspace = reinterpret_cast<void*>(
      (reinterpret_cast<uintptr_t>(storage.data()) + 255) & ~uintptr_t{255});

  splitkv::PagedAttentionParams p;
  p.q = q.data();
  p.q_stride_token = kHeads * kDim;
  p.q_stride_head = kDim;
  p.k_cache = kv.data();
  p.v_cache = kv.data() + kHeads * kPage * kDim;
  p.k_stride_page = p.v_stride_page = 2 * kHeads * kPage * kDim;
  p.k_stride_head = p.v_stride_head = kPage * kDim;
  p.k_stride_slot = p.v_stride_slot = kDim;
  p.block_tables = block_tables.data();
  p.block_tables_stride = 1;
  p.seq_lens = seq_lens.data();
  p.out = out.data();
  p.out_stride_token = kHeads * kDim;
  p.out_stride_head = kDim;
  p.batch_size = 1;
  p.total_q = 1;
  p.num_pages = 1;
  p.page_size = kPage;
  p.max_pages_per_seq = 1;
  p.num_qo_heads = p.num_kv_heads = kHeads;
  p.head_dim = kDim;
  p.dtype = splitkv::DType::kFloat32;
  p.options.sm_scale = 0.125f;
  p.workspace = {workspace, workspace_bytes};

  const double plan = MedianMicros([&] { splitkv::PlanPagedAttention(p); }, iters);
  const double launch = MedianMicros([&] { splitkv::LaunchPagedAttention(p); }, iters);
  std::printf("tiny paged decode (1 x 16 keys, 4/4 heads, d64, float32, CPU), median of %d:\n"
              "  PlanPagedAttention    %.2f us (validate + plan)\n"
              "  LaunchPagedAttention  %.2f us (validate + plan + index checks + the attention)\n"
              "  out[0] = %.4f (expected 0.2500)\n",
              iters, plan, launch, out[0]);
  return 0;
}
