// One work tile of the CPU backend: the query rows of (request, kv head, q tile) against
// one split's keys, with an online softmax in float32, then either the final output
// (num_splits == 1) or a partial plus the split-counter protocol and, in the last task of
// the tile, the merge. The same protocol as the CUDA kernels (see workspace_layout.h).
#ifndef SPLITKV_CPU_ATTENTION_TILE_H_
#define SPLITKV_CPU_ATTENTION_TILE_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cc/splitkv/cpu/dtype.h"
#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv::cpu {

inline constexpr int64_t kKeyBlock = 64;  // keys converted to float32 at a time

// Softmax stats of one partial, as stored in the workspace's softmax region.
struct SoftmaxStat {
  float max;      // largest scaled logit among the split's visible keys (-inf if none)
  float sum_exp;  // sum of exp(logit - max) over them (0 if none)
};

// What a tile needs besides its keys: where its queries and outputs are, and the options.
template <typename T>
struct TileInputs {
  const T* q;
  int64_t q_stride_token, q_stride_head;
  T* out;
  int64_t out_stride_token, out_stride_head;
  float* lse;  // may be null
  int64_t num_qo_heads, head_dim, group_size, total_q;
  AttentionOptions options;
  const SplitPlan* plan;
  uint8_t* workspace;
};

// The rows of one tile: tokens [token_begin, token_begin + num_tokens) of a request whose
// queries are the last q_len of its kv_len tokens; first_index is the first token's index
// among the request's queries.
struct TileRows {
  int64_t token_begin, num_tokens, first_index;
  int64_t q_len, kv_len;
  int64_t kv_head;
  int64_t counter_index;
};

// Visible keys [lo, hi) of the query at index i of its request (DESIGN.md semantics).
inline KeyRange VisibleKeys(const AttentionOptions& options, int64_t q_len, int64_t kv_len, int64_t i) {
  const int64_t pos = kv_len - q_len + i;
  int64_t hi = options.causal ? std::min(kv_len, pos + 1) : kv_len;
  int64_t lo = options.window_left >= 0 ? std::max<int64_t>(0, pos - options.window_left) : 0;
  if (hi < lo) hi = lo;
  return {lo, std::max<int64_t>(lo, hi)};
}

inline float Dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int u = 0; u < 8; ++u) partial[u] += a[d + u] * b[d + u];
  }
  float sum = ((partial[0] + partial[4]) + (partial[1] + partial[5])) +
              ((partial[2] + partial[6]) + (partial[3] + partial[7]));
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

template <typename T>
void ToFloatRow(const T* src, float* dst, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] = ToFloat(src[d]);
}

// Per-thread buffers, reused across tasks.
struct TileScratch {
  std::vector<float> q, acc, keys, values, scores, row_max, row_sum;
};

