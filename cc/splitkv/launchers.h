// The public entry points: validate, plan, dispatch to a backend.
//
// Both launchers check every argument and throw a typed exception (errors.h) naming the
// argument, the value and what was expected; a refused call touches nothing (the counter
// region stays zero). On the CPU backend the call is synchronous. On the CUDA backend the
// work is enqueued on params.stream and the call returns at once; index arrays live on the
// device and are not read by the host (their values are trusted; shapes are checked).
//
// Workspace ownership: the caller owns the buffer, zeroes it once when it is made, and
// must not use one workspace from two launches at the same time (two threads or two
// streams); use one workspace per stream.
#ifndef SPLITKV_LAUNCHERS_H_
#define SPLITKV_LAUNCHERS_H_

#include "cc/splitkv/errors.h"  // the exceptions the launchers throw
#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"

namespace splitkv {

// Runs paged-KV attention; returns the plan it used (num_splits, workspace layout).
// Throws InvalidArgument (bad shapes, strides, options, index values on the CPU),
// WorkspaceError (too small, misaligned, corrupted counters), UnsupportedError (backend
// or head_dim not in this build), CudaError (a CUDA call failed).
SplitPlan LaunchPagedAttention(const PagedAttentionParams& params);

// Runs ragged (varlen) attention; returns the plan it used. Throws as above.
SplitPlan LaunchRaggedAttention(const RaggedAttentionParams& params);

// The plan a call would use, without running it (validates shapes and the workspace,
// not the data). Used to report the workspace layout.
SplitPlan PlanPagedAttention(const PagedAttentionParams& params);
SplitPlan PlanRaggedAttention(const RaggedAttentionParams& params);

// Scans the counter region of a host workspace; throws WorkspaceError naming the first
// nonzero counter (index and byte offset) and how many are nonzero.
void CheckCounterRegionZero(const void* workspace, int64_t workspace_bytes);

// True when this build has the CUDA backend.
bool CudaBackendAvailable();

}  // namespace splitkv

#endif  // SPLITKV_LAUNCHERS_H_
