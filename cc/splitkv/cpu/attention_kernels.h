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

inline namespace avx512 {
void PagedAttentionKernels(const PagedAttentionParams& params, const SplitPlan& plan);
void RaggedAttentionKernels(const RaggedAttentionParams& params, const SplitPlan& plan);
}  // namespace avx512

// The kernel builds, in order of preference.
enum class Isa { kBaseline, kAvx2, kAvx512 };

// The widest build this CPU runs.
Isa BestSupportedIsa();

// The build the launchers use: the best supported, or a narrower one named by the
// environment variable SPLITKV_CPU_ISA (baseline, avx2, avx512), read at every call so a
// test can run each build; one the CPU lacks falls back to the best supported. Throws
// std::invalid_argument for any other value.
Isa ActiveIsa();

const char* IsaName(Isa isa);

}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_ATTENTION_KERNELS_H_
