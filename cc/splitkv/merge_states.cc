// MergeStates: validation, then the backend's loop or kernel (merge_states.h).
#include "cc/splitkv/merge_states.h"

#include <string>

#include "cc/splitkv/arg_checks.h"
#include "cc/splitkv/backend.h"

namespace splitkv {

void MergeStates(const MergeStatesParams& p) {
  const ArgChecks check("merge_states");
  // At most 2^31 - 1 states: the CPU keeps a per-row weight for each (a larger count is no
  // real merge, and std::vector would throw length_error, not a typed exception).
  check.InRange("num_states", p.num_states, 1, int64_t{1} << 31);
  check.AtLeast("total_q", p.total_q, 0);
  check.AtLeast("num_qo_heads", p.num_qo_heads, 1);
  check.AtLeast("head_dim", p.head_dim, 1);
  CheckDTypeKnown(check, p.dtype);
  CheckBackendKnown(check, p.backend);
  const struct {
    const char* name;
    int64_t value;
  } strides[] = {{"outs_stride_state", p.outs_stride_state}, {"outs_stride_token", p.outs_stride_token},
                 {"outs_stride_head", p.outs_stride_head},   {"lses_stride_state", p.lses_stride_state},
                 {"lses_stride_token", p.lses_stride_token}, {"lses_stride_head", p.lses_stride_head},
                 {"out_stride_token", p.out_stride_token},   {"out_stride_head", p.out_stride_head},
                 {"lse_stride_token", p.lse_stride_token},   {"lse_stride_head", p.lse_stride_head}};
  for (const auto& s : strides) check.AtLeast(s.name, s.value, 0);
  // Spans within 2^63 bytes, and out's rows and lse's entries each written once (as the
  // launchers check their out): overlapping rows would race and keep one state's merge.
  const int64_t bytes = DTypeBytes(p.dtype);
  const int64_t outs_bytes = CheckSpan(
      check, "outs",
      {{p.num_states, p.outs_stride_state}, {p.total_q, p.outs_stride_token}, {p.num_qo_heads, p.outs_stride_head}},
      p.head_dim, bytes);
  const int64_t lses_bytes = CheckSpan(
      check, "lses",
      {{p.num_states, p.lses_stride_state}, {p.total_q, p.lses_stride_token}, {p.num_qo_heads, p.lses_stride_head}},
      1, 4);
  const int64_t out_bytes =
      CheckSpan(check, "out", {{p.total_q, p.out_stride_token}, {p.num_qo_heads, p.out_stride_head}}, p.head_dim, bytes);
  const int64_t lse_bytes =
      CheckSpan(check, "lse", {{p.total_q, p.lse_stride_token}, {p.num_qo_heads, p.lse_stride_head}}, 1, 4);
  CheckDisjointRows(check, "out", p.total_q, p.out_stride_token, p.num_qo_heads, p.out_stride_head, p.head_dim);
  CheckDisjointRows(check, "lse", p.total_q, p.lse_stride_token, p.num_qo_heads, p.lse_stride_head, 1);
  if (p.total_q == 0) return;
  check.NotNull("outs", p.outs);
  check.NotNull("lses", p.lses);
  check.NotNull("out", p.out);
  check.NotNull("lse", p.lse);
  // Element-aligned pointers (the CUDA kernel's loads fault otherwise; the CPU's are
  // undefined), and out / lse sharing no byte with what the merge reads or with each other:
  // a row merged in place over outs would be read after it was overwritten by another state's
  // weight (the launchers refuse the same for their out and lse).
  check.Aligned({{"outs", p.outs, bytes}, {"lses", p.lses, 4}, {"out", p.out, bytes}, {"lse", p.lse, 4}});
  const ByteRange ranges[] = {{"outs", p.outs, outs_bytes},
                              {"lses", p.lses, lses_bytes},
                              {"out", p.out, out_bytes},
                              {"lse", p.lse, lse_bytes}};
  CheckDisjointFrom(check, ranges[2], ranges);
  CheckDisjointFrom(check, ranges[3], ranges);
  if (p.backend == Backend::kCuda) {
    cuda::MergeStates(p);
  } else {
    cpu::MergeStates(p);
  }
}

}  // namespace splitkv
