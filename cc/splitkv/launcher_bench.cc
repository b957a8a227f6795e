// Host time of the C++ launchers on a tiny paged decode (issue 15: the launcher alone, plan
// + validate + launch, within 5 us). Prints the median time per call of
// PlanPagedAttention (validate + plan) and LaunchPagedAttention (validate + plan + launch).
//   bazel run //cc/splitkv:launcher_bench -- [iters]
//     CPU backend: batch 1, 16 keys in one page, 4 qo / 4 kv heads, head_dim 64, float32;
//     the launch includes the tiny attention itself (synchronous on the CPU).
//   bazel build --config=cuda //cc/splitkv:launcher_bench; launcher_bench [iters] cuda
//     CUDA backend (a build with --config=cuda, on a GPU): batch 1, 16 keys, 32 qo / 8 kv
//     heads, head_dim 128, bfloat16 (tools/bench/overhead.py's CUDA row), on a created
//     stream; the launch is the enqueue only (the stream is synchronized every 64 calls,
//     outside the timing, so the launch queue never fills).
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "cc/splitkv/launchers.h"
#include "cc/splitkv/workspace_layout.h"

#ifdef SPLITKV_LAUNCHER_BENCH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

constexpr int kSyncEvery = 64;

// Median of `call` in microseconds; `between` runs untimed after every kSyncEvery calls.
double MedianMicros(const std::function<void()>& call, int iters,
                    const std::function<void()>& between = [] {}) {
  for (int i = 0; i < std::min(iters, 100); ++i) call();  // warm-up (thread pool, caches)
  between();
  std::vector<double> times(iters);
  for (int i = 0; i < iters; ++i) {
    timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    call();
    clock_gettime(CLOCK_MONOTONIC, &end);
    times[i] = (end.tv_sec - start.tv_sec) * 1e6 + (end.tv_nsec - start.tv_nsec) * 1e-3;
    if (i % kSyncEvery == kSyncEvery - 1) between();
  }
  between();
  std::nth_element(times.begin(), times.begin() + iters / 2, times.end());
  return times[iters / 2];
}

// The tiny decode's params over buffers at `q`, `kv` (k then v, each [1, heads, page, dim]),
// `block_tables` ({0}), `seq_lens` ({16}), `out`, and a workspace of the counter region.
splitkv::PagedAttentionParams TinyDecode(int64_t qo_heads, int64_t kv_heads, int64_t dim,
                                         splitkv::DType dtype, void* q, void* kv, int64_t element_bytes,
                                         const int32_t* block_tables, const int32_t* seq_lens, void* out,
                                         void* workspace) {
  constexpr int64_t kPage = 16;
  splitkv::PagedAttentionParams p;
  p.q = q;
  p.q_stride_token = qo_heads * dim;
  p.q_stride_head = dim;
  p.k_cache = kv;
  p.v_cache = static_cast<char*>(kv) + kv_heads * kPage * dim * element_bytes;
  p.k_stride_page = p.v_stride_page = 2 * kv_heads * kPage * dim;
  p.k_stride_head = p.v_stride_head = kPage * dim;
  p.k_stride_slot = p.v_stride_slot = dim;
  p.block_tables = block_tables;
  p.block_tables_stride = 1;
  p.seq_lens = seq_lens;
  p.out = out;
  p.out_stride_token = qo_heads * dim;
  p.out_stride_head = dim;
  p.batch_size = 1;
  p.total_q = 1;
  p.num_pages = 1;
  p.page_size = kPage;
  p.max_pages_per_seq = 1;
  p.num_qo_heads = qo_heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = dim;
  p.dtype = dtype;
  p.options.sm_scale = 1.0f / 8;
  p.workspace = {workspace, splitkv::kCounterRegionBytes};
  return p;
}

