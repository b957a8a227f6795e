// Do the two tensor-core instruction families give the same bits? (issue 16)
//
// The batch-invariant mode needs a token's output to be the same bits whichever kernel
// computes it: the wgmma prefill (S = Q K^T with both operands in shared memory, O += P V
// with P from registers) or the decode kernel (mma.sync m16n8k16). If one k-step of 16 gives
// the same fp32 result on both, element by element, then kernels that walk the same k-steps
// in the same order (and do the same float work around them) agree bitwise. This probe asks
// only that question, on one warpgroup:
//   S:    64 x 128 = Q (64 x 128) K^T (128 keys x 128), 8 k-steps from a zero accumulator
//         (wgmma scale-d 0 against mma.sync with C = 0);
//   S^T:  the same products with the operands' roles swapped on mma.sync (keys as the
//         m16 rows, the decode kernel's fp8 shape);
//   P V:  64 x 128 = C0 + P (64 x 128 keys, registers) V (128 keys x 128, MN-major),
//         8 k-steps onto a random accumulator.
// Inputs are random with exponents spread over 2^-12..2^12 (so the products' alignment inside
// an instruction matters), never zeros. Prints a line per (dtype, trial): the elements that
// differ (want 0) and the largest |difference|.
//
// Build (on the build machine): nvcc -std=c++20 -O3 --expt-relaxed-constexpr
//   -gencode=arch=compute_90a,code=sm_90a -I. tools/gpu/mma_bits_probe.cu -o mma_bits_probe
// Run on an H200: ./mma_bits_probe  (exit status 0 when it ran; the figures are the output).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cc/splitkv/cuda/ptx.cuh"
#include "cc/splitkv/cuda/wgmma.cuh"

namespace {

using namespace splitkv::cuda;

constexpr int kM = 64, kN = 128, kD = 128;  // query rows, keys, head_dim (and P V's K = kN)

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

// Byte offset of element (r, c) of a [rows][64] 16-bit half, 128-byte swizzled (16-byte
// chunk c / 8 of row r stored at chunk (c / 8) ^ (r % 8)), as TMA writes it.
__device__ uint32_t Swizzled(int r, int c) { return r * 128 + ((((c * 2) >> 4) ^ (r & 7)) << 4) + (c * 2 & 15); }

template <typename T>
__device__ uint32_t Pack(T lo, T hi) {
  uint32_t u;
  T v[2] = {lo, hi};
  std::memcpy(&u, v, 4);
  return u;
}

// One warpgroup. q [64][128], k [128][128] ([key][d]), p [64][128] ([row][key]), v [128][128]
// ([key][d]) row-major; c0 [64][128]. Outputs [64][128] row-major.
template <typename T>
__global__ void __launch_bounds__(128) Probe(const T* q, const T* k, const T* p, const T* v, const float* c0,
                                             float* s_wg, float* s_mma, float* st_mma, float* o_wg, float* o_mma) {
  extern __shared__ unsigned char raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  unsigned char* q_s = smem;                // 2 halves of [64][64]: 8 KiB each
  unsigned char* k_s = q_s + 2 * kM * 128;  // 2 halves of [128][64]: 16 KiB each
  unsigned char* v_s = k_s + 2 * kN * 128;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp + g;  // this thread's first row of the 16-row mma tiles
  for (int i = tid; i < kM * kD; i += 128) {
    const int r = i / kD, c = i % kD;
    *reinterpret_cast<T*>(q_s + (c / 64) * kM * 128 + Swizzled(r, c % 64)) = q[i];
  }
  for (int i = tid; i < kN * kD; i += 128) {
    const int r = i / kD, c = i % kD;
    *reinterpret_cast<T*>(k_s + (c / 64) * kN * 128 + Swizzled(r, c % 64)) = k[i];
    *reinterpret_cast<T*>(v_s + (c / 64) * kN * 128 + Swizzled(r, c % 64)) = v[i];
  }
#if SPLITKV_SM90_DEVICE
  using namespace sm90;
  FenceProxyAsyncShared();
  __syncthreads();

  // ---- wgmma: S (scale-d 0, then 7 accumulating k-steps), as prefill_sm90.cuh issues them.
  float d[64];
  const uint64_t q_desc = Desc128B(SharedAddress(q_s), 16, 1024);
  const uint64_t k_desc = Desc128B(SharedAddress(k_s), 16, 1024);
  WgmmaFence();
  WgmmaSS<T, false>(d, q_desc, k_desc);
  for (int ks = 1; ks < kD / 16; ++ks) {
    WgmmaSS<T, true>(d, DescAdvance(q_desc, (ks / 4) * kM * 128 + (ks % 4) * 32),
                     DescAdvance(k_desc, (ks / 4) * kN * 128 + (ks % 4) * 32));
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegs(d);
  // Accumulator layout: d[4j + 2h + e] is row 16 warp + g + 8h, column 8j + 2t + e.
  for (int j = 0; j < 16; ++j)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) s_wg[(16 * warp + g + 8 * h) * kN + 8 * j + 2 * t + e] = d[4 * j + 2 * h + e];

  // ---- wgmma: O = C0 + P V, P from registers (the mma.sync A fragment of each warp's rows).
  for (int j = 0; j < 16; ++j)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) d[4 * j + 2 * h + e] = c0[(16 * warp + g + 8 * h) * kD + 8 * j + 2 * t + e];
  const uint64_t v_desc = Desc128B(SharedAddress(v_s), kN * 128, 1024);
  uint32_t a[8][4];
  for (int kk = 0; kk < 8; ++kk) {
    const int c = 16 * kk + 2 * t;
    a[kk][0] = Pack(p[r0 * kN + c], p[r0 * kN + c + 1]);
    a[kk][1] = Pack(p[(r0 + 8) * kN + c], p[(r0 + 8) * kN + c + 1]);
    a[kk][2] = Pack(p[r0 * kN + c + 8], p[r0 * kN + c + 9]);
    a[kk][3] = Pack(p[(r0 + 8) * kN + c + 8], p[(r0 + 8) * kN + c + 9]);
  }
  FenceRegs(d);
  WgmmaFence();
  for (int kk = 0; kk < 8; ++kk) WgmmaRS<T>(d, a[kk], DescAdvance(v_desc, kk * 16 * 128));
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegs(d);
  for (int j = 0; j < 16; ++j)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) o_wg[(16 * warp + g + 8 * h) * kD + 8 * j + 2 * t + e] = d[4 * j + 2 * h + e];
