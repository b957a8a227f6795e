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
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/splitkv/cpu/attention_blocks.h"
#include "cc/splitkv/cpu/dtype.h"
#include "cc/splitkv/cpu/exp_poly.h"
#include "cc/splitkv/cpu/isa.h"
#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {

inline constexpr int64_t kKeyBlock = 64;  // keys converted to float32 at a time
inline constexpr int64_t kRowBlock = 4;   // query rows per micro-kernel
inline constexpr int64_t kLanes = 16;     // keys (scores) or head_dim elements (outputs) per micro-kernel

// Softmax stats of one partial, as stored in the workspace's softmax region.
struct SoftmaxStat {
  float max;      // largest scaled logit among the split's visible keys (-inf if none)
  float sum_exp;  // sum of exp(logit - max) over them (0 if none)
};

// A split's weight in the merge: sum_exp * exp(max - global_max), 0 for a split that saw no
// finite logit.
inline float SplitWeight(const SoftmaxStat& st, float global_max) {
  return st.sum_exp != 0.0f ? st.sum_exp * std::exp(st.max - global_max) : 0.0f;
}

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

// The rows of one tile: tokens [token_begin, token_begin + num_tokens) of a request with
// kv_len keys whose query i sits at local key position q_start + i (kv_len - q_len when the
// queries are the last q_len tokens; shifted by kv_offsets/full_seq_lens, params.h);
// first_index is the first token's index among the request's queries.
struct TileRows {
  int64_t token_begin, num_tokens, first_index;
  int64_t q_start, kv_len;
  int64_t kv_head;
  int64_t counter_index;
};

// Visible keys [lo, hi) of the query at index i of its request, whose query 0 sits at local
// position q_start (DESIGN.md semantics). A position past the last key sees every key the
// window leaves (none once the window starts past kv_len); one before key 0 sees none under
// causal masking. Empty ranges are [lo, lo) with lo in [0, kv_len].
inline KeyRange VisibleKeys(const AttentionOptions& options, int64_t q_start, int64_t kv_len, int64_t i) {
  const int64_t pos = q_start + i;
  int64_t hi = options.causal ? std::min(kv_len, pos + 1) : kv_len;
  int64_t lo = options.window_left >= 0 ? std::clamp<int64_t>(pos - options.window_left, 0, kv_len) : 0;
  return {lo, std::max<int64_t>(lo, hi)};
}

// exp(x) for x <= 0, NaN passing through; branch-free so loops over it vectorise. The
// scheme and its constants: exp_poly.h. Below kExpLowest the result is 0.
inline float ExpNonPositive(float x) {
  const float clamped = x < kExpLowest ? kExpLowest : x;  // a NaN fails the comparison and stays NaN
  const float rounder = 12582912.0f;                      // 1.5 * 2^23: adding it rounds to an integer
  const float n = (clamped * kLog2e + rounder) - rounder;
  const float r = (clamped - n * kLn2High) + n * kLn2Low;
  float poly = kExpPoly[0];
  poly = poly * r + kExpPoly[1];
  poly = poly * r + kExpPoly[2];
  poly = poly * r + kExpPoly[3];
  poly = poly * r + kExpPoly[4];
  poly = poly * r + kExpPoly[5];
  poly = poly * r * r + r + 1.0f;
  const float scale = BitsToFloat(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return x < kExpLowest ? 0.0f : poly * scale;
}

// max(a, b) that keeps a NaN from either side (std::max drops a NaN second operand): a NaN
// logit, from NaN or infinite q or k, must reach the row's result rather than vanish.
inline float NanMax(float a, float b) { return (a < b || b != b) ? b : a; }

// How a finished row is normalised (DESIGN.md Semantics): a row whose visible logits have
// max `max` and sum of exp(logit - max) `sum` (0: no finite logit) gets
// out = (its sum-normalised output) * keep, and this lse. Without sinks keep is 1 and lse
// max + log(sum). A sink adds exp(sinks[head]) to the denominator once; both terms are taken
// relative to the larger of max and the sink, so a sink far above or below the logits
// neither overflows nor turns the row into NaN. Called where a row's result is written:
// unsplit, or in the merge (never for a partial).
struct RowNorm {
  float keep;
  float lse;
};
inline RowNorm NormaliseRow(float max, float sum, const float* sinks, int64_t head) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (sinks == nullptr) return sum != 0.0f ? RowNorm{1.0f, max + std::log(sum)} : RowNorm{0.0f, kNegInf};
  const float sink = sinks[head];
  if (sum == 0.0f) return {0.0f, sink};  // no key: out 0, lse = the sink
  const float top = NanMax(max, sink);
  const float keys = sum * std::exp(max - top);
  const float total = keys + std::exp(sink - top);
  return {keys / total, top + std::log(total)};
}

