// Template bodies of launch.h: pick the kernel instance, raise its shared-memory limit once
// per device, launch, check. Included by the per-head_dim .cu files only.
#ifndef SPLITKV_CUDA_ATTENTION_LAUNCH_CUH_
#define SPLITKV_CUDA_ATTENTION_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/splitkv/cuda/attention_kernel.cuh"
#include "cc/splitkv/cuda/decode_kernel.cuh"
#include "cc/splitkv/cuda/kv_source.cuh"
#include "cc/splitkv/cuda/launch.h"

namespace splitkv::cuda {

template <int kHeadDim>
using DecodeShape = KernelShape<kHeadDim, 1, DecodeBlockKeys(kHeadDim), DecodeStages(kHeadDim)>;
template <int kHeadDim>
using PrefillShape = KernelShape<kHeadDim, 4, PrefillBlockKeys(kHeadDim), 2>;

// One kernel instance (a CTA of kThreads, a grid of tiles x splits, kSmemBytes of dynamic
// shared memory, opted in per device: launch.h EnsureSharedMemory).
template <auto kKernel, size_t kSmemBytes>
struct KernelLaunch {
  template <class KvParams, class... More>
  static void Launch(const AttentionKernelParams& params, const KvParams& kv, int64_t num_tiles, cudaStream_t stream,
                     const char* op, const More&... more) {
    EnsureSharedMemory<kKernel, kSmemBytes>(op);
    const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(params.num_splits));
    LaunchKernel(kKernel, grid, kThreads, kSmemBytes, stream, op, params, kv, more...);
  }

  static int ResidentCtasPerSm(const char* op) {
    EnsureSharedMemory<kKernel, kSmemBytes>(op);
    int ctas = 0;
    CheckCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kKernel, kThreads, kSmemBytes), op);
    return ctas;
  }
};

// The mma.sync kernel (attention_kernel.cuh), any GPU.
template <typename T, class Shape, template <typename> class KvSourceT>
using KernelInstance = KernelLaunch<AttentionKernel<T, Shape, KvSourceT>, Shape::kSmemBytes>;

// A bulk decode shape of kStages whole stages, or the K/V ring where it applies (its own
// stage count, for split and unsplit grids alike).
template <int kHeadDim, bool kPageTma, int kStages, bool kRing = kPageTma && BulkDecodeKvRing(kHeadDim)>
using BulkDecodeShapeOf =
    BulkDecodeShape<kHeadDim, DecodeBlockKeys(kHeadDim), kRing ? kBulkDecodeRingStages : kStages, kPageTma, kRing>;
template <int kHeadDim, bool kPageTma>
using BulkDecodeShapeFor = BulkDecodeShapeOf<kHeadDim, kPageTma, BulkDecodeStages(kHeadDim)>;
template <int kHeadDim, bool kPageTma>
using BulkDecodeSplitShapeFor = BulkDecodeShapeOf<kHeadDim, kPageTma, BulkDecodeSplitStages(kHeadDim)>;
// The ring exists to fit two head_dim-256 CTAs an SM (register budget sized for two).
static_assert(BulkDecodeShapeFor<256, true>::kMinBlocks == kBulkDecodeRingCtasPerSm &&
              BulkDecodeShapeFor<256, true>::kSmemBytes <= 110 * 1024);

// Decode tiles whose rows reduce in the wgmma prefill's order (decode_kernel.cuh
// kWgmmaOrder): 128-key blocks through a ring of three K-or-V parts, by tensor copies
// (kPageTma) or one row copy a thread (pages under 8 slots, ragged K/V). Batch-invariant
// calls run them, and so do the default calls' tensor-copy grids at head_dim 64 and 128 but
// for some (LaunchPagedTyped).
template <int kHeadDim, bool kPageTma, int kStages = 3>
using WgmmaOrderDecodeShape = BulkDecodeShape<kHeadDim, 128, kStages, kPageTma, true, false, false, true>;
static_assert(WgmmaOrderDecodeShape<128, true>::kMinBlocks == 2 && WgmmaOrderDecodeShape<128, false>::kMinBlocks == 2);
static_assert(WgmmaOrderDecodeShape<64, true>::kMinBlocks == 3);

