// The public entry points: validate, plan, dispatch to a backend. Link libsplitkv.a (or
// depend on //cc/splitkv:splitkv); no Python, no libtorch.
//
// Validation: both launchers check every argument before touching memory and throw a
// typed exception (errors.h) whose message names the operation, the argument, the value and
// what was expected; a refused call writes nothing (out, lse and the counter region are
// untouched), except that a refusal for a dirty counter region zeroes that region (below).
// Which values are checked depends on where they live:
//   - shapes, strides, options, dtype/backend/head_dim support, and the workspace (null,
//     alignment, size, what a forced num_splits needs): always;
//   - index values (seq_lens, block_tables page ids, cu_seqlens prefix sums, max_q_len
//     against cu_seqlens_q) and the counters being zero at rest: on the CPU backend only,
//     where they are host memory. On CUDA they live on the device and are trusted: an
//     out-of-range page id or length there is undefined behaviour, as in any CUDA kernel.
//
// Execution:
//   - Backend::kCpu: synchronous. The work runs on a process-wide thread pool
//     (SPLITKV_NUM_THREADS threads, else the hardware's count, the calling thread
//     included; a value other than a decimal int in [1, 1024] makes every CPU call throw
//     InvalidArgument); out and lse are complete when the call returns. Calls from several
//     threads are serialised inside the pool; each needs its own workspace: a launch
//     claims its workspace (workspace_layout.h kStatusInUseWord) from its counter check
//     to its end, and a second launch on it meanwhile throws WorkspaceError ("workspace
//     in use") having touched nothing.
//   - Backend::kCuda: asynchronous. One kernel is enqueued on params.stream on the current
//     device (cudaSetDevice; every pointer must be that device's memory) and the call
//     returns without synchronising. No allocation, memset or host sync: a launch can be
//     captured in a CUDA graph and replayed. Keep every buffer alive until the stream has
//     run the work. A launch failure throws CudaError; a fault while the kernel runs
//     surfaces later, from the next CUDA call that synchronises.
//
// Workspace ownership (workspace_layout.h): the caller owns the buffer, zeroes it once when
// it is made, and must not use one workspace from two launches at the same time (two
// threads or two streams). Use one workspace per stream; launches on one stream may share it
// freely, since each leaves the counters zero.
//
// A dirty counter region (bytes someone else wrote, a launch that died part-way, two
// launches at once) never gives a silently wrong answer, a hang or an out-of-bounds access:
//   - CPU: the launch checks the counters it needs and the status record (which only CUDA
//     launches write) before running; a nonzero one makes it zero the whole counter region
//     and throw WorkspaceError (nothing is computed).
//   - CUDA: every split of a tile checks the ticket its counter hands it; one the protocol
//     cannot hand out from a zero counter (every nonzero start produces one) is recorded in
//     the workspace's status record (and WorkspaceBuffer::status_host), no split waits on
//     that tile, and no merge waits once a record exists, so the launch ends. The outputs of
//     that launch are invalid. The next launch whose status_host shows the record, or
//     CheckWorkspaceStatus, zeroes the counter region on the stream (the record with it) and
//     throws WorkspaceError naming the counter and the value found; calls after it are right.
//     Without status_host, call CheckWorkspaceStatus (it synchronises) where you need to know.
#ifndef SPLITKV_LAUNCHERS_H_
#define SPLITKV_LAUNCHERS_H_

#include "cc/splitkv/errors.h"  // the exceptions the launchers throw
#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"