// Eight floats as one value: GCC and Clang lower it to one AVX2 register or two SSE ones,
// so the micro-kernels below say exactly which loop runs across vector lanes.
typedef float Vec8 __attribute__((vector_size(32)));

inline Vec8 Load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void Store8(float* p, Vec8 v) { std::memcpy(p, &v, sizeof v); }

// scores[rr * kKeyBlock + j] = q_rr . k_j for R rows and keys [0, padded_keys), from keys
// stored transposed (kt[e * kKeyBlock + j]) so the lanes run along keys.
template <int R>
inline void ScoreRows(const float* q, const float* kt, float* scores, int64_t d, int64_t padded_keys) {
  static_assert(kLanes == 16, "two Vec8 per row");
  for (int64_t j0 = 0; j0 < padded_keys; j0 += kLanes) {
    Vec8 acc[R][2] = {};
    for (int64_t e = 0; e < d; ++e) {
      const Vec8 k0 = Load8(kt + e * kKeyBlock + j0);
      const Vec8 k1 = Load8(kt + e * kKeyBlock + j0 + 8);
      for (int rr = 0; rr < R; ++rr) {
        const float qv = q[rr * d + e];
        acc[rr][0] += qv * k0;
        acc[rr][1] += qv * k1;
      }
    }
    for (int rr = 0; rr < R; ++rr) {
      Store8(scores + rr * kKeyBlock + j0, acc[rr][0]);
      Store8(scores + rr * kKeyBlock + j0 + 8, acc[rr][1]);
    }
  }
}

