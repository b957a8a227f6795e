// MergeStates on the CPU (merge_states.h): one pass per (token, head), float32, states in
// index order. Memory-bound and small next to the attention it merges: one thread.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cc/splitkv/backend.h"
#include "cc/splitkv/cpu/dtype.h"
#include "cc/splitkv/merge_states.h"

namespace splitkv::cpu {
namespace {

template <typename T>
void MergeTyped(const MergeStatesParams& p) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const T* outs = static_cast<const T*>(p.outs);
  T* out = static_cast<T*>(p.out);
  std::vector<float> shares(static_cast<size_t>(p.num_states));
  std::vector<char> live(static_cast<size_t>(p.num_states));
  for (int64_t t = 0; t < p.total_q; ++t) {
    for (int64_t h = 0; h < p.num_qo_heads; ++h) {
      const float* lses = p.lses + t * p.lses_stride_token + h * p.lses_stride_head;
      float m = neg_inf;
      for (int64_t s = 0; s < p.num_states; ++s) {
        const float x = lses[s * p.lses_stride_state];
        if (x > m || std::isnan(x)) m = std::isnan(m) ? m : x;
      }
      if (m == neg_inf) m = 0.0f;  // no state saw a key: keeps exp away from -inf - -inf
      // Each state's weight once per row, then its share (an empty state's outs are never read).
      float total = 0.0f;
      for (int64_t s = 0; s < p.num_states; ++s) {
        const float x = lses[s * p.lses_stride_state];
        shares[s] = x == neg_inf ? 0.0f : std::exp(x - m);
        live[s] = shares[s] != 0.0f;
        total += shares[s];
      }
      const float safe_total = total > 0.0f ? total : 1.0f;
      for (int64_t s = 0; s < p.num_states; ++s) shares[s] /= safe_total;
      T* row = out + t * p.out_stride_token + h * p.out_stride_head;
      const T* row_outs = outs + t * p.outs_stride_token + h * p.outs_stride_head;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        float acc = 0.0f;
        for (int64_t s = 0; s < p.num_states; ++s) {
          if (!live[s]) continue;  // adds exactly 0, even where outs[s] is NaN
          acc += shares[s] * ToFloat(row_outs[s * p.outs_stride_state + d]);
        }
        row[d] = FromFloat<T>(acc);
      }
      p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = m + std::log(total);
    }
  }
}

}  // namespace

void MergeStates(const MergeStatesParams& p) {
  switch (p.dtype) {
    case DType::kFloat32: return MergeTyped<float>(p);
    case DType::kFloat16: return MergeTyped<Half>(p);
    case DType::kBFloat16: return MergeTyped<BFloat16>(p);
  }
}

}  // namespace splitkv::cpu
