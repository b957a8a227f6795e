// Thin wrappers over the PTX the kernels use: cp.async (16-byte global -> shared copies that
// bypass registers), ldmatrix (8x8 b16 tiles from shared memory into mma fragments) and
// mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate), valid on sm_80 and sm_90a; and the
// sm_90 bulk copies (plain and through a tensor map) + mbarrier used by the decode kernel.
#ifndef SPLITKV_CUDA_PTX_CUH_
#define SPLITKV_CUDA_PTX_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace splitkv::cuda {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A 32-bit load from a shared-memory address (callers that compute addresses as integers,
// e.g. by XOR with a swizzle pattern). volatile: it stays ordered after the barrier waits.
__device__ __forceinline__ uint32_t LdShared32(uint32_t smem_addr) {
  uint32_t w;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w) : "r"(smem_addr));
  return w;
}

// Copies 16 bytes; with src_bytes == 0 nothing is read and the destination is zero-filled,
// which is how out-of-range key rows become zeros (never garbage, never NaN).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(smem)), "l"(gmem),
               "r"(src_bytes));
}

// Copies 8 bytes (8-byte aligned at both ends), through L1.
__device__ __forceinline__ void CpAsync8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(SharedAddress(smem)), "l"(gmem));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem)));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem)));
}

// ---- Programmatic dependent launch (launches carry the attribute only where the sm_90a
// image runs: launch.h LaunchKernel). A kernel so launched may be scheduled before the grid
// ahead of it in the stream has completed, so it calls GridDependencyWait before its first
// global memory access, read or write (inputs, the workspace's counters, outputs): the wait
// returns once that grid has completed and its writes are visible. A no-op in a launch
// without the attribute; compiles to nothing below sm_90. The kernels never call
// griddepcontrol.launch_dependents: released after their main loop, the next grid's CTAs took
// SM slots early and slowed one-wave split grids by 4-7 % (H100, docs/perf_log.md session 46),
// so a grid after them starts as their CTAs exit.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// A load of kernel input (q, lengths, page ids, scales; anything an earlier grid may have
// written) as ld.global.ca, a weak load cached in L1 as __ldg's are (.cg, L2 only, cost the
// trace prefill ~1.8 %: H100, docs/perf_log.md session 47). Not __ldg: its ld.global.nc
// promises the data does not change while the kernel runs, which under PDL it may until
// GridDependencyWait returns, and ptxas did hoist such loads above the wait (cu_seqlens_q in 32
// decode instances, docs/perf_log.md session 46; tools/gpu/sass_pdl_check.py checks the SASS).
template <typename T>
__device__ __forceinline__ T LoadInput(const T* p) {
  return __ldca(p);
}

// ---- sm_90 bulk copies completing on an mbarrier (no tensor map). The callers dispatch to
// these only on compute capability >= 9.0; elsewhere the bodies compile to a trap.

__device__ __forceinline__ void MbarrierInit(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(bar)), "r"(count) : "memory");
#else
  __trap();
#endif
}

// Makes barrier initialisation visible to the copy engine (before the CTA-wide barrier that
// publishes it to the other threads).
__device__ __forceinline__ void FenceMbarrierInit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival that also announces `bytes` of copies that will complete on the barrier.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SharedAddress(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// One plain arrival.
__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SharedAddress(bar)) : "memory");
#else
  __trap();
#endif
}

// A suspend-time hint for MbarrierWait (ns): long enough that a waiting thread sleeps until
// the phase completes.
inline constexpr uint32_t kMbarrierSleepNs = 1000000;

// Waits until the barrier's phase with parity `parity` has completed. Without a hint
// (kSuspendHintNs = 0) each try returns after a short implementation-defined time: the
// thread spins. With one, each try suspends the thread until the phase completes or the hint
// passes: for a thread with nothing else to do (the paged prefill's producer warps, which
// wait on "empty" barriers most of their life, one on each scheduler, would otherwise take
// its issue slots from the consumer warps beside them).
template <uint32_t kSuspendHintNs = 0>
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    if constexpr (kSuspendHintNs == 0) {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(SharedAddress(bar)), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(SharedAddress(bar)), "r"(parity), "n"(kSuspendHintNs)
          : "memory");
    }
  } while (!done);