#endif

  // ---- mma.sync m16n8k16: the same three products, k-steps in the same order.
  // S: A = Q rows (row-major, K = d), B = K^T (col-major: B[k][n] = k[n][k]).
  for (int nt = 0; nt < kN / 8; ++nt) {
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ks = 0; ks < kD / 16; ++ks) {
      const int k0 = 16 * ks + 2 * t;
      const uint32_t af[4] = {Pack(q[r0 * kD + k0], q[r0 * kD + k0 + 1]),
                              Pack(q[(r0 + 8) * kD + k0], q[(r0 + 8) * kD + k0 + 1]),
                              Pack(q[r0 * kD + k0 + 8], q[r0 * kD + k0 + 9]),
                              Pack(q[(r0 + 8) * kD + k0 + 8], q[(r0 + 8) * kD + k0 + 9])};
      const int n = 8 * nt + g;
      Mma16816<T>(c, af, Pack(k[n * kD + k0], k[n * kD + k0 + 1]), Pack(k[n * kD + k0 + 8], k[n * kD + k0 + 9]));
    }
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) s_mma[(r0 + 8 * h) * kN + 8 * nt + 2 * t + e] = c[2 * h + e];
  }
  // S^T: A = K rows (16 keys a warp-tile), B = Q^T (8 query rows an n-tile); stored as S.
  for (int mt = warp; mt < kN / 16; mt += 4) {
    const int key0 = 16 * mt + g;
    for (int nt = 0; nt < kM / 8; ++nt) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      for (int ks = 0; ks < kD / 16; ++ks) {
        const int k0 = 16 * ks + 2 * t;
        const uint32_t af[4] = {Pack(k[key0 * kD + k0], k[key0 * kD + k0 + 1]),
                                Pack(k[(key0 + 8) * kD + k0], k[(key0 + 8) * kD + k0 + 1]),
                                Pack(k[key0 * kD + k0 + 8], k[key0 * kD + k0 + 9]),
                                Pack(k[(key0 + 8) * kD + k0 + 8], k[(key0 + 8) * kD + k0 + 9])};
        const int n = 8 * nt + g;  // query row
        Mma16816<T>(c, af, Pack(q[n * kD + k0], q[n * kD + k0 + 1]), Pack(q[n * kD + k0 + 8], q[n * kD + k0 + 9]));
      }
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) st_mma[(8 * nt + 2 * t + e) * kN + key0 + 8 * h] = c[2 * h + e];
    }
  }
  // P V onto C0: A = P rows, B = V (col-major view: B[k][n] = v[k][n]).
  for (int nt = 0; nt < kD / 8; ++nt) {
    float c[4];
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) c[2 * h + e] = c0[(r0 + 8 * h) * kD + 8 * nt + 2 * t + e];
    for (int kk = 0; kk < kN / 16; ++kk) {
      const int k0 = 16 * kk + 2 * t;
      const uint32_t af[4] = {Pack(p[r0 * kN + k0], p[r0 * kN + k0 + 1]),
                              Pack(p[(r0 + 8) * kN + k0], p[(r0 + 8) * kN + k0 + 1]),
                              Pack(p[r0 * kN + k0 + 8], p[r0 * kN + k0 + 9]),
                              Pack(p[(r0 + 8) * kN + k0 + 8], p[(r0 + 8) * kN + k0 + 9])};
      const int n = 8 * nt + g;
      Mma16816<T>(c, af, Pack(v[k0 * kD + n], v[(k0 + 1) * kD + n]), Pack(v[(k0 + 8) * kD + n], v[(k0 + 9) * kD + n]));
    }
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) o_mma[(r0 + 8 * h) * kD + 8 * nt + 2 * t + e] = c[2 * h + e];
  }
}