// The same scores from keys stored row by row (k[j * d + e]), for tiles of few rows
// (decode): no transpose, each key row is read once for all rows; d % 8 == 0.
template <int R>
inline void ScoreRowsDirect(const float* q, const float* k, float* scores, int64_t d, int64_t num_keys) {
  for (int64_t j = 0; j < num_keys; ++j) {
    Vec8 acc[R] = {};
    for (int64_t e = 0; e < d; e += 8) {
      const Vec8 kv = Load8(k + j * d + e);
      for (int rr = 0; rr < R; ++rr) acc[rr] += Load8(q + rr * d + e) * kv;
    }
    for (int rr = 0; rr < R; ++rr) {
      const Vec8 a = acc[rr];
      scores[rr * kKeyBlock + j] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
  }
}

// out[rr][e] += sum_j p[rr * kKeyBlock + j] * v[j][e] for R rows; d % kLanes == 0. The
// block's sum is formed apart and added to out once, as the row sums are: added key by key
// into a running sum over millions of keys in one split, float32 lost the late keys' share
// (an output 4 % off at 2^22 keys of equal weight).
template <int R>
inline void AccumulateRows(const float* p, const float* v, float* out, int64_t num_keys, int64_t d) {
  for (int64_t e0 = 0; e0 < d; e0 += kLanes) {
    Vec8 acc[R][2] = {};
    for (int64_t j = 0; j < num_keys; ++j) {
      const Vec8 v0 = Load8(v + j * d + e0);
      const Vec8 v1 = Load8(v + j * d + e0 + 8);
      for (int rr = 0; rr < R; ++rr) {
        const float pj = p[rr * kKeyBlock + j];
        acc[rr][0] += pj * v0;
        acc[rr][1] += pj * v1;
      }
    }
    for (int rr = 0; rr < R; ++rr) {
      Store8(out + rr * d + e0, Load8(out + rr * d + e0) + acc[rr][0]);
      Store8(out + rr * d + e0 + 8, Load8(out + rr * d + e0 + 8) + acc[rr][1]);
    }
  }
}

// Per-thread buffers, reused across tasks.
struct TileScratch {
  Vector<float> q, acc, keys, values, scores, row_max, row_sum;
  Vector<float> block_pv;  // one row's P V over one block (AccumulateOwnKeys)
  Vector<int64_t> key_lo, key_hi;
  Vector<int64_t> row_lo, row_hi;  // visible keys of each row (block kernels)
};

// out_r += sum_j p_j v_j over row r's visible keys [key_lo, key_hi) of the block, the
// block's sum formed apart and added once (see AccumulateRows).
inline void AccumulateOwnKeys(TileScratch& s, int64_t r, int64_t d) {
  const float* p = &s.scores[r * kKeyBlock];
  float* out = &s.acc[r * d];
  s.block_pv.assign(d, 0.0f);
  float* const pv = s.block_pv.data();
  for (int64_t j = s.key_lo[r]; j < s.key_hi[r]; ++j) {
    const float* v = &s.values[j * d];
    for (int64_t e = 0; e < d; ++e) pv[e] += p[j] * v[e];
  }
  for (int64_t e = 0; e < d; ++e) out[e] += pv[e];
}

// The element type a KV source's rows hold (T, float for a dequantised fp8 source).
template <typename Kv>
using KvElement = std::remove_cv_t<std::remove_pointer_t<decltype(std::declval<const Kv&>().Key(0))>>;

// Loads a tile's queries as float32 into s.q and each token's visible keys into `visible`;
// returns the union of the tokens' visible keys ({kv_len, kv_len} when none sees a key).
template <typename T>
KeyRange LoadTileRows(const TileInputs<T>& in, const TileRows& tile, TileScratch& s, Vector<KeyRange>& visible) {
  const int64_t d = in.head_dim;
  const int64_t group = in.group_size;
  s.q.resize(tile.num_tokens * group * d);
  visible.resize(tile.num_tokens);
  int64_t tile_lo = tile.kv_len, tile_hi = 0;
  for (int64_t t = 0; t < tile.num_tokens; ++t) {
    visible[t] = VisibleKeys(in.options, tile.q_start, tile.kv_len, tile.first_index + t);
    if (visible[t].end > visible[t].begin) {
      tile_lo = std::min(tile_lo, visible[t].begin);
      tile_hi = std::max(tile_hi, visible[t].end);
    }
    for (int64_t g = 0; g < group; ++g) {
      const int64_t head = tile.kv_head * group + g;
      const T* q = in.q + (tile.token_begin + t) * in.q_stride_token + head * in.q_stride_head;
      float* qf = &s.q[(t * group + g) * d];
      for (int64_t e = 0; e < d; ++e) qf[e] = ToFloat(q[e]);
    }
  }
  return {tile_lo, std::max(tile_lo, tile_hi)};
}

// The online softmax of the tile's rows (s.q, `visible`) over keys [keys.begin, keys.end),
// from a fresh state: s.acc (unnormalised output), s.row_max and s.row_sum per row.
// `invariant` (batch_invariant): every row takes the same arithmetic whatever the tile's
// row count and values (the row-lane block kernels, or the transposed-key generic path, and
// no BF16 dot product), and keys.begin must be a multiple of kKeyBlock.
template <typename T, typename Kv>
void RunTileKeys(const TileInputs<T>& in, const TileRows& tile, const Kv& kv, TileScratch& s,
                 const Vector<KeyRange>& visible, KeyRange keys, bool invariant) {
  const int64_t d = in.head_dim;
  const int64_t group = in.group_size;
  const int64_t rows = tile.num_tokens * group;
  s.acc.assign(rows * d, 0.0f);
  s.row_max.assign(rows, -std::numeric_limits<float>::infinity());
  s.row_sum.assign(rows, 0.0f);
  s.keys.resize(kKeyBlock * d);
  s.values.resize(kKeyBlock * d);
  s.scores.resize(rows * kKeyBlock);
  s.key_lo.resize(rows);
  s.key_hi.resize(rows);
  const float cap = in.options.logits_soft_cap;
  const float sm_scale = in.options.sm_scale;
  // Few rows (decode): score straight from key rows; many (prefill): from transposed keys,
  // which lets a 4-row x 16-key block of scores stay in registers.
  const bool direct = !invariant && rows <= 2 * kRowBlock && d % 8 == 0;

  // The AVX-512 and AVX2 builds run vector block kernels where they apply
  // (attention_blocks.h); the loop below is the baseline build's path, and the others' for
  // head_dims that are not a multiple of their vector width.
  bool done = false;
#ifdef SPLITKV_CPU_HAS_BLOCK_KERNELS
  s.row_lo.resize(rows);
  s.row_hi.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    s.row_lo[r] = visible[r / group].begin;
    s.row_hi[r] = visible[r / group].end;
  }
  done = blocks::RunKeys<KvElement<Kv>>(kv, keys.begin, keys.end,
                            blocks::RowState{s.q.data(), s.row_lo.data(), s.row_hi.data(), rows, d, sm_scale, cap,
                                             s.acc.data(), s.row_max.data(), s.row_sum.data()},
                            invariant);
#endif
  for (int64_t kb = done ? keys.end : keys.begin; kb < keys.end; kb += kKeyBlock) {
    const int64_t nb = std::min(kKeyBlock, keys.end - kb);
    const int64_t padded = (nb + kLanes - 1) / kLanes * kLanes;
    for (int64_t j = 0; j < nb; ++j) {
      // Rows of the next block, asked for while this one computes: paged (or token-major)
      // rows are not one stream the hardware prefetcher can follow.
      if (kb + nb + j < keys.end) {
        const char* next_key = reinterpret_cast<const char*>(kv.Key(kb + nb + j));
        const char* next_value = reinterpret_cast<const char*>(kv.Value(kb + nb + j));
        for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(T)); b += 64) {
          __builtin_prefetch(next_key + b);
          __builtin_prefetch(next_value + b);
        }
      }
      // Through local pointers: under -fno-strict-aliasing a store through s.keys[...] may
      // alias the vector's own pointer, which then reloads per element and stays scalar.
      const auto* key = kv.Key(kb + j);
      float* const keys_f = s.keys.data();
      if (direct) {
        for (int64_t e = 0; e < d; ++e) keys_f[j * d + e] = ToFloat(key[e]);
      } else {
        for (int64_t e = 0; e < d; ++e) keys_f[e * kKeyBlock + j] = ToFloat(key[e]);
      }
      const auto* value = kv.Value(kb + j);
      float* const values_f = s.values.data() + j * d;
      for (int64_t e = 0; e < d; ++e) values_f[e] = ToFloat(value[e]);
    }
    int64_t r0 = 0;
    if (direct) {
      for (; r0 + kRowBlock <= rows; r0 += kRowBlock) {
        ScoreRowsDirect<kRowBlock>(&s.q[r0 * d], s.keys.data(), &s.scores[r0 * kKeyBlock], d, nb);
      }
      for (; r0 < rows; ++r0) ScoreRowsDirect<1>(&s.q[r0 * d], s.keys.data(), &s.scores[r0 * kKeyBlock], d, nb);
    } else {
      float* const keys_f = s.keys.data();
      for (int64_t j = nb; j < padded; ++j) {
        for (int64_t e = 0; e < d; ++e) keys_f[e * kKeyBlock + j] = 0.0f;
      }
      for (; r0 + kRowBlock <= rows; r0 += kRowBlock) {
        ScoreRows<kRowBlock>(&s.q[r0 * d], s.keys.data(), &s.scores[r0 * kKeyBlock], d, padded);
      }
      for (; r0 < rows; ++r0) ScoreRows<1>(&s.q[r0 * d], s.keys.data(), &s.scores[r0 * kKeyBlock], d, padded);
    }

    // Online softmax per row over its visible keys of the block; p replaces the score.
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange& vis = visible[r / group];
      const int64_t jlo = std::max(kb, vis.begin) - kb;
      const int64_t jhi = std::min(kb + nb, vis.end) - kb;
      s.key_lo[r] = jlo;
      s.key_hi[r] = jhi;
      if (jlo >= jhi) continue;
      float* score = &s.scores[r * kKeyBlock];
      // sm_scale after the dot product, not folded into q: a large scale times q could
      // overflow float32 where the scaled logit (then capped) is finite.
      for (int64_t j = jlo; j < jhi; ++j) score[j] *= sm_scale;
      if (cap > 0.0f) {
        for (int64_t j = jlo; j < jhi; ++j) score[j] = cap * std::tanh(score[j] / cap);
      }
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = jlo; j < jhi; ++j) block_max = NanMax(block_max, score[j]);
      const float new_max = NanMax(s.row_max[r], block_max);
      if (new_max == -std::numeric_limits<float>::infinity()) {
        // Every logit so far is -inf: weight 0 each (exp(-inf - -inf) would be NaN).
        for (int64_t j = jlo; j < jhi; ++j) score[j] = 0.0f;
        continue;
      }
      const float rescale = std::exp(s.row_max[r] - new_max);  // 0 when the row was empty
      if (rescale != 1.0f) {
        float* acc = &s.acc[r * d];
        for (int64_t e = 0; e < d; ++e) acc[e] *= rescale;
      }
      for (int64_t j = jlo; j < jhi; ++j) score[j] = ExpNonPositive(score[j] - new_max);
      float sum = 0.0f;
      for (int64_t j = jlo; j < jhi; ++j) sum += score[j];
      s.row_max[r] = new_max;
      s.row_sum[r] = s.row_sum[r] * rescale + sum;
    }

    // P.V: a block of rows that all see every key of the block takes the micro-kernel;
    // any other row sums only its own visible keys, so an invisible key's value (even NaN)
    // never meets a zero weight.
    auto sees_block = [&](int64_t r) { return s.key_lo[r] == 0 && s.key_hi[r] == nb; };
    r0 = 0;
    if (d % kLanes == 0) {
      for (; r0 + kRowBlock <= rows; r0 += kRowBlock) {
        bool all = true;
        for (int64_t rr = 0; rr < kRowBlock; ++rr) all = all && sees_block(r0 + rr);
        if (all) {
          AccumulateRows<kRowBlock>(&s.scores[r0 * kKeyBlock], s.values.data(), &s.acc[r0 * d], nb, d);
          continue;
        }
        for (int64_t r = r0; r < r0 + kRowBlock; ++r) AccumulateOwnKeys(s, r, d);
      }
    }
    for (; r0 < rows; ++r0) AccumulateOwnKeys(s, r0, d);
  }

}

