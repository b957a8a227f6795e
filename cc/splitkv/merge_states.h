// MergeStates: partial attentions over disjoint key sets, merged by their LSE, as its own
// launch. The split-KV merge of one launch, one level up: between launches, devices or ranks
// (context parallelism: each rank attends over its shard of a request's keys with lse, the
// partials are gathered, and this merges them). Python: splitkv.merge_states.
#ifndef SPLITKV_MERGE_STATES_H_
#define SPLITKV_MERGE_STATES_H_

#include <cstdint>

#include "cc/splitkv/errors.h"  // the exceptions MergeStates throws
#include "cc/splitkv/params.h"

namespace splitkv {

// Strides are in elements and >= 0; the head_dim stride of outs and out is 1. Memory: host
// for Backend::kCpu, the current device's for kCuda (then enqueued on `stream`, no sync,
// no allocation: graph-capturable). Pointers aligned to their element size; out and lse
// share no byte with outs, lses or each other (refused, as the launchers refuse theirs).
struct MergeStatesParams {
  // outs [num_states, total_q, num_qo_heads, head_dim] of `dtype`: partial s normalised over
  // its own key set K_s.
  const void* outs = nullptr;
  int64_t outs_stride_state = 0, outs_stride_token = 0, outs_stride_head = 0;
  // lses [num_states, total_q, num_qo_heads] float32: log(sum_{j in K_s} exp(logit_j)),
  // -inf for a partial that saw no key. A launcher's lse includes options.sinks: pass the
  // sinks to the launch of one state only, or the sink is counted once per state.
  const float* lses = nullptr;
  int64_t lses_stride_state = 0, lses_stride_token = 0, lses_stride_head = 0;
  // out [total_q, num_qo_heads, head_dim] of `dtype`, lse [total_q, num_qo_heads] float32:
  // every element written.
  void* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0;
  float* lse = nullptr;
  int64_t lse_stride_token = 0, lse_stride_head = 0;

  int64_t num_states = 0;    // >= 1
  int64_t total_q = 0;       // >= 0; 0 launches nothing
  int64_t num_qo_heads = 0;  // >= 1
  int64_t head_dim = 0;      // >= 1
  // float32, float16 or bfloat16, on both backends; float16 unless set, as in the attention
  // params (params.h), so a launch and the merge of its states agree by default.
  DType dtype = DType::kFloat16;
  Backend backend = Backend::kCpu;
  void* stream = nullptr;  // cudaStream_t for kCuda
};

// Per (token, head), in float32, states in index order (deterministic: the same inputs give
// the same bits, on each backend):
//   M     = max_s lses[s] over s with lses[s] > -inf (0 if none; NaN if any lses[s] is NaN)
//   w_s   = exp(lses[s] - M), 0 where lses[s] == -inf
//   total = ((w_0 + w_1) + w_2) + ...
//   out   = sum over s, in order, from +0, of (w_s / total) * outs[s]; a state with w_s == 0
//           adds exactly 0 whatever outs[s] holds (NaN included); total == 0 gives out 0
//   lse   = M + log(total)   (-inf where every state is empty)
// One state above -inf gives its out and lse back bit for bit (w_s / total is exactly 1).
// Throws InvalidArgument (a count, stride, null or misaligned pointer, or an overlap of out
// or lse with another buffer; message "merge_states: <arg> <problem>: expected <X>, got
// <Y>"), UnsupportedError (kCuda in a build without it), CudaError (the launch failed).
void MergeStates(const MergeStatesParams& params);

}  // namespace splitkv

#endif  // SPLITKV_MERGE_STATES_H_