int RunCpu(int iters) {
  constexpr int64_t kHeads = 4, kDim = 64, kPage = 16;
  std::vector<float> q(kHeads * kDim, 0.5f), out(q.size()), kv(2 * kHeads * kPage * kDim, 0.25f);
  std::vector<int32_t> block_tables = {0}, seq_lens = {16};
  std::vector<unsigned char> storage(splitkv::kCounterRegionBytes + 256, 0);
  void* workspace = reinterpret_cast<void*>(
      (reinterpret_cast<uintptr_t>(storage.data()) + 255) & ~uintptr_t{255});
  const splitkv::PagedAttentionParams p =
      TinyDecode(kHeads, kHeads, kDim, splitkv::DType::kFloat32, q.data(), kv.data(), sizeof(float),
                 block_tables.data(), seq_lens.data(), out.data(), workspace);
  const double plan = MedianMicros([&] { splitkv::PlanPagedAttention(p); }, iters);
  const double launch = MedianMicros([&] { splitkv::LaunchPagedAttention(p); }, iters);
  std::printf("tiny paged decode (1 x 16 keys, 4/4 heads, d64, float32, CPU), median of %d:\n"
              "  PlanPagedAttention    %.2f us (validate + plan)\n"
              "  LaunchPagedAttention  %.2f us (validate + plan + index checks + the attention)\n"
              "  out[0] = %.4f (expected 0.2500)\n",
              iters, plan, launch, out[0]);
  return 0;
}

#ifdef SPLITKV_LAUNCHER_BENCH_CUDA
void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "launcher_bench: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

int RunCuda(int iters) {
  constexpr int64_t kQoHeads = 32, kKvHeads = 8, kDim = 128, kPage = 16, kBf16 = 2;
  void *q, *kv, *out, *workspace;
  int32_t *block_tables, *seq_lens;
  Check(cudaMalloc(&q, kQoHeads * kDim * kBf16), "cudaMalloc q");
  Check(cudaMalloc(&out, kQoHeads * kDim * kBf16), "cudaMalloc out");
  Check(cudaMalloc(&kv, 2 * kKvHeads * kPage * kDim * kBf16), "cudaMalloc kv");
  Check(cudaMalloc(&workspace, splitkv::kCounterRegionBytes), "cudaMalloc workspace");
  Check(cudaMalloc(&block_tables, sizeof(int32_t)), "cudaMalloc block_tables");
  Check(cudaMalloc(&seq_lens, sizeof(int32_t)), "cudaMalloc seq_lens");
  const int32_t host_index[2] = {0, 16};
  Check(cudaMemcpy(block_tables, &host_index[0], sizeof(int32_t), cudaMemcpyHostToDevice), "copy");
  Check(cudaMemcpy(seq_lens, &host_index[1], sizeof(int32_t), cudaMemcpyHostToDevice), "copy");
  Check(cudaMemset(q, 0, kQoHeads * kDim * kBf16), "cudaMemset");  // bf16 zeros: finite inputs
  Check(cudaMemset(kv, 0, 2 * kKvHeads * kPage * kDim * kBf16), "cudaMemset");
  Check(cudaMemset(workspace, 0, splitkv::kCounterRegionBytes), "cudaMemset");
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  splitkv::PagedAttentionParams p =
      TinyDecode(kQoHeads, kKvHeads, kDim, splitkv::DType::kBFloat16, q, kv, kBf16, block_tables,
                 seq_lens, out, workspace);
  p.backend = splitkv::Backend::kCuda;
  p.stream = stream;
  const auto sync = [&] { Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); };
  const double plan = MedianMicros([&] { splitkv::PlanPagedAttention(p); }, iters);
  const double launch = MedianMicros([&] { splitkv::LaunchPagedAttention(p); }, iters, sync);
  splitkv::CheckWorkspaceStatus("launcher_bench", p.workspace, p.backend, stream);
  uint16_t first = 0xffff;
  Check(cudaMemcpy(&first, out, sizeof(first), cudaMemcpyDeviceToHost), "copy out");
  std::printf("tiny paged decode (1 x 16 keys, 32/8 heads, d128, bfloat16, CUDA), median of %d:\n"
              "  PlanPagedAttention    %.2f us (validate + plan)\n"
              "  LaunchPagedAttention  %.2f us (validate + plan + launch: the enqueue)\n"
              "  out[0] bits = 0x%04x (expected 0x0000: zero inputs)\n",
              iters, plan, launch, first);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20000;
  if (argc > 2 && std::strcmp(argv[2], "cuda") == 0) {
#ifdef SPLITKV_LAUNCHER_BENCH_CUDA
    return RunCuda(iters);
#else
    std::fprintf(stderr, "launcher_bench: cuda needs a build with --config=cuda\n");
    return 2;
#endif
  }
  return RunCpu(iters);
}
