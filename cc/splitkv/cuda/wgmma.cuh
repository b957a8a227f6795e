// Hopper-only PTX (sm_90a) for the prefill kernel of prefill_sm90.cuh: shared-memory matrix
// descriptors for wgmma, wgmma m64n128k16 and m64n64k16 (fp32 accumulate), setmaxnreg and
// named barriers (the mbarriers and TMA copies it shares with the decode kernel are in
// ptx.cuh). Everything here compiles to nothing unless SPLITKV_SM90_DEVICE is 1, so the
// sm_80 pass of the same translation unit still builds; the host launches the kernel only on
// a compute capability 9.0 device.
#ifndef SPLITKV_CUDA_WGMMA_CUH_
#define SPLITKV_CUDA_WGMMA_CUH_

#include <cuda.h>  // CUtensorMap (a plain struct; no driver library is linked)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SPLITKV_SM90_DEVICE 1
#else
#define SPLITKV_SM90_DEVICE 0
#endif

namespace splitkv::cuda::sm90 {

#if SPLITKV_SM90_DEVICE

// A wgmma shared-memory descriptor for a 128-byte-swizzled operand whose swizzle atoms (8
// rows of 128 bytes) are 1024-byte aligned. Byte offsets are stored >> 4.
//   K-major (rows of 64 contiguous 16-bit elements along K): `stride_bytes` steps between
//   8-row groups; `leading_bytes` is unused while an instruction's K (16) stays in one atom.
//   MN-major (rows along K, 64 contiguous elements along N): `leading_bytes` steps to the
//   next 64 columns of N, `stride_bytes` to the next 8 rows of K.
__device__ __forceinline__ uint64_t Desc128B(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr & 0x3ffff) >> 4);
  d |= static_cast<uint64_t>((leading_bytes & 0x3ffff) >> 4) << 16;
  d |= static_cast<uint64_t>((stride_bytes & 0x3ffff) >> 4) << 32;
  d |= uint64_t{1} << 62;  // 128-byte swizzle
  return d;
}

// The descriptor of the operand `bytes` further into shared memory. The start address is the
// low field (bits 0-13, in 16-byte units) and shared memory (< 256 KiB) never carries out of
// it, so only the low word changes: one 32-bit add where Desc128B rebuilds every field (per
// k-step and stage, ~100 uniform-datapath instructions a block in the prefill loop).
__device__ __forceinline__ uint64_t DescAdvance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xffffffff00000000ull) | lo;
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins accumulator registers in program order around the asynchronous wgmma: reads after a
// wait and writes before an issue cannot be moved across it by the compiler.
template <int N>
__device__ __forceinline__ void FenceRegs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int M, int N>
__device__ __forceinline__ void FenceRegs(uint32_t (&d)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) asm volatile("" : "+r"(d[i][j])::"memory");
  }
}

// The accumulator operands of a wgmma: 32 fp32 registers a thread for an n64 shape, 64 for n128.
// C(x) is the constraint: SPLITKV_RW ("+f": d is accumulated into) or SPLITKV_W ("=f": d is
// only written, so its old values are not inputs).
#define SPLITKV_RW(x) "+f"(x)
#define SPLITKV_W(x) "=f"(x)
#define SPLITKV_WGMMA_D32_LIST                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SPLITKV_WGMMA_D64_LIST                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define SPLITKV_WGMMA_D32(C)                                                                                          \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]), C(d[11]),       \
      C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]),             \
      C(d[22]), C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31])
#define SPLITKV_WGMMA_D64(C)                                                                                          \
  SPLITKV_WGMMA_D32(C),                                                                                               \
      C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), C(d[40]), C(d[41]), C(d[42]),   \
      C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]),             \
      C(d[53]), C(d[54]), C(d[55]), C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]),             \
      C(d[63])

// d (64 x N fp32 over the warpgroup) = A (64 x 16, K-major in shared memory) *
// B (16 x N, K-major in shared memory: [n][k]) (+ d when kAccumulate), N = 128 (S of
// head_dim 64/128's 128-key blocks) or 64 (S of head_dim 256's 64-key blocks). The first
// k-step (kAccumulate false) takes d as an output only, so old accumulator values are not
// inputs.
template <typename T, bool kAccumulate>
__device__ __forceinline__ void WgmmaSS(float (&d)[64], uint64_t desc_a, uint64_t desc_b);
template <typename T, bool kAccumulate>
__device__ __forceinline__ void WgmmaSS(float (&d)[32], uint64_t desc_a, uint64_t desc_b);
// One specialisation: REGS accumulator registers of PTX shape SHAPE, DESCS the operand
// numbers of the two descriptors after them, SCALE_D "1" to accumulate (ACC true) or "0".
#define SPLITKV_WGMMA_SS(TYPE, PTX_TYPE, REGS, SHAPE, D_LIST, D_OPS, DESCS, ACC, SCALE_D, C)                          \
  template <>                                                                                                         \
  __device__ __forceinline__ void WgmmaSS<TYPE, ACC>(float (&d)[REGS], uint64_t desc_a, uint64_t desc_b) {            \
    asm volatile("wgmma.mma_async.sync.aligned." SHAPE ".f32." PTX_TYPE "." PTX_TYPE " " D_LIST ", " DESCS            \
                 ", " SCALE_D ", 1, 1, 0, 0;\n"                                                                       \
                 : D_OPS(C)                                                                                           \
                 : "l"(desc_a), "l"(desc_b));                                                                         \
  }
