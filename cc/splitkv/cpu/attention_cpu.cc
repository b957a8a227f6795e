// The CPU backend's entry points: its tiling traits, and the run-time choice among the
// baseline x86-64, AVX2+FMA and AVX-512 kernel builds.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cc/splitkv/backend.h"
#include "cc/splitkv/cpu/attention_kernels.h"
#include "cc/splitkv/cpu/thread_pool.h"
#include "cc/splitkv/errors.h"

namespace splitkv::cpu {

Isa BestSupportedIsa() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const Isa best = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      return Isa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      return Isa::kAvx2;
    }
    return Isa::kBaseline;
  }();
  return best;
#else
  return Isa::kBaseline;
#endif
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return "baseline";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa ActiveIsa() {
  const Isa best = BestSupportedIsa();
  const char* env = std::getenv("SPLITKV_CPU_ISA");
  if (env == nullptr || *env == '\0') return best;
  const std::string name(env);
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    if (name == IsaName(isa)) return isa <= best ? isa : best;
  }
  throw InvalidArgument("splitkv cpu: SPLITKV_CPU_ISA invalid: expected baseline, avx2 or avx512 (or unset), got '" +
                        name + "'");
}

BackendTraits Traits(int64_t group_size, int64_t head_dim) {
  BackendTraits traits;
  traits.q_tile_tokens = QTileTokens(group_size);
  // Several tasks per thread so that requests of very different lengths balance out.
  traits.num_workers = 4 * ThreadPool::Global().num_threads();
  traits.min_keys_per_split = 256;
  traits.max_splits = 64;
  // Batch-invariant splits: 16 key blocks of 64 (32 splits at 32k keys).
  traits.invariant_split_keys = 1024;
  traits.invariant_in_task_splits = true;
  return traits;
}

void PagedAttention(const PagedAttentionParams& params, const SplitPlan& plan) {
  switch (ActiveIsa()) {
    case Isa::kAvx512: return avx512::PagedAttentionKernels(params, plan);
    case Isa::kAvx2: return avx2::PagedAttentionKernels(params, plan);
    case Isa::kBaseline: return baseline::PagedAttentionKernels(params, plan);
  }
}

void RaggedAttention(const RaggedAttentionParams& params, const SplitPlan& plan) {
  switch (ActiveIsa()) {
    case Isa::kAvx512: return avx512::RaggedAttentionKernels(params, plan);
    case Isa::kAvx2: return avx2::RaggedAttentionKernels(params, plan);
    case Isa::kBaseline: return baseline::RaggedAttentionKernels(params, plan);
  }
}

}  // namespace splitkv::cpu