// The bulk-copy decode kernel (decode_kernel.cuh), sm_90a only (DeviceRunsSm90a).
template <typename T, class Shape, template <typename> class KvSourceT = PagedKvSource>
using BulkDecodeInstance = KernelLaunch<BulkDecodeKernel<T, Shape, KvSourceT>, Shape::kSmemBytes>;

// Head_dim 64's wgmma-order tiles (below) at two CTAs an SM, a ring of 4 parts, where a grid
// holds more than 3 and at most 4 CTAs an SM: three an SM leave a thin second wave, two fill
// two. The ring's depth changes no value (the same operations in the same order): both
// shapes give the same bits, so batch-invariant calls take this rule too. H200, 32 / 8 heads,
// page 16, us in one process, batch-invariant, three an SM / two at 4-part / 6-part rings: 14
// x 8192 (448 CTAs) 84.5 / 67.7 / 68.4, 8 x 16384 (512) 86.4 / 71.7 / 74.6, 1 x 131072 (512)
// 90.1 / 75.3 / 77.8; three an SM won at 256 CTAs (4 x 16384 37.5 / 38.0 / 39.2), 384 (12 x
// 8192 54.4 / - / 66.6), 640 (20 x 8192 88.2 / 98.2 / 97.9), 768 and 1024. Default mode, the
// bench's grid: 64 x 1024 (512 tiles, one split) 47.4 us on the 64-key shape, 37.5 at two an
// SM (docs/perf_log.md 2026-12-04, session 33).
inline bool D64TwoPerSmGrid(const AttentionKernelParams& params, int64_t num_tiles, int64_t sm_count) {
  const int64_t ctas = num_tiles * params.num_splits;
  return sm_count > 0 && ctas > WgmmaOrderDecodeShape<64, true>::kMinBlocks * sm_count &&
         ctas <= kD64TwoPerSmGridMaxCtasPerSm * sm_count;
}
using WgmmaOrderTwoPerSmD64Shape = WgmmaOrderDecodeShape<64, true, 4>;
static_assert(WgmmaOrderTwoPerSmD64Shape::kMinBlocks == 2 &&
              kD64TwoPerSmGridMaxCtasPerSm == 2 * WgmmaOrderTwoPerSmD64Shape::kMinBlocks);

// The wgmma-order tiles by tensor copies: at head_dim 64 the 4-part ring on D64TwoPerSmGrid's
// grids (two an SM) and on grids of one CTA an SM, else the three-part ring (three an SM at
// 64, two at 128). Batch-invariant calls and the default routes of head_dim 64 (D64WideBlocks)
// and 128 (LaunchPagedTyped) launch through here.
template <typename T, int kHeadDim>
void LaunchWgmmaOrderTma(const AttentionKernelParams& params, const PagedKvParams& kv, const PagedKvMaps& maps,
                         int64_t num_tiles, int64_t sm_count, cudaStream_t stream, const char* op) {
  if constexpr (kHeadDim == 64) {
    // At most one CTA an SM: a ring of 4 parts. A block's S runs beside the previous block's
    // P V (decode_kernel.cuh), so its K must land about half a block after the three-part ring
    // issues it; four parts issue it a block earlier. Same values either way. H200, batch-
    // invariant, 32 / 8 heads, page 16, us, three parts / four: 1 x 32768 29.1 / 28.6, 8 x
    // 4096 27.6 / 27.1 (docs/perf_log.md session 43). Head_dim 128 stays on three parts (its
    // calls pass no SM count, backend_cuda.cu): four parts there (branch
    // exp/decode-s-ahead-d128-ring4) ran only on an H100, level to 1.5 % slower (session 44).
    const bool one_cta_an_sm = sm_count > 0 && num_tiles * params.num_splits <= sm_count;
    if (one_cta_an_sm || D64TwoPerSmGrid(params, num_tiles, sm_count)) {
      return BulkDecodeInstance<T, WgmmaOrderTwoPerSmD64Shape>::Launch(params, kv, num_tiles, stream, op, maps);
    }
  }
  BulkDecodeInstance<T, WgmmaOrderDecodeShape<kHeadDim, true>>::Launch(params, kv, num_tiles, stream, op, maps);
}