#define SPLITKV_WGMMA_SS_ALL(TYPE, PTX_TYPE)                                                                          \
  SPLITKV_WGMMA_SS(TYPE, PTX_TYPE, 64, "m64n128k16", SPLITKV_WGMMA_D64_LIST, SPLITKV_WGMMA_D64, "%64, %65", true,     \
                   "1", SPLITKV_RW)                                                                                   \
  SPLITKV_WGMMA_SS(TYPE, PTX_TYPE, 64, "m64n128k16", SPLITKV_WGMMA_D64_LIST, SPLITKV_WGMMA_D64, "%64, %65", false,    \
                   "0", SPLITKV_W)                                                                                    \
  SPLITKV_WGMMA_SS(TYPE, PTX_TYPE, 32, "m64n64k16", SPLITKV_WGMMA_D32_LIST, SPLITKV_WGMMA_D32, "%32, %33", true, "1", \
                   SPLITKV_RW)                                                                                        \
  SPLITKV_WGMMA_SS(TYPE, PTX_TYPE, 32, "m64n64k16", SPLITKV_WGMMA_D32_LIST, SPLITKV_WGMMA_D32, "%32, %33", false,     \
                   "0", SPLITKV_W)
SPLITKV_WGMMA_SS_ALL(__nv_bfloat16, "bf16")
SPLITKV_WGMMA_SS_ALL(__half, "f16")
#undef SPLITKV_WGMMA_SS_ALL
#undef SPLITKV_WGMMA_SS

// d (64 x N) += A (64 x 16 from registers, the mma.sync m16n8k16 A fragment per warp) *
// B (16 x N, MN-major in shared memory: [k][n], transposed by the instruction), N = 128 or
// 64 (the P V of head_dim 64, where V's 64 columns are one 128-byte swizzle row).
template <typename T>
__device__ __forceinline__ void WgmmaRS(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b);
template <typename T>
__device__ __forceinline__ void WgmmaRS(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b);
// One specialisation: A_OPS the operand numbers of A's four registers and B's descriptor.
#define SPLITKV_WGMMA_RS(TYPE, PTX_TYPE, REGS, SHAPE, D_LIST, D_OPS, A_OPS)                                           \
  template <>                                                                                                         \
  __device__ __forceinline__ void WgmmaRS<TYPE>(float (&d)[REGS], const uint32_t (&a)[4], uint64_t desc_b) {          \
    asm volatile(                                                                                                     \
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                    \
        "wgmma.mma_async.sync.aligned." SHAPE ".f32." PTX_TYPE "." PTX_TYPE " " D_LIST ", " A_OPS                     \
        ", p, 1, 1, 1;\n}\n"                                                                                          \
        : D_OPS(SPLITKV_RW)                                                                                           \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));                                                   \
  }
#define SPLITKV_WGMMA_RS_ALL(TYPE, PTX_TYPE)                                                                          \
  SPLITKV_WGMMA_RS(TYPE, PTX_TYPE, 64, "m64n128k16", SPLITKV_WGMMA_D64_LIST, SPLITKV_WGMMA_D64,                       \
                   "{%64, %65, %66, %67}, %68")                                                                       \
  SPLITKV_WGMMA_RS(TYPE, PTX_TYPE, 32, "m64n64k16", SPLITKV_WGMMA_D32_LIST, SPLITKV_WGMMA_D32,                        \
                   "{%32, %33, %34, %35}, %36")
SPLITKV_WGMMA_RS_ALL(__nv_bfloat16, "bf16")
SPLITKV_WGMMA_RS_ALL(__half, "f16")
#undef SPLITKV_WGMMA_RS_ALL
#undef SPLITKV_WGMMA_RS
#undef SPLITKV_WGMMA_D64
#undef SPLITKV_WGMMA_D32
#undef SPLITKV_WGMMA_D64_LIST
#undef SPLITKV_WGMMA_D32_LIST
#undef SPLITKV_W
#undef SPLITKV_RW

// ---- registers per warpgroup ----

template <int kRegs>
__device__ __forceinline__ void RegAlloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void RegDealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Barrier over `threads` threads (a multiple of 32) on hardware barrier `id` (not 0, which
// __syncthreads uses).
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Counts the calling threads into barrier `id` of `threads` without waiting for it.
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif  // SPLITKV_SM90_DEVICE

}  // namespace splitkv::cuda::sm90

#endif  // SPLITKV_CUDA_WGMMA_CUH_
