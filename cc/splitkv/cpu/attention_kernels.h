// Entry points of the CPU kernels, one set per instruction-set build (isa.h), and the
// tiling rule they share with the planner.
#ifndef SPLITKV_CPU_ATTENTION_KERNELS_H_
#define SPLITKV_CPU_ATTENTION_KERNELS_H_

#include <algorithm>
#include <cstdint>

#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"

namespace splitkv::cpu {

// Query tokens per work tile: about 64 query rows (tokens x group heads) per task.
inline int64_t QTileTokens(int64_t group_size) {
  return std::max<int64_t>(1, 64 / std::max<int64_t>(1, group_size));
}

// Inline namespaces (see isa.h): each kernel build's definitions carry its own name.
inline namespace baseline {
void PagedAttentionKernels(const PagedAttentionParams& params, const SplitPlan& plan);
void RaggedAttentionKernels(const RaggedAttentionParams& params, const SplitPlan& plan);
}  // namespace baseline

inline namespace avx2 {
void PagedAttentionKernels(const PagedAttentionParams& params, const SplitPlan& plan);
void RaggedAttentionKernels(const RaggedAttentionParams& params, const SplitPlan& plan);
}  // namespace avx2

}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_ATTENTION_KERNELS_H_