// A split grid of at most one wave of the 2-stage decode CTAs (`split_workers` of them fit
// the device at once): its CTAs are short, so the 2-stage shapes run it (tile_config.h).
inline bool OneWaveSplitGrid(const AttentionKernelParams& params, int64_t num_tiles, int64_t split_workers) {
  return params.num_splits > 1 && num_tiles * params.num_splits <= split_workers;
}

// Head_dim 128's paged decode by tensor copies (16-bit K/V, not batch-invariant) runs the
// wgmma-order tiles too, except on one-wave split grids (the 2-stage split shape's short CTAs,
// three an SM): 128-key blocks through the three-part ring, two CTAs an SM like the bulk
// shape's three stages of 64-key blocks, with half its blocks, barriers and softmax
// reductions. H100, 32 / 8 heads, us, bulk / wgmma-order, two processes each, alternated:
// page 16, 64 x 1024 91.8 / 90.3, 64 x 2048 177.2 / 174.5, 64 x 4096 348.2 / 342.9, 32 x 8192
// 347.8 / 342.2, 256 x 1024 344.0 / 340.8, 256 x 2048 812.4 / 804.8; page 64 92.2 / 90.6,
// 177.9 / 174.8, 347.0 / 343.0, 344.5 / 341.0, 344.1 / 340.2, 816.2 / 802.0 (docs/perf_log.md
// 2026-12-06, session 45). The split rules of the planner (split_plan.h wave_split_workers,
// the 64-key split price) were measured on the bulk shape and not re-timed since.
//
// Head_dim 64's paged decode by tensor copies (16-bit K/V, not batch-invariant) runs the
// wgmma-order tiles (128-key blocks through a K/V ring: half the blocks, barriers and softmax
// reductions of the 64-key shape; both fit 3 CTAs an SM, at 168 registers) except on one-wave
// split grids, where the 2-stage split shape's short CTAs won, and on grids of more than 2 and
// at most 3 CTAs an SM, where the 64-key shape won at 2.4 and 2.9 (grids of 3-4 an SM run the
// 128-key tiles at two an SM: LaunchWgmmaOrderTma). H200, 32 / 8
// heads, page 16, us in one process, 64-key / 128-key shape at the same split count: 32 x
// 8192 (256 CTAs) 137.4 / 125.0, 32 x 32768 525.2 / 479.5; 40 x 8192 (320) 158.7 / 162.5, 48
// x 4096 (384) 97.4 / 98.1, 48 x 16384 368.0 / 372.0; 64 x 4096 at 2 splits (1024) 140.2 /
// 135.4, 64 x 16384 at 4 512.1 / 497.3, 80 x 8192 (640) 333.5 / 321.6, 128 x 4096 262.6 /
// 256.8, 192 x 8192 721.9 / 715.3 (docs/perf_log.md 2026-12-04, session 32).
inline bool D64WideBlocks(const AttentionKernelParams& params, int64_t num_tiles, int64_t split_workers,
                          int64_t sm_count) {
  if (OneWaveSplitGrid(params, num_tiles, split_workers)) return false;
  const int64_t ctas = num_tiles * params.num_splits;
  return ctas <= 2 * sm_count || ctas > 3 * sm_count;
}

