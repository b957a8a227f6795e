// Test-side element types: round a double to float32 / float16 / bfloat16 and store or load
// it as the library's bytes. Written independently of cc/splitkv/cpu/dtype.h (no bit tricks:
// frexp/ldexp and round-half-even on the significand), so the tests check that file too.
#ifndef SPLITKV_TESTS_CC_TEST_DTYPES_H_
#define SPLITKV_TESTS_CC_TEST_DTYPES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cc/splitkv/params.h"

namespace splitkv_test {

inline const char* DTypeName(splitkv::DType dtype) {
  switch (dtype) {
    case splitkv::DType::kFloat32: return "float32";
    case splitkv::DType::kFloat16: return "float16";
    case splitkv::DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

inline int64_t ElementBytes(splitkv::DType dtype) { return dtype == splitkv::DType::kFloat32 ? 4 : 2; }

struct FloatFormat {
  int significand_bits;  // including the implicit bit
  int min_exponent;      // exponent of the smallest normal, 2^min_exponent
  int max_exponent;      // exponent of the largest finite, 2^max_exponent * (2 - ulp)
};

inline FloatFormat FormatOf(splitkv::DType dtype) {
  switch (dtype) {
    case splitkv::DType::kFloat16: return {11, -14, 15};
    case splitkv::DType::kBFloat16: return {8, -126, 127};
    default: return {24, -126, 127};
  }
}

// Nearest representable value, ties to even; overflow gives inf.
inline double RoundTo(splitkv::DType dtype, double x) {
  if (dtype == splitkv::DType::kFloat32) return static_cast<double>(static_cast<float>(x));
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  const FloatFormat f = FormatOf(dtype);
  int exponent;
  std::frexp(x, &exponent);  // |x| in [2^(exponent-1), 2^exponent)
  const int unit_exponent = std::max(exponent - 1, f.min_exponent) - (f.significand_bits - 1);
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(x, -unit_exponent)), unit_exponent);
  const double largest = std::ldexp(2.0 - std::ldexp(1.0, 1 - f.significand_bits), f.max_exponent);
  if (std::fabs(rounded) > largest) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return rounded;
}

// Bits of a value already representable in the 16-bit format.
inline uint16_t EncodeHalfLike(splitkv::DType dtype, double value) {
  const FloatFormat f = FormatOf(dtype);
  const int mantissa_bits = f.significand_bits - 1;
  const int exponent_bits = 15 - mantissa_bits;
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double a = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint16_t>(0x7fff);
  const uint16_t inf = static_cast<uint16_t>(((1 << exponent_bits) - 1) << mantissa_bits);
  if (std::isinf(value)) return sign | inf;
  if (a == 0.0) return sign;
  int exponent;
  std::frexp(a, &exponent);
  if (exponent - 1 < f.min_exponent) {  // subnormal: a = m * 2^(min_exponent - mantissa_bits)
    return sign | static_cast<uint16_t>(std::ldexp(a, mantissa_bits - f.min_exponent));
  }
  const uint16_t biased = static_cast<uint16_t>(exponent - 1 + bias);
  const uint16_t mantissa = static_cast<uint16_t>(std::ldexp(a, mantissa_bits - (exponent - 1)) - (1 << mantissa_bits));
  return sign | static_cast<uint16_t>(biased << mantissa_bits) | mantissa;
}

inline double DecodeHalfLike(splitkv::DType dtype, uint16_t bits) {
  const FloatFormat f = FormatOf(dtype);
  const int mantissa_bits = f.significand_bits - 1;
  const int exponent_bits = 15 - mantissa_bits;
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int biased = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  if (biased == (1 << exponent_bits) - 1) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  }
  if (biased == 0) return sign * std::ldexp(mantissa, f.min_exponent - mantissa_bits);
  return sign * std::ldexp((1 << mantissa_bits) + mantissa, biased - bias - mantissa_bits);
}

// A dtype-erased array of elements in the library's byte format.
class TypedArray {
 public:
  TypedArray() = default;
  TypedArray(splitkv::DType dtype, int64_t size, double fill = 0.0)
      : dtype_(dtype), size_(size), bytes_(static_cast<size_t>(size * ElementBytes(dtype))) {
    for (int64_t i = 0; i < size; ++i) Set(i, fill);
  }

  // Stores RoundTo(dtype, value); returns the stored value.
  double Set(int64_t i, double value) {
    const double rounded = RoundTo(dtype_, value);
    if (dtype_ == splitkv::DType::kFloat32) {
      const float f = static_cast<float>(rounded);
      std::memcpy(&bytes_[i * 4], &f, 4);
    } else {
      const uint16_t bits = EncodeHalfLike(dtype_, rounded);
      std::memcpy(&bytes_[i * 2], &bits, 2);
    }
    return rounded;
  }

  double Get(int64_t i) const {
    if (dtype_ == splitkv::DType::kFloat32) {
      float f;
      std::memcpy(&f, &bytes_[i * 4], 4);
      return f;
    }
    uint16_t bits;
    std::memcpy(&bits, &bytes_[i * 2], 2);
    return DecodeHalfLike(dtype_, bits);
  }

  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  int64_t size() const { return size_; }
  splitkv::DType dtype() const { return dtype_; }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

 private:
  splitkv::DType dtype_ = splitkv::DType::kFloat32;
  int64_t size_ = 0;
  std::vector<unsigned char> bytes_;
};

}  // namespace splitkv_test

#endif  // SPLITKV_TESTS_CC_TEST_DTYPES_H_