// Runs split `split_idx` of a tile. `kv` gives Key(j) / Value(j) pointers for the tile's
// kv head. Writes the output (1 split) or a partial, then runs the counter protocol.
template <typename T, typename Kv>
void RunTileSplit(const TileInputs<T>& in, const TileRows& tile, const Kv& kv, int64_t split_idx) {
  thread_local TileScratch s;
  const int64_t d = in.head_dim;
  const int64_t group = in.group_size;
  const int64_t rows = tile.num_tokens * group;
  s.q.resize(rows * d);
  s.acc.assign(rows * d, 0.0f);
  s.row_max.assign(rows, -std::numeric_limits<float>::infinity());
  s.row_sum.assign(rows, 0.0f);
  s.keys.resize(kKeyBlock * d);
  s.values.resize(kKeyBlock * d);
  s.scores.resize(kKeyBlock);

  // Queries pre-scaled by sm_scale; the visible keys of each token.
  std::vector<KeyRange> visible(tile.num_tokens);
  int64_t tile_lo = tile.kv_len, tile_hi = 0;
  for (int64_t t = 0; t < tile.num_tokens; ++t) {
    visible[t] = VisibleKeys(in.options, tile.q_len, tile.kv_len, tile.first_index + t);
    if (visible[t].end > visible[t].begin) {
      tile_lo = std::min(tile_lo, visible[t].begin);
      tile_hi = std::max(tile_hi, visible[t].end);
    }
    for (int64_t g = 0; g < group; ++g) {
      const int64_t head = tile.kv_head * group + g;
      const T* q = in.q + (tile.token_begin + t) * in.q_stride_token + head * in.q_stride_head;
      float* qf = &s.q[(t * group + g) * d];
      for (int64_t e = 0; e < d; ++e) qf[e] = ToFloat(q[e]) * in.options.sm_scale;
    }
  }
  const int64_t num_splits = in.plan->num_splits;
  const KeyRange keys = SplitKeyRange(tile_lo, std::max(tile_lo, tile_hi), num_splits, split_idx, kKeyBlock);
  const float cap = in.options.logits_soft_cap;

  for (int64_t kb = keys.begin; kb < keys.end; kb += kKeyBlock) {
    const int64_t nb = std::min(kKeyBlock, keys.end - kb);
    for (int64_t j = 0; j < nb; ++j) {
      ToFloatRow(kv.Key(kb + j), &s.keys[j * d], d);
      ToFloatRow(kv.Value(kb + j), &s.values[j * d], d);
    }
    for (int64_t t = 0; t < tile.num_tokens; ++t) {
      const int64_t jlo = std::max(kb, visible[t].begin);
      const int64_t jhi = std::min(kb + nb, visible[t].end);
      if (jlo >= jhi) continue;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = t * group + g;
        const float* qf = &s.q[r * d];
        float block_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = jlo; j < jhi; ++j) {
          float logit = Dot(qf, &s.keys[(j - kb) * d], d);
          if (cap > 0.0f) logit = cap * std::tanh(logit / cap);
          s.scores[j - kb] = logit;
          block_max = std::max(block_max, logit);
        }
        const float new_max = std::max(s.row_max[r], block_max);
        const float rescale = std::exp(s.row_max[r] - new_max);  // 0 when the row was empty
        float* acc = &s.acc[r * d];
        float sum = s.row_sum[r] * rescale;
        if (rescale != 1.0f) {
          for (int64_t e = 0; e < d; ++e) acc[e] *= rescale;
        }
        for (int64_t j = jlo; j < jhi; ++j) {
          const float p = std::exp(s.scores[j - kb] - new_max);
          sum += p;
          const float* v = &s.values[(j - kb) * d];
          for (int64_t e = 0; e < d; ++e) acc[e] += p * v[e];
        }
        s.row_max[r] = new_max;
        s.row_sum[r] = sum;
      }
    }
  }

  const LayoutShape shape{in.total_q, in.num_qo_heads, d};
  auto write_output = [&](int64_t t, int64_t g, const float* o, float scale, float lse) {
    const int64_t token = tile.token_begin + t;
    const int64_t head = tile.kv_head * group + g;
    T* out = in.out + token * in.out_stride_token + head * in.out_stride_head;
    for (int64_t e = 0; e < d; ++e) out[e] = FromFloat<T>(o == nullptr ? 0.0f : o[e] * scale);
    if (in.lse != nullptr) in.lse[token * in.num_qo_heads + head] = lse;
  };
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  if (num_splits == 1) {
    for (int64_t t = 0; t < tile.num_tokens; ++t) {
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = t * group + g;
        const float sum = s.row_sum[r];
        if (sum > 0.0f) {
          write_output(t, g, &s.acc[r * d], 1.0f / sum, s.row_max[r] + std::log(sum));
        } else {
          write_output(t, g, nullptr, 0.0f, kNegInf);
        }
      }
    }
    return;
  }

  // Partial: stats and the normalised partial output of every row, then the counter.
  auto* stats = reinterpret_cast<SoftmaxStat*>(in.workspace + in.plan->layout.softmax_offset);
  auto* partials = reinterpret_cast<float*>(in.workspace + in.plan->layout.scratch_offset);
  for (int64_t t = 0; t < tile.num_tokens; ++t) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = t * group + g;
      const int64_t index = PartialIndex(shape, split_idx, tile.token_begin + t, tile.kv_head * group + g);
      const float sum = s.row_sum[r];
      stats[index] = SoftmaxStat{sum > 0.0f ? s.row_max[r] : kNegInf, sum};
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      for (int64_t e = 0; e < d; ++e) partials[index * d + e] = s.acc[r * d + e] * inv;
    }
  }
  std::atomic_ref<uint32_t> counter(reinterpret_cast<uint32_t*>(in.workspace)[tile.counter_index]);
  // acq_rel: this task's partial is published to, and every earlier partial visible to,
  // whichever task arrives last.
  const uint32_t arrived = counter.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (arrived != static_cast<uint32_t>(num_splits)) return;

  // The last task merges in fixed split order (bitwise-deterministic), then resets.
  std::vector<float> merged(d);
  for (int64_t t = 0; t < tile.num_tokens; ++t) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t token = tile.token_begin + t;
      const int64_t head = tile.kv_head * group + g;
      float global_max = kNegInf;
      for (int64_t sp = 0; sp < num_splits; ++sp) {
        const SoftmaxStat st = stats[PartialIndex(shape, sp, token, head)];
        if (st.sum_exp > 0.0f) global_max = std::max(global_max, st.max);
      }
      if (global_max == kNegInf) {
        write_output(t, g, nullptr, 0.0f, kNegInf);
        continue;
      }
      float total = 0.0f;
      std::fill(merged.begin(), merged.end(), 0.0f);
      for (int64_t sp = 0; sp < num_splits; ++sp) {
        const int64_t index = PartialIndex(shape, sp, token, head);
        const SoftmaxStat st = stats[index];
        if (!(st.sum_exp > 0.0f)) continue;
        const float weight = st.sum_exp * std::exp(st.max - global_max);
        total += weight;
        for (int64_t e = 0; e < d; ++e) merged[e] += weight * partials[index * d + e];
      }
      write_output(t, g, merged.data(), 1.0f / total, global_max + std::log(total));
    }
  }
  counter.store(0, std::memory_order_release);
}

}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_ATTENTION_TILE_H_
