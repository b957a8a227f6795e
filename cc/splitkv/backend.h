// The interface every backend implements (internal: the launchers call it after
// validation and planning). A backend reads the plan and the layout; it computes no
// workspace offsets of its own.
#ifndef SPLITKV_BACKEND_H_
#define SPLITKV_BACKEND_H_

#include <cstdint>

#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"

namespace splitkv {

struct MergeStatesParams;  // merge_states.h

// How a backend cuts work: a work tile is (request, kv head, q tile of q_tile_tokens
// query tokens, all qo heads of the kv head's group).
struct BackendTraits {
  int64_t q_tile_tokens = 1;       // query tokens per tile (per kv head)
  int64_t num_workers = 1;         // parallel workers (GPU: CTAs resident at once)
  int64_t fill_workers = 0;        // workers the split heuristic fills; 0: num_workers
  int64_t min_keys_per_split = 256;
  int64_t max_splits = 64;
  int64_t split_block_keys = 64;   // keys the kernels' main loop takes at a time
  int64_t split_merge_blocks = 0;  // a split grid's merge, in those blocks (split_plan.h)
  int64_t short_split_keys = 0;    // shorter splits while the grid fits short_split_workers
  int64_t short_split_workers = 0;
  bool one_wave_splits = false;    // split grids of at most one wave (split_plan.h)
  int64_t tail_split_workers = 0;  // 2 splits for grids just past a wave (split_plan.h)
  int64_t tail_keep_tiles = 0;     // ... except grids of at most these tiles (split_plan.h)
  int64_t wave_split_workers = 0;  // splits for grids of a few waves of long tiles (split_plan.h)
  int64_t fill_wave_workers = 0;   // splits filling the last resident wave (split_plan.h)
  int64_t fill_wave_min_tiles = 0;  // ... for grids of at least these tiles (split_plan.h)
  // Batch-invariant mode (AttentionOptions::batch_invariant): keys per split, a multiple of
  // every kernel's key block; 0 where the backend has no invariant mode.
  int64_t invariant_split_keys = 0;
  // True where one task can run a tile's invariant splits one after another and merge them
  // itself, with the same bits as split tasks merging through the workspace (the CPU): the
  // planner then splits only where it pays and never refuses for want of workspace.
  bool invariant_in_task_splits = false;
  // True where this call's tiles run all their invariant splits in one task, with no
  // partials in the workspace, but split tasks are the plan where the workspace holds them
  // (SplitPlanRequest::in_task_splits_if_short; CUDA: the wgmma prefill serves the call).
  bool invariant_in_task_if_short = false;
};

namespace cpu {
BackendTraits Traits(int64_t group_size, int64_t head_dim);
void PagedAttention(const PagedAttentionParams& params, const SplitPlan& plan);
void RaggedAttention(const RaggedAttentionParams& params, const SplitPlan& plan);
void MergeStates(const MergeStatesParams& params);
}  // namespace cpu

namespace cuda {
// True in a --config=cuda build; otherwise a stub whose other functions throw.
bool Available();
// kv_fp8: an fp8 cache (its decode kernel fits other CTA counts an SM).
BackendTraits Traits(int64_t group_size, int64_t head_dim, int64_t max_q_len, void* stream, bool batch_invariant,
                     bool kv_fp8);
void PagedAttention(const PagedAttentionParams& params, const SplitPlan& plan);
void RaggedAttention(const RaggedAttentionParams& params, const SplitPlan& plan);
// Batch-invariant calls the wgmma prefill kernel serves (it folds every tile's splits in the
// CTA, so the workspace needs no partials): the launchers set invariant_in_task_if_short
// from it. False for every other call. The kernel may still decline at launch (a tensor map
// the driver refuses); a call planned with one split then throws the workspace error.
bool InvariantSplitsInCta(const PagedAttentionParams& params);
bool InvariantSplitsInCta(const RaggedAttentionParams& params);
// cudaMemsetAsync of the counter region on `stream`.
void ZeroCounterRegion(void* workspace, void* stream);
// Copies the device status record to `words` (kStatusWords) on `stream` and synchronises it.
void ReadStatusRecord(const void* workspace, void* stream, uint32_t* words);
// Enqueues the merge kernel on params.stream.
void MergeStates(const MergeStatesParams& params);
// The events of stream_order.h: made on the current device without timing; destroyed with
// errors ignored (it may run at exit, after the runtime has gone).
void* CreateOrderEvent();
void DestroyOrderEvent(void* event) noexcept;
void RecordOrderEvent(void* event, void* stream);
void WaitOrderEvent(void* stream, void* event);
// Whether `stream` is capturing a CUDA graph.
bool StreamCapturing(void* stream);
// The calling thread's current device, and setting it (cudaGetDevice / cudaSetDevice).
int CurrentDevice();
void SetDevice(int device);
}  // namespace cuda

}  // namespace splitkv

#endif  // SPLITKV_BACKEND_H_
