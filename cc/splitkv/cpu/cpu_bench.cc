// Times the CPU backend on the bench's CPU shapes (32 qo / 8 kv heads, head_dim 128):
// paged decode 8 x 2048 (page 16, pages shuffled) and causal ragged prefill 1 x 2048, in
// float32 or bfloat16, reporting per-call wall time and process CPU time (CPU time of one
// thread is what stays meaningful on a shared machine: run with SPLITKV_NUM_THREADS=1).
//   bazel run //cc/splitkv/cpu:cpu_bench -- decode|prefill float32|bfloat16 [iters]
// SPLITKV_CPU_ISA picks the kernel build (attention_kernels.h). Decode only:
// CPU_BENCH_ORDERED_PAGES=1 keeps pages in order; CPU_BENCH_HOT_PAGES=n maps every page to
// one of n, so the KV stays in cache and the figure is the compute rate.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cc/splitkv/cpu/attention_kernels.h"
#include "cc/splitkv/launchers.h"
#include "cc/splitkv/workspace_layout.h"

namespace {

double Seconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint16_t ToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

std::vector<unsigned char> Random(int64_t n, bool bf16, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<unsigned char> bytes(n * (bf16 ? 2 : 4));
  for (int64_t i = 0; i < n; ++i) {
    const float x = dist(rng);
    if (bf16) {
      const uint16_t b = ToBf16(x);
      std::memcpy(&bytes[i * 2], &b, 2);
    } else {
      std::memcpy(&bytes[i * 4], &x, 4);
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "decode";
  const bool bf16 = argc > 2 && std::string(argv[2]) == "bfloat16";
  const int iters = argc > 3 ? std::max(1, std::atoi(argv[3])) : 10;
  constexpr int64_t kHq = 32, kHkv = 8, kD = 128;
  const splitkv::DType dtype = bf16 ? splitkv::DType::kBFloat16 : splitkv::DType::kFloat32;
  std::mt19937 rng(0);
  const int64_t workspace_bytes = int64_t{64} << 20;
  std::vector<unsigned char> workspace_storage(workspace_bytes + 256);
  void* workspace =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(workspace_storage.data()) + 255) & ~uintptr_t{255});
  double flops = 0, bytes = 0;
  std::function<void()> call;
  std::vector<unsigned char> q, kv, k, v, out;
  std::vector<int32_t> tables, seq_lens, cu_q, cu_kv;
  splitkv::PagedAttentionParams pp;
  splitkv::RaggedAttentionParams rp;
  const int64_t elem = bf16 ? 2 : 4;
  // The fields a paged and a ragged call share: q and out [tokens, kHq, kD], contiguous.
  auto set_common = [&](auto& p) {
    p.q = q.data();
    p.q_stride_token = kHq * kD;
    p.q_stride_head = kD;
    p.out = out.data();
    p.out_stride_token = kHq * kD;
    p.out_stride_head = kD;
    p.num_qo_heads = kHq;
    p.num_kv_heads = kHkv;
    p.head_dim = kD;
    p.dtype = dtype;
    p.options.sm_scale = 1.0f / std::sqrt(float(kD));
    p.workspace = {workspace, workspace_bytes};
  };
  if (kind == "decode") {
    constexpr int64_t kBatch = 8, kLen = 2048, kPage = 16, kPagesPerSeq = kLen / kPage, kPages = kBatch * kPagesPerSeq;
    q = Random(kBatch * kHq * kD, bf16, rng);
    kv = Random(kPages * 2 * kHkv * kPage * kD, bf16, rng);
    out.resize(q.size());
    tables.resize(kPages);
    std::iota(tables.begin(), tables.end(), 0);
    if (std::getenv("CPU_BENCH_ORDERED_PAGES") == nullptr) std::shuffle(tables.begin(), tables.end(), rng);
    if (const char* hot = std::getenv("CPU_BENCH_HOT_PAGES")) {
      for (auto& t : tables) t %= std::max(1, std::atoi(hot));
    }
    seq_lens.assign(kBatch, kLen);
    set_common(pp);
    pp.k_cache = kv.data();
    pp.v_cache = kv.data() + kHkv * kPage * kD * elem;
    pp.k_stride_page = pp.v_stride_page = 2 * kHkv * kPage * kD;
    pp.k_stride_head = pp.v_stride_head = kPage * kD;
    pp.k_stride_slot = pp.v_stride_slot = kD;
    pp.block_tables = tables.data();
    pp.block_tables_stride = kPagesPerSeq;
    pp.seq_lens = seq_lens.data();
    pp.batch_size = kBatch;
    pp.total_q = kBatch;
    pp.num_pages = kPages;
    pp.page_size = kPage;
    pp.max_pages_per_seq = kPagesPerSeq;
    bytes = 2.0 * kBatch * kLen * kHkv * kD * elem;
    flops = 4.0 * kBatch * kHq * kD * kLen;
    call = [&] { splitkv::LaunchPagedAttention(pp); };
  } else {
    constexpr int64_t kLen = 2048;
    q = Random(kLen * kHq * kD, bf16, rng);
    k = Random(kLen * kHkv * kD, bf16, rng);
    v = Random(kLen * kHkv * kD, bf16, rng);
    out.resize(q.size());
    cu_q = {0, kLen};
    cu_kv = {0, kLen};
    set_common(rp);
    rp.k = k.data();
    rp.v = v.data();
    rp.k_stride_token = rp.v_stride_token = kHkv * kD;
    rp.k_stride_head = rp.v_stride_head = kD;
    rp.cu_seqlens_q = cu_q.data();
    rp.cu_seqlens_kv = cu_kv.data();
    rp.batch_size = 1;
    rp.total_q = kLen;
    rp.total_kv = kLen;
    rp.num_qo_heads = kHq;
    rp.num_kv_heads = kHkv;
    rp.head_dim = kD;
    rp.max_q_len = kLen;
    flops = 4.0 * kHq * kD * kLen * kLen / 2;
    call = [&] { splitkv::LaunchRaggedAttention(rp); };
  }
  call();  // warm-up
  std::vector<double> wall, cpu;
  for (int i = 0; i < iters; ++i) {
    const double w0 = Seconds(CLOCK_MONOTONIC), c0 = Seconds(CLOCK_PROCESS_CPUTIME_ID);
    call();
    wall.push_back(Seconds(CLOCK_MONOTONIC) - w0);
    cpu.push_back(Seconds(CLOCK_PROCESS_CPUTIME_ID) - c0);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  const double w = wall[iters / 2], c = cpu[iters / 2];
  // A coarse fingerprint of the output bytes, to see a change of results between builds.
  double checksum = 0;
  for (size_t i = 0; i < out.size(); i += 97) checksum += out[i];
  std::printf("%s %s isa=%s: wall %.2f ms, cpu %.2f ms | cpu-time rates: %.1f GB/s, %.1f GFLOP/s (checksum %.0f)\n",
              kind.c_str(), bf16 ? "bfloat16" : "float32", splitkv::cpu::IsaName(splitkv::cpu::ActiveIsa()), w * 1e3,
              c * 1e3, bytes / c / 1e9, flops / c / 1e9, checksum);
  return 0;
}