template <typename T, int kHeadDim, bool kPageTma, template <typename> class KvSourceT = PagedKvSource>
void LaunchBulkDecode(const AttentionKernelParams& params, const typename KvSourceT<T>::Params& kv,
                      const PagedKvMaps& maps, int64_t num_tiles, int64_t split_workers, cudaStream_t stream,
                      const char* op) {
  // Split grids have short CTAs: 2 stages fit a third on each SM (tile_config.h). A split
  // grid of more than one wave of those (a forced num_splits at a large batch) has long CTAs
  // and runs 3 stages, as unsplit: 64 x 4096 at 2 forced splits 3.97 -> 4.04 TB/s (4 splits
  // 4.04 -> 4.03) on the H200.
  if (OneWaveSplitGrid(params, num_tiles, split_workers)) {
    return BulkDecodeInstance<T, BulkDecodeSplitShapeFor<kHeadDim, kPageTma>, KvSourceT>::Launch(
        params, kv, num_tiles, stream, op, maps);
  }
  BulkDecodeInstance<T, BulkDecodeShapeFor<kHeadDim, kPageTma>, KvSourceT>::Launch(params, kv, num_tiles, stream, op,
                                                                                   maps);
}

// The bulk decode kernel over an fp8 cache: tensor copies of the cache's bytes, converted to
// float16 in registers (decode_kernel.cuh Fp8Frags). Split grids of at most one wave of
// 2-stage CTAs at head_dim 128 whose tiles hold at most 8 query rows (a decode step at a group
// of up to 8) run keys as the mma's rows at 2 stages (3 fit an SM: 168 registers, 32 bytes
// of spill); every other grid the query rows as the mma's rows at 3 stages. Head_dim 64 has
// its own shapes (Fp8KeyRowsD64Shape and below). H200, fp8 us, one
// call each (docs/perf_log.md 2026-12-02): keys as rows at 3 -> 2 stages 1 x 32768 25.6 ->
// 24.7, 4 x 8192 25.3 -> 24.3, 16 x 4096 41.3 -> 39.2, 16 x 8192 73.6 -> 69.5, 1 x 131072
// 73.8 -> 70.3 (query rows, 3 stages: 26.5, 26.1, 40.8, 70.5, 71.3); unsplit 64 x 4096 query
// rows 133.9, keys as rows 134.3 (3 stages) and 158.3 (2).
template <int kHeadDim, bool kKeyRows, int kStages = Fp8BulkDecodeStages(kHeadDim)>
using Fp8BulkDecodeShape = BulkDecodeShape<kHeadDim, Fp8DecodeBlockKeys(kHeadDim), kStages,
                                           true, false, true, kKeyRows>;
using Fp8KeyRowsSplitShape = Fp8BulkDecodeShape<128, true, 2>;
// Head_dim 64, tiles of at most 8 rows (tile_config.h kFp8D64KeyRowsCtasPerSm): keys as rows
// at 2 stages, four CTAs an SM, or 256-key blocks at 3 stages (two CTAs an SM, all that
// their grids of at most 2 CTAs an SM use: the second block is requested with the first).
// H100, fp8 ms, 2 -> 3 stages, alternated (docs/perf_log.md 2026-12-06, session 50): 256-key
// 1 x 32768 0.0187 -> 0.0178 (page 64 0.0183 -> 0.0178), 1 x 131072 level; the 128-key
// shape at 3 stages lost 2-3.6 % (24 x 4096 0.0408 -> 0.0418, 64 x 4096 0.0931 -> 0.0950).
using Fp8KeyRowsD64Shape = BulkDecodeShape<64, Fp8DecodeBlockKeys(64), 2, true, false, true, true, false,
                                           kFp8D64KeyRowsCtasPerSm>;
using Fp8KeyRowsD64WideShape = BulkDecodeShape<64, kFp8D64WideBlockKeys, 3, true, false, true, true>;
static_assert(Fp8KeyRowsD64Shape::kMinBlocks == kFp8D64KeyRowsCtasPerSm && Fp8KeyRowsD64WideShape::kMinBlocks == 2 &&
              Fp8KeyRowsD64Shape::kKeyRowsMaxRows == kFp8D64KeyRowsMaxRows);
// Its tiles of more than 8 rows: the query rows at 2 stages, three CTAs an SM on grids of at
// most three an SM (the planner's count for them: ResidentCtasPerSm), else four an SM
// (tile_config.h kFp8D64QueryRowsCtasPerSm).
using Fp8QueryRowsD64Shape = BulkDecodeShape<64, Fp8DecodeBlockKeys(64), 2, true, false, true, false, false,
                                             kFp8D64QueryRowsCtasPerSm>;
