// The CPU backend's entry points: its tiling traits, and the run-time choice between the
// baseline x86-64 kernels and the AVX2+FMA ones.
#include <cstdint>

#include "cc/splitkv/backend.h"
#include "cc/splitkv/cpu/attention_kernels.h"
#include "cc/splitkv/cpu/thread_pool.h"

namespace splitkv::cpu {
namespace {

bool HasAvx2Fma() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

}  // namespace

BackendTraits Traits(int64_t group_size, int64_t head_dim) {
  BackendTraits traits;
  traits.q_tile_tokens = QTileTokens(group_size);
  // Several tasks per thread so that requests of very different lengths balance out.
  traits.num_workers = 4 * ThreadPool::Global().num_threads();
  traits.min_keys_per_split = 256;
  traits.max_splits = 64;
  return traits;
}

void PagedAttention(const PagedAttentionParams& params, const SplitPlan& plan) {
  if (HasAvx2Fma()) return avx2::PagedAttentionKernels(params, plan);
  baseline::PagedAttentionKernels(params, plan);
}

void RaggedAttention(const RaggedAttentionParams& params, const SplitPlan& plan) {
  if (HasAvx2Fma()) return avx2::RaggedAttentionKernels(params, plan);
  baseline::RaggedAttentionKernels(params, plan);
}

}  // namespace splitkv::cpu