// Runs split `split_idx` of a tile. `kv` gives Key(j) / Value(j) pointers for the tile's
// kv head. Writes the output (1 split) or a partial, then runs the counter protocol.
template <typename T, typename Kv>
void RunTileSplit(const TileInputs<T>& in, const TileRows& tile, const Kv& kv, int64_t split_idx) {
  thread_local TileScratch s;
  thread_local Vector<KeyRange> visible;
  const int64_t d = in.head_dim;
  const int64_t group = in.group_size;
  const KeyRange tile_keys = LoadTileRows(in, tile, s, visible);
  const int64_t num_splits = in.plan->num_splits;
  const KeyRange keys = SplitKeyRange(tile_keys.begin, tile_keys.end, num_splits, split_idx, kKeyBlock);
  RunTileKeys(in, tile, kv, s, visible, keys, /*invariant=*/false);

  const LayoutShape shape{in.total_q, in.num_qo_heads, d};
  // out = (o x scale) x keep: `keep` is the sink's factor (1 without sinks), applied after
  // the normalisation so that a one-split row and a merged row get the same bits.
  auto write_output = [&](int64_t t, int64_t g, const float* o, float scale, float keep, float lse) {
    const int64_t token = tile.token_begin + t;
    const int64_t head = tile.kv_head * group + g;
    T* out = in.out + token * in.out_stride_token + head * in.out_stride_head;
    for (int64_t e = 0; e < d; ++e) out[e] = FromFloat<T>(o == nullptr ? 0.0f : o[e] * scale * keep);
    if (in.lse != nullptr) in.lse[token * in.num_qo_heads + head] = lse;
  };
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  if (num_splits == 1) {
    for (int64_t t = 0; t < tile.num_tokens; ++t) {
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = t * group + g;
        const float sum = s.row_sum[r];
        const RowNorm norm = NormaliseRow(s.row_max[r], sum, in.options.sinks, tile.kv_head * group + g);
        if (sum != 0.0f) {  // 0: no finite logit; NaN: a non-finite input, passed on
          write_output(t, g, &s.acc[r * d], 1.0f / sum, norm.keep, norm.lse);
        } else {
          // No key, or only -inf logits: acc holds 0 weights times the visible values,
          // so a non-finite value there still reaches the row (0 * inf is NaN), as in
          // the reference; otherwise 0.
          write_output(t, g, &s.acc[r * d], 0.0f, 1.0f, norm.lse);
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
      const int64_t index = PartialIndex(shape, num_splits, split_idx, tile.token_begin + t, tile.kv_head * group + g);
      const float sum = s.row_sum[r];
      stats[index] = SoftmaxStat{sum != 0.0f ? s.row_max[r] : kNegInf, sum};
      const float inv = sum != 0.0f ? 1.0f / sum : 0.0f;
      const float* const acc = s.acc.data() + r * d;  // a local pointer: see blocks::Scratch
      for (int64_t e = 0; e < d; ++e) partials[index * d + e] = acc[e] * inv;
    }
  }
  std::atomic_ref<uint32_t> counter(reinterpret_cast<uint32_t*>(in.workspace)[tile.counter_index]);
  // acq_rel: this task's partial is published to, and every earlier partial visible to,
  // whichever task arrives last.
  const uint32_t arrived = counter.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (arrived != static_cast<uint32_t>(num_splits)) return;

  // The last task merges in fixed split order (bitwise-deterministic), then resets.
  Vector<float> merged(d);
  for (int64_t t = 0; t < tile.num_tokens; ++t) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t token = tile.token_begin + t;
      const int64_t head = tile.kv_head * group + g;
      float global_max = kNegInf;
      for (int64_t sp = 0; sp < num_splits; ++sp) {
        const SoftmaxStat st = stats[PartialIndex(shape, num_splits, sp, token, head)];
        if (st.sum_exp != 0.0f) global_max = NanMax(global_max, st.max);
      }
      // The weights' total first, then each split's share w / total: one non-empty split
      // gives back its partial exactly (w / w == 1), the bits of a one-split call, and the
      // sum starts at -0 so that its -0 elements stay -0.
      float total = 0.0f;
      for (int64_t sp = 0; sp < num_splits; ++sp) total += SplitWeight(stats[PartialIndex(shape, num_splits, sp, token, head)], global_max);
      std::fill(merged.begin(), merged.end(), -0.0f);
      for (int64_t sp = 0; sp < num_splits; ++sp) {
        const int64_t index = PartialIndex(shape, num_splits, sp, token, head);
        // A split without a finite logit still merges with share 0: its partial is 0, or
        // NaN where a visible value was not finite, which must not depend on num_splits.
        const float weight = SplitWeight(stats[index], global_max);
        const float share = total > 0.0f ? weight / total : 0.0f;
        for (int64_t e = 0; e < d; ++e) merged[e] += share * partials[index * d + e];
      }
      // The sink, if any, enters here, once per row (partials never include it).
      const RowNorm norm = NormaliseRow(global_max, global_max == kNegInf ? 0.0f : total, in.options.sinks, head);
      if (global_max == kNegInf) {
        write_output(t, g, merged.data(), 0.0f, 1.0f, norm.lse);
        continue;
      }
      write_output(t, g, merged.data(), 1.0f, norm.keep, norm.lse);
    }
  }
  counter.store(0, std::memory_order_release);
}

}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_ATTENTION_TILE_H_