using Fp8QueryRowsD64SplitShape = Fp8BulkDecodeShape<64, false, 2>;
static_assert(Fp8QueryRowsD64Shape::kMinBlocks == kFp8D64QueryRowsCtasPerSm &&
              Fp8QueryRowsD64SplitShape::kMinBlocks == 3 && Fp8QueryRowsD64SplitShape::kRowBytes == 64);
static_assert(Fp8BulkDecodeShape<128, false>::kMinBlocks == 2 &&
              Fp8BulkDecodeShape<256, false>::kMinBlocks == kFp8D256DecodeCtasPerSm);
static_assert(Fp8KeyRowsSplitShape::kMinBlocks == 3);

template <typename T, int kHeadDim>
void LaunchFp8BulkDecode(const AttentionKernelParams& params, const PagedKvParams& kv, const PagedKvMaps& maps,
                         int64_t num_tiles, int64_t split_workers, int64_t sm_count, cudaStream_t stream,
                         const char* op) {
  if constexpr (kHeadDim == 64) {
    const int64_t ctas = num_tiles * params.num_splits;
    if (Fp8D64KeyRowsTile(kHeadDim, true, params.max_tile_rows)) {
      if (ctas <= kFp8D64WideBlocksMaxCtasPerSm * sm_count) {
        return BulkDecodeInstance<T, Fp8KeyRowsD64WideShape>::Launch(params, kv, num_tiles, stream, op, maps);
      }
      return BulkDecodeInstance<T, Fp8KeyRowsD64Shape>::Launch(params, kv, num_tiles, stream, op, maps);
    }
    if (ctas <= Fp8QueryRowsD64SplitShape::kMinBlocks * sm_count) {
      return BulkDecodeInstance<T, Fp8QueryRowsD64SplitShape>::Launch(params, kv, num_tiles, stream, op, maps);
    }
    return BulkDecodeInstance<T, Fp8QueryRowsD64Shape>::Launch(params, kv, num_tiles, stream, op, maps);
  } else {
    if constexpr (kHeadDim == 128) {
      if (params.max_tile_rows <= Fp8KeyRowsSplitShape::kKeyRowsMaxRows &&
          OneWaveSplitGrid(params, num_tiles, split_workers)) {
        return BulkDecodeInstance<T, Fp8KeyRowsSplitShape>::Launch(params, kv, num_tiles, stream, op, maps);
      }
    }
    BulkDecodeInstance<T, Fp8BulkDecodeShape<kHeadDim, false>>::Launch(params, kv, num_tiles, stream, op, maps);
  }
}

