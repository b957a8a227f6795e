// A per-CTA timeline of the sm_90 paged decode kernel (decode_kernel.cuh), and its time per
// launch, on the GPU machine. Not shipped: a probe for the next kernel change.
//
//   tools/gpu/decode_timeline/build.sh                    # here: nvcc, into .device/timeline
//   .device/timeline/decode_timeline BATCH KV_LEN NUM_SPLITS [STAGES] [ORDER]   # there
//
// bf16, 32 qo / 8 kv heads, head_dim 128, page 16, HND, pages in a random order; the kernel
// runs with tensor copies (PagedKvMaps), STAGES 2 (3 CTAs an SM; the default for a split grid,
// as the launcher picks) or 3 (2 an SM; the default unsplit). ORDER "identity" keeps the pages
// in order (a request's pages one contiguous run), to tell the access pattern's cost from the
// kernel's. The marks cover the whole-stage kernel only (head_dim 128 here), not the d256 ring. Timing: 40 launches queued on one
// stream between two events, over input copies rotated past 512 MiB; median of 3. Timeline:
// thread 0 of each CTA stores %globaltimer at the marks make_traced.py puts in a copy of the
// kernel (its docstring lists them); printed as percentiles over CTAs of each phase, the
// merging CTAs' steps, and per SM the CTAs it ran and their mean streaming time.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

__device__ unsigned long long g_timeline[65536 * 16];

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned SmId() {
  unsigned s;
  asm volatile("mov.u32 %0, %smid;" : "=r"(s));
  return s;
}
#define TIMELINE_MARK(i)                                                     \
  do {                                                                       \
    if (threadIdx.x == 0) {                                                  \
      unsigned long long* row = g_timeline + (blockIdx.y * gridDim.x + blockIdx.x) * 16; \
      row[i] = GlobalTimer();                                                \
      if ((i) == 0) row[15] = SmId(), row[2] = 0, row[7] = 0, row[8] = 0;    \
    }                                                                        \
  } while (0)
// A mark after a loaded value arrives (the branch makes the thread wait for it).
#define TIMELINE_MARK_AFTER(i, v)                 \
  do {                                            \
    if ((v) == -123457) g_timeline[0] = 1;        \
    TIMELINE_MARK(i);                             \
  } while (0)

#include "split_merge_traced.cuh"  // before the kernel: stands in for split_merge.cuh
#include "decode_kernel_traced.cuh"
#include "cc/splitkv/cuda/tensor_map.h"

using namespace splitkv;
using namespace splitkv::cuda;
using T = __nv_bfloat16;

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    const cudaError_t e = (x);                                                         \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s failed at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__global__ void FillRandom(T* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65536.0f - 0.5f) * 2.0f);
  }
}

