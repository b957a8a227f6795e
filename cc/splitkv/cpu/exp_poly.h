// The one exp(x) approximation of the CPU kernels, for x <= 0 (softmax weights): the scalar
// ExpNonPositive (attention_tile.h) and each ISA's Simd::Exp (simd.h) use these constants.
// Range reduction x = n ln2 + r with ln2 split in two parts so n ln2 is exact, and a
// degree-6 polynomial for exp(r) on [-ln2/2, ln2/2]: the classic Cephes expf scheme
// (relative error about 1e-7). Below kExpLowest the result is 0.
#ifndef SPLITKV_CPU_EXP_POLY_H_
#define SPLITKV_CPU_EXP_POLY_H_

namespace splitkv::cpu {

inline constexpr float kExpLowest = -87.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2High = 0.693359375f;  // ln2 = kLn2High - kLn2Low
inline constexpr float kLn2Low = 2.12194440e-4f;
// exp(r) ~ 1 + r + r^2 (c0 r^5 + c1 r^4 + ... + c5), c0 first.
inline constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                      4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// The polynomial on S's vectors (S: a Simd of simd.h), Horner's rule with fused steps.
template <class S>
inline typename S::V ExpPolynomial(typename S::V r) {
  typename S::V poly = S::Set1(kExpPoly[0]);
  poly = S::Fma(poly, r, S::Set1(kExpPoly[1]));
  poly = S::Fma(poly, r, S::Set1(kExpPoly[2]));
  poly = S::Fma(poly, r, S::Set1(kExpPoly[3]));
  poly = S::Fma(poly, r, S::Set1(kExpPoly[4]));
  poly = S::Fma(poly, r, S::Set1(kExpPoly[5]));
  return S::Fma(poly, S::Mul(r, r), S::Add(r, S::Set1(1.0f)));
}

}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_EXP_POLY_H_