namespace splitkv {

// Runs paged-KV attention (params.h: PagedAttentionParams) and writes out (and lse when
// non-null). Returns the plan it used: num_splits, num_tiles and the byte ranges of the
// workspace it used. total_q == 0 validates (on the CPU index values too, as with query rows),
// plans and launches nothing.
// Throws:
//   InvalidArgument  a shape, stride, option, null pointer or (CPU) index value or per-head
//                    k_scales/v_scales value (not finite) is wrong; on CUDA also a page_size
//                    that is not a power of two;
//   WorkspaceError   the workspace is null, misaligned, smaller than kCounterRegionBytes,
//                    too small for a forced num_splits, the problem needs more counters
//                    than the region holds at a forced num_splits, (CPU) a counter it
//                    needs or the status record is nonzero, or (CUDA) status_host holds
//                    an earlier launch's record of a dirty counter (the region is zeroed
//                    first, as above);
//   UnsupportedError Backend::kCuda in a build without it; on CUDA: float32 or a head_dim
//                    other than 64/128/256;
//   CudaError        a CUDA runtime call or the kernel launch failed (message: the
//                    operation and cudaGetErrorString).
// WorkspaceError and UnsupportedError derive from InvalidArgument (std::invalid_argument);
// CudaError derives from std::runtime_error.
SplitPlan LaunchPagedAttention(const PagedAttentionParams& params);

// Runs ragged (varlen) attention (params.h: RaggedAttentionParams); returns the plan it
// used. Execution and exceptions as LaunchPagedAttention (there is no page_size).
SplitPlan LaunchRaggedAttention(const RaggedAttentionParams& params);

// The plan a call with these params would use, without running it: validates shapes,
// options and the workspace's address and size, reads no tensor or workspace bytes, and
// writes nothing. The same exceptions as the launchers, minus the index-value and counter
// checks and the overlap checks of out and lse (a plan has no outputs: the Python plan
// functions pass a placeholder address for them). On CUDA it queries the current device's
// SM count (cached per device). Use it to report the workspace layout or to size a
// workspace before the first launch.
SplitPlan PlanPagedAttention(const PagedAttentionParams& params);
SplitPlan PlanRaggedAttention(const RaggedAttentionParams& params);

// The option checks every launch and plan makes (window_left, logits_soft_cap, sm_scale,
// num_splits and its conflict with batch_invariant), alone: for callers that bind options
// before they have tensors (the Python runners). Throws InvalidArgument naming `op`, with the
// launchers' message (a null `op`: InvalidArgument "check_options: op is null ...").
void CheckOptions(const char* op, const AttentionOptions& options);

// Scans the counter region (the first kCounterRegionBytes bytes) of a workspace in HOST
// memory: for a CUDA workspace, copy those bytes to the host first (after the stream has
// run the launches). Returns if every counter is 0; otherwise throws WorkspaceError naming
// how many are nonzero and the first one's index, byte offset and value. Throws
// WorkspaceError for a null pointer, one not 4-byte aligned, or workspace_bytes <
// kCounterRegionBytes.
void CheckCounterRegionZero(const void* workspace, int64_t workspace_bytes);

// Reports a dirty counter found by an earlier launch on this workspace: reads its status
// record (CUDA: copies it from the device on `stream` and synchronises that stream; CPU: the
// host bytes) and status_host when set. Returns when both are zero. Otherwise zeroes the
// counter region (CUDA: cudaMemsetAsync on `stream`, then synchronises) and status_host, and
// throws WorkspaceError naming `op`, the counter index and the value found. Throws
// WorkspaceError for a null, misaligned (kWorkspaceAlignment) or too small workspace, and
// touches nothing then; InvalidArgument for a null `op` or a
// backend other than kCpu / kCuda, CudaError if a CUDA call fails.
void CheckWorkspaceStatus(const char* op, const WorkspaceBuffer& workspace, Backend backend, void* stream);

// Zeroes the counter region of a workspace (CUDA: cudaMemsetAsync on `stream`, no sync) and
// its status_host: the way back to a usable workspace after a fault, without reallocating.
// Only while no launch runs on the workspace: unlike the launches and CheckWorkspaceStatus it
// does not take the CPU in-use claim (it is what clears a stale one), so a call during a CPU
// launch zeroes that launch's counters and claim under it (a split tile never merges: rows left
// unwritten, and a second launch let in). The Python reset holds the workspace first.
// Throws as CheckWorkspaceStatus for a bad workspace or backend.
void ResetCounterRegion(const WorkspaceBuffer& workspace, Backend backend, void* stream);

// True when this build has the CUDA backend (built with --config=cuda); it does not check
// for a GPU or a driver.
bool CudaBackendAvailable();

}  // namespace splitkv

#endif  // SPLITKV_LAUNCHERS_H_