template <int kStages>
void Launch(const AttentionKernelParams& k, const PagedKvParams& kv, const PagedKvMaps& maps, int tiles,
            cudaStream_t stream) {
  using S = BulkDecodeShape<128, 64, kStages, true>;
  static bool ready = false;
  if (!ready) {
    CHECK_CUDA(cudaFuncSetAttribute(BulkDecodeKernel<T, S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(S::kSmemBytes)));
    ready = true;
  }
  BulkDecodeKernel<T, S><<<dim3(tiles, k.num_splits), kThreads, S::kSmemBytes, stream>>>(k, kv, maps);
  CHECK_CUDA(cudaGetLastError());
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s BATCH KV_LEN NUM_SPLITS [STAGES: 2 or 3] [ORDER: random or identity]\n", argv[0]);
    return 2;
  }
  const int batch = std::atoi(argv[1]), kv_len = std::atoi(argv[2]), splits = std::atoi(argv[3]);
  const int stages = argc > 4 ? std::atoi(argv[4]) : (splits > 1 ? 2 : 3);
  const std::string order = argc > 5 ? argv[5] : "random";
  const bool shuffle = order == "random";
  if (batch < 1 || kv_len < 1 || splits < 1 || (stages != 2 && stages != 3) ||
      (order != "random" && order != "identity")) {
    std::fprintf(stderr, "BATCH, KV_LEN, NUM_SPLITS >= 1, STAGES 2 or 3 and ORDER random or identity expected\n");
    return 2;
  }
  constexpr int kKvHeads = 8, kGroup = 4, kHeadDim = 128, kPage = 16;
  const int pages_per_seq = (kv_len + kPage - 1) / kPage, num_pages = batch * pages_per_seq;
  const size_t cache_elems = size_t{static_cast<size_t>(num_pages)} * 2 * kKvHeads * kPage * kHeadDim;
  const int copies = std::max(1, std::min(8, static_cast<int>((size_t{512} << 20) / (cache_elems * 2))));

  std::vector<int> block_tables(num_pages), seq_lens(batch, kv_len);
  for (int i = 0; i < num_pages; ++i) block_tables[i] = i;
  std::srand(1);
  for (int i = num_pages - 1; shuffle && i > 0; --i) std::swap(block_tables[i], block_tables[std::rand() % (i + 1)]);
  int *d_tables = nullptr, *d_lens = nullptr;
  CHECK_CUDA(cudaMalloc(&d_tables, block_tables.size() * sizeof(int)));
  CHECK_CUDA(cudaMalloc(&d_lens, seq_lens.size() * sizeof(int)));
  CHECK_CUDA(cudaMemcpy(d_tables, block_tables.data(), block_tables.size() * sizeof(int), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_lens, seq_lens.data(), seq_lens.size() * sizeof(int), cudaMemcpyHostToDevice));

  const LayoutShape shape{batch, kKvHeads * kGroup, kHeadDim};
  const WorkspaceLayout layout = ComputeWorkspaceLayout(shape, splits);
  unsigned char* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, layout.required_bytes));
  CHECK_CUDA(cudaMemset(workspace, 0, layout.required_bytes));

  const size_t q_elems = size_t{static_cast<size_t>(batch)} * kKvHeads * kGroup * kHeadDim;
  std::vector<AttentionKernelParams> ks(copies);
  std::vector<PagedKvParams> kvs(copies);
  std::vector<PagedKvMaps> maps(copies);
  for (int c = 0; c < copies; ++c) {
    T *cache = nullptr, *q = nullptr, *out = nullptr;
    CHECK_CUDA(cudaMalloc(&cache, cache_elems * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&q, q_elems * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&out, q_elems * sizeof(T)));
    FillRandom<<<1024, 256>>>(cache, cache_elems, 17 + c);
    FillRandom<<<64, 256>>>(q, q_elems, 99 + c);
    CHECK_CUDA(cudaGetLastError());
    AttentionKernelParams& k = ks[c];
    k.q = q, k.q_stride_token = kKvHeads * kGroup * kHeadDim, k.q_stride_head = kHeadDim;
    k.out = out, k.out_stride_token = k.q_stride_token, k.out_stride_head = kHeadDim;
    k.num_kv_heads = kKvHeads, k.group_size = kGroup, k.q_tile_tokens = kDecodeRows / kGroup, k.max_q_tiles = 1;
    k.num_splits = splits, k.layout_shape = shape, k.sm_scale = 0.08838835f;
    k.counters = reinterpret_cast<uint32_t*>(workspace + layout.counter_offset);
    k.stats = reinterpret_cast<float*>(workspace + layout.softmax_offset);
    k.partials = reinterpret_cast<float*>(workspace + layout.scratch_offset);
    k.q_vec = k.out_vec = k.kv_vec = true;
    PagedKvParams& kv = kvs[c];
    kv.k = cache, kv.v = cache + kKvHeads * kPage * kHeadDim;  // HND [pages, 2, heads, page, d]
    kv.k_stride_page = kv.v_stride_page = 2 * kKvHeads * kPage * kHeadDim;
    kv.k_stride_head = kv.v_stride_head = kPage * kHeadDim;
    kv.k_stride_slot = kv.v_stride_slot = kHeadDim;
    kv.block_tables = d_tables, kv.block_tables_stride = pages_per_seq, kv.seq_lens = d_lens, kv.page_size_log2 = 4;
    PagedAttentionParams p;
    p.k_cache = kv.k, p.v_cache = kv.v, p.k_stride_page = p.v_stride_page = kv.k_stride_page;
    p.k_stride_head = p.v_stride_head = kv.k_stride_head, p.k_stride_slot = p.v_stride_slot = kHeadDim;
    p.num_pages = num_pages, p.page_size = kPage, p.num_kv_heads = kKvHeads, p.head_dim = kHeadDim;
    p.dtype = DType::kBFloat16;
    maps[c] = PagedKvMapsFor(p, 64);
    if (maps[c].box_rows == 0) {
      std::fprintf(stderr, "the driver refused the tensor maps\n");
      return 1;
    }
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  const int tiles = batch * kKvHeads;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  auto launch = [&](int c) {
    stages == 2 ? Launch<2>(ks[c], kvs[c], maps[c], tiles, stream) : Launch<3>(ks[c], kvs[c], maps[c], tiles, stream);
  };
  for (int i = 0; i < 10; ++i) launch(i % copies);
  constexpr int kLaunches = 40;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> per_launch;
  for (int rep = 0; rep < 3; ++rep) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < kLaunches; ++i) launch(i % copies);
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    per_launch.push_back(ms * 1e3 / kLaunches);
  }
  const int ctas = tiles * splits;
  std::vector<unsigned long long> tl(size_t{static_cast<size_t>(ctas)} * 16);
  CHECK_CUDA(cudaMemcpyFromSymbol(tl.data(), g_timeline, tl.size() * sizeof(unsigned long long)));

  unsigned long long t0 = ~0ull, t_end = 0;
  for (int c = 0; c < ctas; ++c) t0 = std::min(t0, tl[c * 16]), t_end = std::max(t_end, tl[c * 16 + 5]);
  const double kv_mb = double{1.0} * batch * kKvHeads * kv_len * kHeadDim * 2 * 2 / 1e6;
  std::printf("%d x %d, %d splits, %d stages, %s pages: %.1f us a launch (median of 3), %.2f TB/s; last launch spans %.1f us\n",
              batch, kv_len, splits, stages, shuffle ? "random" : "identity", Percentile(per_launch, 0.5), kv_mb / Percentile(per_launch, 0.5),
              (t_end - t0) / 1e3);
  struct Phase {
    const char* name;
    int from, to;  // marks; from -1: the launch's first CTA start
  };
  const Phase phases[] = {{"CTA start", -1, 0},     {"to seq_lens", 0, 9},      {"page table", 9, 11},
                          {"first issue", 11, 1},   {"first block", 1, 2},      {"stream", 2, 3},
                          {"epilogue", 3, 4},       {"count + merge", 4, 5},    {"CTA end", -1, 5}};
  for (const Phase& ph : phases) {
    std::vector<double> v;
    for (int c = 0; c < ctas; ++c) {
      const unsigned long long* m = &tl[c * 16];
      v.push_back(((ph.to >= 0 ? m[ph.to] : 0) - (ph.from >= 0 ? m[ph.from] : t0)) / 1e3);
    }
    std::printf("  %-14s p0 %7.2f  p10 %7.2f  p50 %7.2f  p90 %7.2f  p100 %7.2f us\n", ph.name, Percentile(v, 0),
                Percentile(v, .1), Percentile(v, .5), Percentile(v, .9), Percentile(v, 1));
  }
  if (splits > 1) {
    std::vector<double> count, merge;
    for (int c = 0; c < ctas; ++c) {
      const unsigned long long* m = &tl[c * 16];
      if (m[7] == 0) continue;  // not its tile's last CTA
      count.push_back((m[7] - m[6]) / 1e3), merge.push_back((m[8] - m[7]) / 1e3);
    }
    std::printf("  merging CTAs (%zu): count seen p50 %.2f max %.2f | loads + math p50 %.2f max %.2f us\n", count.size(),
                Percentile(count, .5), Percentile(count, 1), Percentile(merge, .5), Percentile(merge, 1));
  }
  int num_sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  // How many CTAs stream (between the first block's arrival and the loop's end) and how many
  // are resident, over the launch in 20 bins: the tail's cost is the streaming count's fall.
  {
    constexpr int kBins = 20;
    // Times relative to t0 before they become doubles (%globaltimer counts from the epoch).
    const double span = static_cast<double>(t_end - t0);
    auto rel = [&](unsigned long long t) { return static_cast<double>(t - t0); };
    double streaming[kBins] = {}, alive[kBins] = {};
    for (int c = 0; c < ctas; ++c) {
      const unsigned long long* m = &tl[c * 16];
      for (int b = 0; b < kBins; ++b) {
        const double lo = span * b / kBins, hi = span * (b + 1) / kBins;
        auto overlap = [&](double a, double z) { return std::max(0.0, std::min(hi, z) - std::max(lo, a)) / (hi - lo); };
        if (m[2] >= t0) streaming[b] += overlap(rel(m[2]), rel(m[3]));  // a split with no block never streams
        alive[b] += overlap(rel(m[0]), rel(m[5]));
      }
    }
    std::printf("  CTAs streaming / resident by twentieths of the span:\n   ");
    for (int b = 0; b < kBins; ++b) std::printf(" %.0f/%.0f", streaming[b], alive[b]);
    std::printf("\n");
  }
  std::vector<int> n(num_sms, 0);
  std::vector<double> stream_us(num_sms, 0.0);
  for (int c = 0; c < ctas; ++c) {
    const unsigned long long* m = &tl[c * 16];
    const int sm = static_cast<int>(m[15]);
    if (sm < num_sms) ++n[sm], stream_us[sm] += (m[3] - m[2]) / 1e3;
  }
  std::printf("  per SM (smid: CTAs/mean stream us):");
  for (int sm = 0; sm < num_sms; ++sm) {
    if (sm % 12 == 0) std::printf("\n   ");
    std::printf(" %3d:%d/%5.1f", sm, n[sm], n[sm] ? stream_us[sm] / n[sm] : 0.0);
  }
  std::printf("\n");
  return 0;
}
