// The CPU backend's float16 / bfloat16 conversions (cc/splitkv/cpu/dtype.h) against this
// test's frexp/ldexp implementation: every 16-bit pattern to float, and float to 16 bits
// round-to-nearest-even on exact values, ties, near-ties, subnormals, overflow and specials.
#include "cc/splitkv/cpu/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/cc/test_check.h"
#include "tests/cc/test_dtypes.h"

namespace {

using splitkv::DType;
using splitkv::cpu::BFloat16;
using splitkv::cpu::FromFloat;
using splitkv::cpu::Half;
using splitkv::cpu::ToFloat;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
uint16_t LibraryBits(float x) {
  return FromFloat<T>(x).bits;
}

template <typename T>
float LibraryFloat(uint16_t bits) {
  return ToFloat(T{bits});
}

// Whether the library's encoding of x is the nearest-even one (any NaN for NaN).
template <typename T>
bool EncodesLikeReference(DType dtype, float x, std::string* detail) {
  const uint16_t got = LibraryBits<T>(x);
  if (std::isnan(x)) {
    const bool ok = std::isnan(splitkv_test::DecodeHalfLike(dtype, got));
    if (!ok) *detail = "NaN encoded as non-NaN bits " + std::to_string(got);
    return ok;
  }
  const uint16_t want = splitkv_test::EncodeHalfLike(dtype, splitkv_test::RoundTo(dtype, x));
  if (got != want) {
    *detail = std::string(splitkv_test::DTypeName(dtype)) + " of " + splitkv_test::Show(x) + ": expected bits " +
              std::to_string(want) + ", got " + std::to_string(got);
  }
  return got == want;
}

// Every 16-bit pattern decodes to the reference value (NaN to NaN).
template <typename T>
void CheckAllDecodes(DType dtype) {
  int64_t bad = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const double want = splitkv_test::DecodeHalfLike(dtype, static_cast<uint16_t>(bits));
    const float got = LibraryFloat<T>(static_cast<uint16_t>(bits));
    const bool ok = std::isnan(want) ? std::isnan(got) : (static_cast<double>(got) == want &&
                                                           std::signbit(got) == std::signbit(want));
    if (!ok && bad++ < 3) {
      splitkv_test::Fail(__FILE__, __LINE__, std::string(splitkv_test::DTypeName(dtype)) + " bits " +
                                                 std::to_string(bits) + ": expected " + splitkv_test::Show(want) +
                                                 ", got " + splitkv_test::Show(got));
    }
  }
  EXPECT_EQ(int64_t{0}, bad);
}

// Encoding: every representable value, the midpoints between neighbours (ties), one float
// ulp either side of each midpoint, then random floats of every magnitude.
template <typename T>
void CheckEncodes(DType dtype) {
  std::vector<float> inputs;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const double a = splitkv_test::DecodeHalfLike(dtype, static_cast<uint16_t>(bits));
    const double b = splitkv_test::DecodeHalfLike(dtype, static_cast<uint16_t>(bits + 1));
    inputs.push_back(static_cast<float>(a));
    if (!std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b)) continue;
    const float mid = static_cast<float>((a + b) / 2);  // exact: one more significand bit than the format
    inputs.push_back(mid);
    inputs.push_back(std::nextafter(mid, 0.0f));
    inputs.push_back(std::nextafter(mid, std::numeric_limits<float>::infinity() * (a < 0 ? -1.0f : 1.0f)));
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) inputs.push_back(FromBits(any_bits(rng)));
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 65504.0f, 65519.996f, 65520.0f,
                  -65520.0f, 1e-8f, 2.9802322e-08f, 2.9802326e-08f, 5.9604645e-08f, 6.097555e-05f, 3.4028235e38f,
                  std::numeric_limits<float>::denorm_min(), 1.1754942e-38f, FromBits(0x7f7f8000u),
                  FromBits(0x7f7f7fffu), FromBits(0x00008000u), FromBits(0x00018000u)}) {
    inputs.push_back(x);
  }
  int64_t bad = 0;
  std::string detail;
  for (float x : inputs) {
    if (!EncodesLikeReference<T>(dtype, x, &detail) && bad++ < 3) splitkv_test::Fail(__FILE__, __LINE__, detail);
  }
  EXPECT_EQ(int64_t{0}, bad);
  EXPECT_GT(static_cast<int64_t>(inputs.size()), int64_t{200000});
}

TEST(Float16DecodesEveryPattern) { CheckAllDecodes<Half>(DType::kFloat16); }
TEST(BFloat16DecodesEveryPattern) { CheckAllDecodes<BFloat16>(DType::kBFloat16); }
TEST(Float16EncodesToNearestEven) { CheckEncodes<Half>(DType::kFloat16); }
TEST(BFloat16EncodesToNearestEven) { CheckEncodes<BFloat16>(DType::kBFloat16); }

TEST(KnownEncodings) {
  EXPECT_EQ(uint16_t{0x3c00}, LibraryBits<Half>(1.0f));
  EXPECT_EQ(uint16_t{0x7bff}, LibraryBits<Half>(65504.0f));
  EXPECT_EQ(uint16_t{0x7c00}, LibraryBits<Half>(65520.0f));  // the tie above the largest rounds to inf
  EXPECT_EQ(uint16_t{0x0001}, LibraryBits<Half>(5.9604645e-08f));
  EXPECT_EQ(uint16_t{0x8000}, LibraryBits<Half>(-0.0f));
  EXPECT_EQ(uint16_t{0x3f80}, LibraryBits<BFloat16>(1.0f));
  EXPECT_EQ(uint16_t{0x3f80}, LibraryBits<BFloat16>(1.00390625f));  // tie 1 + 2^-8 to even
  EXPECT_EQ(uint16_t{0x3f82}, LibraryBits<BFloat16>(1.01171875f));  // tie 1 + 3 * 2^-8 to even
  EXPECT_EQ(uint16_t{0x7f80}, LibraryBits<BFloat16>(std::numeric_limits<float>::infinity()));
}

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
