// The float64 reference for the C++ tests: attention over packed (ragged) q, k, v, written
// from the semantics in ../shared/DESIGN.md, one query row at a time, no splitting. Paged
// tests gather their cache into this packed form first.
#ifndef SPLITKV_TESTS_CC_REFERENCE_H_
#define SPLITKV_TESTS_CC_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace splitkv_test {

struct ReferenceOptions {
  bool causal = true;
  int64_t window_left = -1;
  double logits_soft_cap = 0.0;
  double sm_scale = 1.0;
  // Per request, the position one past its last query in its keys' coordinates (keys as one
  // shard of a longer request: full_seq_lens - kv_offsets); empty: kv_len.
  std::vector<int64_t> q_ends;
};

// q [total_q, num_qo_heads, head_dim]; k, v [total_kv, num_kv_heads, head_dim], request b owning
// rows cu_q[b]..cu_q[b+1] and cu_kv[b]..cu_kv[b+1]. Fills out [total_q, num_qo_heads, head_dim]
// and lse [total_q, num_qo_heads] (natural log; -inf and a zero output for a row seeing no key).
struct ReferenceResult {
  std::vector<double> out;
  std::vector<double> lse;
};

inline ReferenceResult ReferenceAttention(const std::vector<double>& q, const std::vector<double>& k,
                                          const std::vector<double>& v, const std::vector<int32_t>& cu_q,
                                          const std::vector<int32_t>& cu_kv, int64_t num_qo_heads,
                                          int64_t num_kv_heads, int64_t head_dim, const ReferenceOptions& options) {
  const int64_t total_q = cu_q.back();
  const int64_t group = num_qo_heads / num_kv_heads;
  ReferenceResult result;
  result.out.assign(total_q * num_qo_heads * head_dim, 0.0);
  result.lse.assign(total_q * num_qo_heads, -std::numeric_limits<double>::infinity());
  std::vector<double> logits;
  std::vector<int64_t> keys;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const int64_t q_len = cu_q[b + 1] - cu_q[b];
    const int64_t kv_len = cu_kv[b + 1] - cu_kv[b];
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t token = cu_q[b] + i;
      // The query's position in its sequence (in its keys' coordinates).
      const int64_t pos = (options.q_ends.empty() ? kv_len : options.q_ends[b]) - q_len + i;
      keys.clear();
      for (int64_t j = 0; j < kv_len; ++j) {
        if (options.causal && j > pos) continue;
        if (options.window_left >= 0 && j < pos - options.window_left) continue;
        keys.push_back(j);
      }
      if (keys.empty()) continue;
      for (int64_t h = 0; h < num_qo_heads; ++h) {
        const int64_t kv_head = h / group;
        const double* qrow = &q[(token * num_qo_heads + h) * head_dim];
        logits.clear();
        double max_logit = -std::numeric_limits<double>::infinity();
        for (int64_t j : keys) {
          const double* krow = &k[((cu_kv[b] + j) * num_kv_heads + kv_head) * head_dim];
          double dot = 0.0;
          for (int64_t e = 0; e < head_dim; ++e) dot += qrow[e] * krow[e];
          double logit = dot * options.sm_scale;
          if (options.logits_soft_cap > 0.0) logit = options.logits_soft_cap * std::tanh(logit / options.logits_soft_cap);
          logits.push_back(logit);
          max_logit = std::max(max_logit, logit);
        }
        double sum = 0.0;
        double* orow = &result.out[(token * num_qo_heads + h) * head_dim];
        for (size_t n = 0; n < keys.size(); ++n) {
          const double p = std::exp(logits[n] - max_logit);
          sum += p;
          const double* vrow = &v[((cu_kv[b] + keys[n]) * num_kv_heads + kv_head) * head_dim];
          for (int64_t e = 0; e < head_dim; ++e) orow[e] += p * vrow[e];
        }
        for (int64_t e = 0; e < head_dim; ++e) orow[e] /= sum;
        result.lse[token * num_qo_heads + h] = max_logit + std::log(sum);
      }
    }
  }
  return result;
}

}  // namespace splitkv_test

#endif  // SPLITKV_TESTS_CC_REFERENCE_H_