template <typename T, int kHeadDim>
void LaunchPagedTyped(TileKind kind, const AttentionKernelParams& params, const PagedKvParams& kv,
                      const PagedKvMaps& maps, int64_t num_tiles, int64_t split_workers, int64_t sm_count,
                      cudaStream_t stream, const char* op) {
  if (params.kv_fp8) {  // an fp8 cache: the sm_90 decode kernel where its tensor maps apply, else
    if (kind == TileKind::kDecode) {  // the mma.sync kernel, which dequantises as it loads
      if constexpr (kHeadDim % 64 == 0) {
        if (maps.box_rows > 0 && DeviceRunsSm90a(op)) {
          return LaunchFp8BulkDecode<T, kHeadDim>(params, kv, maps, num_tiles, split_workers, sm_count, stream, op);
        }
      }
      return KernelInstance<T, DecodeShape<kHeadDim>, PagedFp8KvSource>::Launch(params, kv, num_tiles, stream, op);
    }
    return KernelInstance<T, PrefillShape<kHeadDim>, PagedFp8KvSource>::Launch(params, kv, num_tiles, stream, op);
  }
  if (kind == TileKind::kDecode) {
    if (params.kv_vec && DeviceRunsSm90a(op)) {
      if constexpr (kHeadDim <= 128) {
        if (params.invariant_split_keys > 0) {  // backend_cuda.cu WgmmaOrderFamily
          if (maps.box_rows > 0) {
            return LaunchWgmmaOrderTma<T, kHeadDim>(params, kv, maps, num_tiles, sm_count, stream, op);
          }
          return BulkDecodeInstance<T, WgmmaOrderDecodeShape<kHeadDim, false>>::Launch(params, kv, num_tiles, stream,
                                                                                     op, maps);
        }
      }
      if constexpr (kHeadDim == 64) {
        if (maps.box_rows > 0 && D64WideBlocks(params, num_tiles, split_workers, sm_count)) {
          return LaunchWgmmaOrderTma<T, 64>(params, kv, maps, num_tiles, sm_count, stream, op);
        }
      }
      if constexpr (kHeadDim == 128) {
        if (maps.box_rows > 0) {
          if (!OneWaveSplitGrid(params, num_tiles, split_workers)) {
            return LaunchWgmmaOrderTma<T, 128>(params, kv, maps, num_tiles, sm_count, stream, op);
          }
          // One-wave split grids only: the 3-stage shape by tensor copies is never launched
          // at 128, so it is not compiled either.
          return BulkDecodeInstance<T, BulkDecodeSplitShapeFor<128, true>>::Launch(params, kv, num_tiles, stream, op,
                                                                                    maps);
        }
      }
      if constexpr (kHeadDim % 64 == 0 && kHeadDim != 128) {
        if (maps.box_rows > 0) {
          return LaunchBulkDecode<T, kHeadDim, true>(params, kv, maps, num_tiles, split_workers, stream, op);
        }
      }
      return LaunchBulkDecode<T, kHeadDim, false>(params, kv, maps, num_tiles, split_workers, stream, op);
    }
    KernelInstance<T, DecodeShape<kHeadDim>, PagedKvSource>::Launch(params, kv, num_tiles, stream, op);
  } else {
    KernelInstance<T, PrefillShape<kHeadDim>, PagedKvSource>::Launch(params, kv, num_tiles, stream, op);
  }
}

template <int kHeadDim>
void LaunchPaged(DType dtype, TileKind kind, const AttentionKernelParams& params, const PagedKvParams& kv,
                 const PagedKvMaps& maps, int64_t num_tiles, int64_t split_workers, int64_t sm_count,
                 cudaStream_t stream, const char* op) {
  if (dtype == DType::kBFloat16) {
    LaunchPagedTyped<__nv_bfloat16, kHeadDim>(kind, params, kv, maps, num_tiles, split_workers, sm_count, stream,
                                              op);
  } else {
    LaunchPagedTyped<__half, kHeadDim>(kind, params, kv, maps, num_tiles, split_workers, sm_count, stream, op);
  }
}

// Decode tiles of a ragged call come only from batch-invariant mode (tile_config.h
// InvariantTile): on sm_90 the paged decode kernel with row copies, elsewhere the mma.sync
// kernel's decode tiles, the same kernels as the paged calls of that mode.
template <typename T, int kHeadDim>
void LaunchRaggedTyped(TileKind kind, const AttentionKernelParams& params, const RaggedKvParams& kv, int64_t num_tiles,
                       int64_t split_workers, cudaStream_t stream, const char* op) {
  if (kind == TileKind::kDecode) {
    if (params.kv_vec && DeviceRunsSm90a(op)) {
      if constexpr (kHeadDim <= 128) {
        if (params.invariant_split_keys > 0) {  // backend_cuda.cu WgmmaOrderFamily
          return BulkDecodeInstance<T, WgmmaOrderDecodeShape<kHeadDim, false>, RaggedKvSource>::Launch(
              params, kv, num_tiles, stream, op, PagedKvMaps{});
        }
      }
      return LaunchBulkDecode<T, kHeadDim, false, RaggedKvSource>(params, kv, PagedKvMaps{}, num_tiles, split_workers,
                                                                  stream, op);
    }
    return KernelInstance<T, DecodeShape<kHeadDim>, RaggedKvSource>::Launch(params, kv, num_tiles, stream, op);
  }
  KernelInstance<T, PrefillShape<kHeadDim>, RaggedKvSource>::Launch(params, kv, num_tiles, stream, op);
}

