// float16 / bfloat16 <-> float32 conversion for the CPU backend, portable (no F16C or
// AVX-512 assumed: what ships must run on any x86-64). Round to nearest even on the way out.
#ifndef SPLITKV_CPU_DTYPE_H_
#define SPLITKV_CPU_DTYPE_H_

#include <cstdint>
#include <cstring>

#include "cc/splitkv/cpu/isa.h"

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {

struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float ToFloat(float x) { return x; }
inline float ToFloat(BFloat16 x) { return BitsToFloat(uint32_t{x.bits} << 16); }
inline float ToFloat(Half x) {
  // Rebias the exponent by multiplying: exact for normals, subnormals and zero; inf/NaN
  // are patched after (the multiply would keep them finite).
  const uint32_t sign = uint32_t{x.bits & 0x8000u} << 16;
  const uint32_t rest = x.bits & 0x7fffu;
  if (rest >= 0x7c00u) return BitsToFloat(sign | 0x7f800000u | (rest & 0x3ffu) << 13);
  const float magnitude = BitsToFloat(rest << 13) * BitsToFloat(0x77800000u);  // 2^112
  return BitsToFloat(sign | FloatToBits(magnitude));
}

template <typename T>
T FromFloat(float x);

template <>
inline float FromFloat<float>(float x) { return x; }

template <>
inline BFloat16 FromFloat<BFloat16>(float x) {
  uint32_t bits = FloatToBits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((bits >> 16) | 0x40u)};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(bits >> 16)};
}

template <>
inline Half FromFloat<Half>(float x) {
  const uint32_t bits = FloatToBits(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in half: scale so the float's rounding does the half's rounding.
    const float scaled = BitsToFloat(abs) + 0.5f;  // 0.5 = 2^-1: aligns 2^-24 to the last bit
    return Half{static_cast<uint16_t>(sign | (FloatToBits(scaled) - 0x3f000000u))};
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u) - (uint32_t{112} << 23);
  return Half{static_cast<uint16_t>(sign | (rounded >> 13))};
}

}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_DTYPE_H_