#else
  __trap();
#endif
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory by
// the copy engine; completion is counted on `bar` in bytes.
__device__ __forceinline__ void BulkCopyToShared(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          SharedAddress(smem)),
      "l"(gmem), "r"(bytes), "r"(SharedAddress(bar))
      : "memory");
#else
  __trap();
#endif
}

// A 3-D box of a tensor map (coordinates in elements, c0 innermost) into shared memory by the
// copy engine; completion is counted on `bar` in bytes.
__device__ __forceinline__ void TensorCopy3dToShared(void* smem, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                                     int32_t c1, int32_t c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(SharedAddress(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(SharedAddress(bar))
      : "memory");
#else
  __trap();
#endif
}

// An L2 cache policy for data read once: its lines are the first evicted.
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// A 4-D box of a tensor map (coordinates in elements, c0 innermost) into shared memory by the
// copy engine, with L2 cache policy `policy` (EvictFirstPolicy); completion is counted on
// `bar` in bytes (the whole box, including any part past the tensor's bounds, which arrives
// as zeros).
__device__ __forceinline__ void TensorCopy4dToShared(void* smem, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                                     int32_t c1, int32_t c2, int32_t c3, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3, %4, %5}], [%6], %7;\n" ::"r"(SharedAddress(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(SharedAddress(bar)), "l"(policy)
      : "memory");
#else
  __trap();
#endif
}

// The same 4-D box copy at the default L2 priority (data that other CTAs read again, such as
// a prefill's K/V, which every query tile of the head fetches).
__device__ __forceinline__ void TensorCopy4dToShared(void* smem, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                                     int32_t c1, int32_t c2, int32_t c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(SharedAddress(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(SharedAddress(bar))
      : "memory");
#else
  __trap();
#endif
}

// Starts fetching a tensor map (a kernel parameter) so the first copy through it waits less.
__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// Orders this thread's earlier generic-proxy shared-memory writes before later copy-engine
// (async-proxy) accesses of the same bytes.
__device__ __forceinline__ void FenceProxyAsyncShared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Orders this thread's earlier generic-proxy accesses of global memory (and those it
// acquired from other threads) before its later copy-engine (async-proxy) accesses.
__device__ __forceinline__ void FenceProxyAsyncGlobal() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// *address += v at GPU scope, relaxed (orders nothing else); returns the old value. The
// thread runs on until it uses the result.
__device__ __forceinline__ uint32_t AtomicAddRelaxedGpu(uint32_t* address, uint32_t v) {
  uint32_t old;
  asm volatile("atom.add.relaxed.gpu.global.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(address), "r"(v) : "memory");
  return old;
}

// *address += v at GPU scope with release semantics (this thread's earlier writes, and those
// a CTA barrier ordered before it, are visible to whoever acquires the new value); no result.
__device__ __forceinline__ void RedAddReleaseGpu(uint32_t* address, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(address), "r"(v) : "memory");
}

// *address at GPU scope, relaxed (a flag polled while waiting on something else).
__device__ __forceinline__ uint32_t LoadRelaxedGpu(const uint32_t* address) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(address) : "memory");
  return v;
}

// *address at GPU scope with acquire semantics.
__device__ __forceinline__ uint32_t LoadAcquireGpu(const uint32_t* address) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(address) : "memory");
  return v;
}

// The transpose of an 8 x 8 matrix of 16-bit values held as an mma fragment (lane l: row
// l / 4, columns 2 (l % 4) and + 1), returned in the same fragment layout (sm_75+).
__device__ __forceinline__ uint32_t MovMatrixTrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// 2^x on the special-function unit; subnormal results flush to 0 (a probability that small
// is 0 at 16-bit precision anyway), and 2^-inf is 0. The wgmma prefill's softmax and the
// decode kernel's wgmma-order path share it (one exponent for both: their bits must agree).
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// c += a * b for one 16x8x16 tile; a row-major, b column-major (i.e. [n][k] in memory).
template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void Mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void Mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one packed pair (the lower column in the low half), rounded to nearest.
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t PackPair<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t PackPair<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_PTX_CUH_