uint64_t state = 88172645463325252ull;
double Uniform() {  // xorshift64*, in [0, 1)
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return static_cast<double>((state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
// Never zero: sign * (1 + u) * 2^e, e uniform in [-spread, spread].
float Value(int spread) {
  const double m = 1.0 + Uniform();
  const int e = static_cast<int>(Uniform() * (2 * spread + 1)) - spread;
  return static_cast<float>((Uniform() < 0.5 ? -m : m) * std::ldexp(1.0, e));
}

template <typename T>
T HostFrom(float x);
template <>
__nv_bfloat16 HostFrom(float x) { return __float2bfloat16(x); }
template <>
__half HostFrom(float x) { return __float2half(x); }

size_t Differ(const std::vector<float>& a, const std::vector<float>& b, double* max_diff) {
  size_t n = 0;
  *max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) ++n;
    *max_diff = std::fmax(*max_diff, std::fabs(double{a[i]} - double{b[i]}));
  }
  return n;
}

template <typename T>
void Trial(const char* name, int spread, int trial) {
  std::vector<T> q(kM * kD), k(kN * kD), p(kM * kN), v(kN * kD);
  std::vector<float> c0(kM * kD);
  // fp16 holds 2^-14..2^15 normally: keep products in range.
  for (auto& x : q) x = HostFrom<T>(Value(spread));
  for (auto& x : k) x = HostFrom<T>(Value(spread));
  for (auto& x : p) x = HostFrom<T>(static_cast<float>(Uniform() * 0.999 + 0.001));  // probabilities
  for (auto& x : v) x = HostFrom<T>(Value(spread));
  for (auto& x : c0) x = Value(spread);
  T *dq, *dk, *dp, *dv;
  float *dc0, *out;
  CHECK(cudaMalloc(&dq, q.size() * sizeof(T)));
  CHECK(cudaMalloc(&dk, k.size() * sizeof(T)));
  CHECK(cudaMalloc(&dp, p.size() * sizeof(T)));
  CHECK(cudaMalloc(&dv, v.size() * sizeof(T)));
  CHECK(cudaMalloc(&dc0, c0.size() * 4));
  const size_t n = kM * kN;  // = kM * kD
  CHECK(cudaMalloc(&out, 5 * n * 4));
  CHECK(cudaMemset(out, 0xff, 5 * n * 4));  // NaN: every element must be written
  CHECK(cudaMemcpy(dq, q.data(), q.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dk, k.data(), k.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dp, p.data(), p.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dv, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dc0, c0.data(), c0.size() * 4, cudaMemcpyHostToDevice));
  const int smem = 2 * kM * 128 + 4 * kN * 128 + 1024;
  CHECK(cudaFuncSetAttribute(Probe<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  Probe<T><<<1, 128, smem>>>(dq, dk, dp, dv, dc0, out, out + n, out + 2 * n, out + 3 * n, out + 4 * n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> h(5 * n);
  CHECK(cudaMemcpy(h.data(), out, 5 * n * 4, cudaMemcpyDeviceToHost));
  std::vector<float> s_wg(h.begin(), h.begin() + n), s_mma(h.begin() + n, h.begin() + 2 * n),
      st_mma(h.begin() + 2 * n, h.begin() + 3 * n), o_wg(h.begin() + 3 * n, h.begin() + 4 * n),
      o_mma(h.begin() + 4 * n, h.end());
  size_t nan = 0;
  for (float x : h) nan += std::isnan(x);
  // float64 reference of S, to show the rounding is real (nonzero error) and the same.
  double ref_err = 0;
  for (int r = 0; r < kM; ++r)
    for (int c = 0; c < kN; ++c) {
      double acc = 0;
      for (int j = 0; j < kD; ++j) acc += double{static_cast<float>(q[r * kD + j])} * static_cast<float>(k[c * kD + j]);
      ref_err = std::fmax(ref_err, std::fabs(acc - s_wg[r * kN + c]));
    }
  double d1, d2, d3;
  const size_t n1 = Differ(s_wg, s_mma, &d1), n2 = Differ(s_mma, st_mma, &d2), n3 = Differ(o_wg, o_mma, &d3);
  std::printf(
      "%s spread 2^+-%d trial %d: S wgmma vs mma.sync %zu/%zu differ (max %.3g); S mma.sync vs S^T mma.sync %zu "
      "differ (max %.3g); P V wgmma(RS) vs mma.sync %zu differ (max %.3g); |S - float64| max %.3g; NaN left %zu\n",
      name, spread, trial, n1, n, d1, n2, d2, n3, d3, ref_err, nan);
  cudaFree(dq), cudaFree(dk), cudaFree(dp), cudaFree(dv), cudaFree(dc0), cudaFree(out);
}

}  // namespace

int main() {
  for (int trial = 0; trial < 4; ++trial) {
    Trial<__nv_bfloat16>("bf16", 12, trial);
    Trial<__nv_bfloat16>("bf16", 2, trial);
    Trial<__half>("fp16", 3, trial);
  }
  return 0;
}
