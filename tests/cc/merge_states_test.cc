// MergeStates on the CPU backend, from C++ (no Python): values against the documented
// formula in double, an empty state's NaN outs ignored, one live state given back bit for
// bit, and refused arguments named.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cc/splitkv/errors.h"
#include "cc/splitkv/merge_states.h"
#include "tests/cc/test_check.h"

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kStates = 3, kTokens = 4, kHeads = 2, kHeadDim = 5;

struct Problem {
  std::vector<float> outs = std::vector<float>(kStates * kTokens * kHeads * kHeadDim);
  std::vector<float> lses = std::vector<float>(kStates * kTokens * kHeads);
  std::vector<float> out = std::vector<float>(kTokens * kHeads * kHeadDim, std::nanf(""));
  std::vector<float> lse = std::vector<float>(kTokens * kHeads, std::nanf(""));

  explicit Problem(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : outs) x = normal(rng);
    for (float& x : lses) x = 4.0f * normal(rng);
  }
  splitkv::MergeStatesParams Params() {
    splitkv::MergeStatesParams p;
    p.outs = outs.data();
    p.outs_stride_state = kTokens * kHeads * kHeadDim;
    p.outs_stride_token = kHeads * kHeadDim;
    p.outs_stride_head = kHeadDim;
    p.lses = lses.data();
    p.lses_stride_state = kTokens * kHeads;
    p.lses_stride_token = kHeads;
    p.lses_stride_head = 1;
    p.out = out.data();
    p.out_stride_token = kHeads * kHeadDim;
    p.out_stride_head = kHeadDim;
    p.lse = lse.data();
    p.lse_stride_token = kHeads;
    p.lse_stride_head = 1;
    p.num_states = kStates;
    p.total_q = kTokens;
    p.num_qo_heads = kHeads;
    p.head_dim = kHeadDim;
    p.dtype = splitkv::DType::kFloat32;
    return p;
  }
  float& Lse(int64_t s, int64_t t, int64_t h) { return lses[(s * kTokens + t) * kHeads + h]; }
  float& Out(int64_t s, int64_t t, int64_t h, int64_t d) {
    return outs[((s * kTokens + t) * kHeads + h) * kHeadDim + d];
  }
};

TEST(MatchesTheFormulaInDouble) {
  Problem problem(1);
  problem.Lse(1, 0, 0) = kNegInf;                                     // one empty state
  for (int64_t d = 0; d < kHeadDim; ++d) problem.Out(1, 0, 0, d) = std::nanf("");  // never read
  for (int64_t s = 0; s < kStates; ++s) problem.Lse(s, 2, 1) = kNegInf;  // a row with no key
  splitkv::MergeStates(problem.Params());
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      double m = -INFINITY;
      for (int64_t s = 0; s < kStates; ++s) m = std::fmax(m, problem.Lse(s, t, h));
      if (std::isinf(m)) {
        EXPECT_TRUE(std::isinf(problem.lse[t * kHeads + h]) && problem.lse[t * kHeads + h] < 0);
        for (int64_t d = 0; d < kHeadDim; ++d) EXPECT_EQ(0.0f, problem.out[(t * kHeads + h) * kHeadDim + d]);
        continue;
      }
      double total = 0.0;
      for (int64_t s = 0; s < kStates; ++s) total += std::exp(double{problem.Lse(s, t, h)} - m);
      EXPECT_NEAR(m + std::log(total), double{problem.lse[t * kHeads + h]}, 1e-5);
      for (int64_t d = 0; d < kHeadDim; ++d) {
        double want = 0.0;
        for (int64_t s = 0; s < kStates; ++s) {
          const double w = std::exp(double{problem.Lse(s, t, h)} - m) / total;
          if (w != 0.0) want += w * problem.Out(s, t, h, d);
        }
        EXPECT_NEAR(want, double{problem.out[(t * kHeads + h) * kHeadDim + d]}, 1e-5);
      }
    }
  }
}

TEST(OneLiveStateIsGivenBackBitForBit) {
  Problem problem(2);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) problem.Lse(0, t, h) = problem.Lse(2, t, h) = kNegInf;
  }
  splitkv::MergeStates(problem.Params());
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      EXPECT_EQ(problem.Lse(1, t, h), problem.lse[t * kHeads + h]);
      for (int64_t d = 0; d < kHeadDim; ++d) {
        EXPECT_EQ(problem.Out(1, t, h, d), problem.out[(t * kHeads + h) * kHeadDim + d]);
      }
    }
  }
}

TEST(BadArgumentsAreNamed) {
  Problem problem(3);
  auto p = problem.Params();
  p.num_states = 0;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: num_states", "got 0");
  p.num_states = int64_t{1} << 62;  // no std::length_error from the CPU's per-state weights
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: num_states",
                "got 4611686018427387904");
  p = problem.Params();
  p.head_dim = -1;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: head_dim", "got -1");
  p = problem.Params();
  p.lses_stride_token = -2;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "lses_stride_token", "got -2");
  p = problem.Params();
  p.lse = nullptr;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: lse is null");
  p = problem.Params();
  p.dtype = static_cast<splitkv::DType>(7);
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: dtype unknown", "got 7");
  p = problem.Params();
  p.backend = static_cast<splitkv::Backend>(5);  // never the CPU's branch for an unknown code
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: backend unknown",
                "expected 0 (cpu) or 1 (cuda)", "got 5");
  // out rows / lse entries written twice, and strides past 2^63 bytes, as the launchers refuse.
  p = problem.Params();
  p.out_stride_token = 0;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: out strides overlap",
                "out_stride_token = 0");
  p = problem.Params();
  p.lse_stride_head = 0;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: lse strides overlap",
                "expected one element per (token, head), each its own, got lse_stride_token = 2, lse_stride_head = 0");
  p = problem.Params();
  p.outs_stride_state = int64_t{1} << 62;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: outs strides out of range");
  // out / lse over what the merge reads or over each other, and misaligned pointers, as the
  // launchers refuse theirs.
  p = problem.Params();
  p.out = problem.outs.data();  // merged in place over the partials
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: out overlaps outs",
                "expected a buffer sharing no byte with outs");
  p = problem.Params();
  p.lse = problem.lses.data() + 1;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: lse overlaps lses");
  p = problem.Params();
  p.lse = problem.out.data();
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: out overlaps lse");
  p = problem.Params();
  p.out = reinterpret_cast<char*>(problem.out.data()) + 2;
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: out misaligned", "address % 4 = 2");
  p = problem.Params();
  p.lses = reinterpret_cast<const float*>(reinterpret_cast<const char*>(problem.lses.data()) + 1);
  EXPECT_THROWS(splitkv::InvalidArgument, splitkv::MergeStates(p), "merge_states: lses misaligned", "address % 4 = 1");
  // Nothing was written by the refused calls.
  for (float x : problem.out) EXPECT_TRUE(std::isnan(x));
  p = problem.Params();
  p.total_q = 0;
  p.outs = nullptr;
  splitkv::MergeStates(p);  // nothing to merge: no pointer is needed
  for (float x : problem.lse) EXPECT_TRUE(std::isnan(x));
}

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