template <int kHeadDim>
void LaunchRagged(DType dtype, TileKind kind, const AttentionKernelParams& params, const RaggedKvParams& kv,
                  int64_t num_tiles, int64_t split_workers, cudaStream_t stream, const char* op) {
  // An fp8 k/v the wgmma prefill did not take through its 16-bit copy (prefill_sm90.h): the
  // mma.sync kernel's prefill tiles, which dequantise as they load (batch-invariant fp8 calls
  // run them too, paged and ragged alike: tile_config.h InvariantTile).
  if (params.kv_fp8) {
    if (dtype == DType::kBFloat16) {
      return KernelInstance<__nv_bfloat16, PrefillShape<kHeadDim>, RaggedFp8KvSource>::Launch(params, kv, num_tiles,
                                                                                               stream, op);
    }
    return KernelInstance<__half, PrefillShape<kHeadDim>, RaggedFp8KvSource>::Launch(params, kv, num_tiles, stream, op);
  }
  if (dtype == DType::kBFloat16) {
    LaunchRaggedTyped<__nv_bfloat16, kHeadDim>(kind, params, kv, num_tiles, split_workers, stream, op);
  } else {
    LaunchRaggedTyped<__half, kHeadDim>(kind, params, kv, num_tiles, split_workers, stream, op);
  }
}

template <int kHeadDim>
int ResidentCtasPerSm(TileKind kind, bool kv_fp8, int64_t max_tile_rows, const char* op) {
  if (kind == TileKind::kDecode) {
    // Resident workers: the kernel a split grid of an aligned cache runs (strided caches,
    // rare, run the cp.async kernel with these workers). The launch runs 2 stages for split
    // grids of at most these; the planner fills fewer (Traits, DecodeFillCtasPerSm). An fp8
    // cache at head_dim 64: tiles of at most 8 rows run keys as rows, 4 an SM (the 256-key
    // blocks of grids within 2 an SM are never the planner's count); larger tiles the split
    // shape's 3 an SM (168 registers). At 128 its split grids run keys as rows, 3 an SM like
    // the 16-bit split shape, and 256 is left on the 16-bit count (not measured).
    if (DeviceRunsSm90a(op)) {
      if constexpr (kHeadDim == 64) {
        if (Fp8D64KeyRowsTile(kHeadDim, kv_fp8, max_tile_rows)) {
          return BulkDecodeInstance<__nv_bfloat16, Fp8KeyRowsD64Shape>::ResidentCtasPerSm(op);
        }
        if (kv_fp8) return BulkDecodeInstance<__nv_bfloat16, Fp8QueryRowsD64SplitShape>::ResidentCtasPerSm(op);
      }
      return BulkDecodeInstance<__nv_bfloat16, BulkDecodeSplitShapeFor<kHeadDim, false>>::ResidentCtasPerSm(op);
    }
    return KernelInstance<__nv_bfloat16, DecodeShape<kHeadDim>, PagedKvSource>::ResidentCtasPerSm(op);
  }
  return KernelInstance<__nv_bfloat16, PrefillShape<kHeadDim>, PagedKvSource>::ResidentCtasPerSm(op);
}

#define SPLITKV_INSTANTIATE_HEAD_DIM(D)                                                                            \
  template void LaunchPaged<D>(DType, TileKind, const AttentionKernelParams&, const PagedKvParams&,                \
                               const PagedKvMaps&, int64_t, int64_t, int64_t, cudaStream_t, const char*);         \
  template void LaunchRagged<D>(DType, TileKind, const AttentionKernelParams&, const RaggedKvParams&, int64_t,      \
                                int64_t, cudaStream_t, const char*);                                              \
  template int ResidentCtasPerSm<D>(TileKind, bool, int64_t, const char*);

}  // namespace splitkv::cuda

#endif  // SPLITKV_CUDA_ATTENTION_LAUNCH_CUH_
