// The CUDA backend (backend.h): turns validated params and the launcher's plan into kernel
// params, chooses the tile kind and the head_dim instance, and enqueues one launch on the
// caller's stream. No host synchronisation, no memset, no allocation: CUDA-graph capturable.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cc/splitkv/backend.h"
#include "cc/splitkv/cuda/kernel_params.h"
#include "cc/splitkv/cuda/launch.h"
#include "cc/splitkv/cuda/prefill_sm90.h"
#include "cc/splitkv/cuda/tensor_map.h"
#include "cc/splitkv/cuda/tile_config.h"
#include "cc/splitkv/errors.h"
#include "cc/splitkv/split_plan.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv::cuda {

void CheckCuda(cudaError_t err, const char* op) {
  if (err != cudaSuccess) throw CudaError(std::string(op) + ": " + cudaGetErrorString(err));
}

namespace {

constexpr const char* kPagedOp = "paged_attention";
constexpr const char* kRaggedOp = "ragged_attention";
constexpr int64_t kInt32Max = 2147483647;

// Per device: SM count, whether it runs the sm_90a kernels, and resident CTAs of each
// (tile kind, fp8 cache or not, head_dim, keys-as-rows tile or not), read once.
struct DeviceInfo {
  int sm_count = 0;
  bool sm90a = false;
  int ctas[2][2][3][2] = {};  // [kind][kv_fp8][head_dim 64, 128, 256][Fp8D64KeyRowsTile]
};

int HeadDimIndex(int64_t head_dim) { return head_dim == 64 ? 0 : head_dim == 256 ? 2 : 1; }

int ResidentCtas(TileKind kind, int64_t head_dim, bool kv_fp8, int64_t max_tile_rows, const char* op) {
  switch (head_dim) {
    case 64: return ResidentCtasPerSm<64>(kind, kv_fp8, max_tile_rows, op);
    case 256: return ResidentCtasPerSm<256>(kind, kv_fp8, max_tile_rows, op);
    default: return ResidentCtasPerSm<128>(kind, kv_fp8, max_tile_rows, op);
  }
}

// SMs and resident CTAs an SM of a (tile kind, head_dim) on the current device.
struct DeviceWorkers {
  int sm_count;
  int ctas_per_sm;
  bool sm90a;  // DeviceRunsSm90a
};

// max_tile_rows: the most query rows a tile of the call holds (MaxTileRows).
DeviceWorkers WorkersPerDevice(TileKind kind, int64_t head_dim, bool kv_fp8, int64_t max_tile_rows, const char* op) {
  static std::mutex mutex;
  static std::vector<DeviceInfo> devices;
  int device = 0;
  CheckCuda(cudaGetDevice(&device), op);
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(devices.size()) <= device) devices.resize(device + 1);
  DeviceInfo& info = devices[device];
  if (info.sm_count == 0) {
    info.sm90a = DeviceRunsSm90a(op);  // before sm_count, which marks the entry as read
    CheckCuda(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device), op);
  }
  const bool key_rows = kind == TileKind::kDecode && Fp8D64KeyRowsTile(head_dim, kv_fp8, max_tile_rows);
  int& ctas = info.ctas[kind == TileKind::kDecode ? 0 : 1][kv_fp8 ? 1 : 0][HeadDimIndex(head_dim)][key_rows ? 1 : 0];
  if (ctas == 0) {
    ctas = ResidentCtas(kind, head_dim, kv_fp8, max_tile_rows, op);
    if (ctas == 0) {
      throw CudaError(std::string(op) + ": no CTA of the head_dim " + std::to_string(head_dim) +
                      " kernel fits on an SM of device " + std::to_string(device));
    }
  }
  return {info.sm_count, ctas, info.sm90a};
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool AllMultiplesOf8(std::initializer_list<int64_t> strides) {
  for (int64_t s : strides) {
    if (s % 8 != 0) return false;
  }
  return true;
}

void CheckFitsInt32(const char* op, const char* what, int64_t value) {
  if (value > kInt32Max) {
    throw UnsupportedError(std::string(op) + ": " + what + " too large for the cuda backend: expected at most " +
                           std::to_string(kInt32Max) + ", got " + std::to_string(value));
  }
}

// The kernels' 16-byte vector flags: q, and the K/V of each kind of call.
template <typename Params>
bool QVec(const Params& p) {
  return Aligned16(p.q) && AllMultiplesOf8({p.q_stride_token, p.q_stride_head});
}
bool KvVec(const PagedAttentionParams& p) {
  return Aligned16(p.k_cache) && Aligned16(p.v_cache) &&
         AllMultiplesOf8({p.k_stride_page, p.k_stride_head, p.k_stride_slot, p.v_stride_page, p.v_stride_head,
                          p.v_stride_slot});
}
bool KvVec(const RaggedAttentionParams& p) {
  return Aligned16(p.k) && Aligned16(p.v) &&
         AllMultiplesOf8({p.k_stride_token, p.k_stride_head, p.v_stride_token, p.v_stride_head});
}

// The fields both operations fill the same way.
template <typename Params>
AttentionKernelParams CommonParams(const Params& p, const SplitPlan& plan, int64_t q_tile_tokens, int64_t max_q_len) {
  AttentionKernelParams k;
  k.q = p.q;
  k.q_stride_token = p.q_stride_token;
  k.q_stride_head = p.q_stride_head;
  k.out = p.out;
  k.out_stride_token = p.out_stride_token;
  k.out_stride_head = p.out_stride_head;
  k.lse = p.lse;
  k.num_kv_heads = static_cast<int32_t>(p.num_kv_heads);
  k.group_size = static_cast<int32_t>(p.num_qo_heads / p.num_kv_heads);
  k.q_tile_tokens = static_cast<int32_t>(q_tile_tokens);
  k.max_tile_rows = static_cast<int32_t>(MaxTileRows(k.group_size, q_tile_tokens, max_q_len));
  k.max_q_tiles = static_cast<int32_t>(plan.max_q_tiles);
  k.num_splits = static_cast<int32_t>(plan.num_splits);
  k.invariant_split_keys = static_cast<int32_t>(plan.invariant_split_keys);
  k.layout_shape = LayoutShape{p.total_q, p.num_qo_heads, p.head_dim};
  k.causal = p.options.causal;
  k.window_left = p.options.window_left;
  k.logits_soft_cap = p.options.logits_soft_cap;
  k.sm_scale = p.options.sm_scale;
  k.sinks = p.options.sinks;
  k.kv_fp8 = p.kv_storage.fp8_e4m3;
  k.k_scale = p.kv_storage.k_scale;
  k.v_scale = p.kv_storage.v_scale;
  k.k_scales = p.kv_storage.k_scales;
  k.v_scales = p.kv_storage.v_scales;
  auto* base = static_cast<uint8_t*>(p.workspace.data);
  k.counters = reinterpret_cast<uint32_t*>(base + plan.layout.counter_offset);
  k.stats = reinterpret_cast<float*>(base + plan.layout.softmax_offset);
  k.partials = reinterpret_cast<float*>(base + plan.layout.scratch_offset);
  k.status = reinterpret_cast<uint32_t*>(base + kStatusOffset);
  k.status_host = p.workspace.status_host;
  k.q_vec = QVec(p);
  k.out_vec = Aligned16(p.out) && AllMultiplesOf8({p.out_stride_token, p.out_stride_head});
  return k;
}

// The launcher sized the counter index space with Traits(); the launch must cut tiles alike.
void CheckPlanMatches(const char* op, const SplitPlan& plan, int64_t max_q_len, int64_t q_tile_tokens,
                      int64_t batch_size, int64_t num_kv_heads) {
  const int64_t max_q_tiles = CeilDiv(max_q_len > 0 ? max_q_len : 1, q_tile_tokens);
  if (plan.max_q_tiles != max_q_tiles || plan.num_tiles != batch_size * num_kv_heads * max_q_tiles) {
    throw InvalidArgument(std::string(op) + ": plan does not match the cuda tiles: expected max_q_tiles " +
                          std::to_string(max_q_tiles) + ", got " + std::to_string(plan.max_q_tiles) +
                          "; plan with the same params");
  }
  CheckFitsInt32(op, "num_tiles (batch_size * num_kv_heads * max_q_tiles)", plan.num_tiles);
  if (plan.num_splits > 65535) {
    throw UnsupportedError(std::string(op) + ": num_splits too large for the cuda backend: expected at most 65535, got " +
                           std::to_string(plan.num_splits));
  }
}

// The tiles of a call: Traits() (which sizes the plan) and the launches must agree.
TileChoice TileFor(bool batch_invariant, int64_t group_size, int64_t max_q_len, bool kv_fp8, const char* op) {
  // Batch-invariant calls run the sm_90 decode kernel where it reads their K/V (not fp8).
  return batch_invariant ? InvariantTile(group_size, DeviceRunsSm90a(op) && !kv_fp8)
                         : ChooseTile(group_size, max_q_len);
}

// Batch-invariant calls whose rows reduce in the wgmma prefill's order (tile_config.h
// InvariantTile): decode tiles on sm_90 over 16-bit, 16-byte-aligned K/V at head_dim 64 or
// 128. Their decode tiles run the decode kernel's wgmma-order path, and their prefill-sized
// calls the wgmma kernel when it serves them (the same bits either way).
bool WgmmaOrderFamily(const TileChoice& tile, int64_t head_dim, bool kv_fp8, bool kv_vec, const char* op) {
  return tile.kind == TileKind::kDecode && head_dim <= 128 && !kv_fp8 && kv_vec && DeviceRunsSm90a(op);
}

// Whether a call tries the wgmma kernel: every prefill tile by default; batch-invariant
// calls of the wgmma-order family whose rows outnumber a decode tile's.
bool TriesWgmma(bool invariant, const TileChoice& tile, int64_t group, int64_t max_q_len, int64_t head_dim,
                bool kv_fp8, bool kv_vec, const char* op) {
  if (!invariant) return tile.kind == TileKind::kPrefill;
  return group * std::max<int64_t>(max_q_len, 1) > kDecodeRows &&
         WgmmaOrderFamily(tile, head_dim, kv_fp8, kv_vec, op);
}

// A batch-invariant call planned to run its tiles' splits in the wgmma kernel's CTAs (no
// partials in the workspace: InvariantSplitsInCta) that the kernel declined at launch (a
// tensor map the driver refused): the split kernels would need the partials, so the call is
// refused, as the planner refuses a workspace too small, before anything is enqueued.
void RefuseUnservedTaskSplits(const char* op, const SplitPlan& plan, const LayoutShape& shape,
                              int64_t workspace_bytes) {
  if (plan.invariant_task_splits > 1) {
    ThrowInvariantTaskSplitsRefused(op, shape, plan.num_tiles, plan.invariant_task_splits, plan.invariant_split_keys,
                                    workspace_bytes);
  }
}

// InvariantSplitsInCta: the batch-invariant calls TriesWgmma sends to the wgmma kernel
// (whose own checks, `serves`, follow: prefill_sm90.h), with the vector flags computed once.
template <typename Params, typename Serves>
bool InvariantInCta(const Params& p, int64_t max_q_len, const char* op, Serves serves) {
  if (!p.options.batch_invariant) return false;
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const bool kv_fp8 = p.kv_storage.fp8_e4m3, kv_vec = KvVec(p);
  const TileChoice tile = TileFor(true, group, max_q_len, kv_fp8, op);
  return TriesWgmma(true, tile, group, max_q_len, p.head_dim, kv_fp8, kv_vec, op) && serves(p, QVec(p), kv_vec, op);
}

}  // namespace

bool InvariantSplitsInCta(const PagedAttentionParams& p) {
  return InvariantInCta(p, p.max_q_len, kPagedOp, PagedPrefillSm90ServesInvariant);
}

bool InvariantSplitsInCta(const RaggedAttentionParams& p) {
  const int64_t max_q = p.max_q_len > 0 ? p.max_q_len : p.total_q;
  return InvariantInCta(p, max_q, kRaggedOp, RaggedPrefillSm90ServesInvariant);
}

bool Available() { return true; }

BackendTraits Traits(int64_t group_size, int64_t head_dim, int64_t max_q_len, void* stream, bool batch_invariant,
                     bool kv_fp8) {
  const TileChoice tile = TileFor(batch_invariant, group_size, max_q_len, kv_fp8, "splitkv");
  BackendTraits traits;
  traits.q_tile_tokens = tile.q_tile_tokens;
  const DeviceWorkers workers = WorkersPerDevice(tile.kind, head_dim, kv_fp8,
                                                 MaxTileRows(group_size, tile.q_tile_tokens, max_q_len), "splitkv");
  traits.num_workers = int64_t{workers.sm_count} * workers.ctas_per_sm;
  if (tile.kind == TileKind::kDecode && workers.sm90a) {
    traits.fill_workers =
        int64_t{workers.sm_count} * std::min<int64_t>(workers.ctas_per_sm, DecodeFillCtasPerSm(head_dim));
    traits.split_merge_blocks = DecodeSplitMergeBlocks(static_cast<int>(head_dim), kv_fp8);
    // Not at head_dim 256: its many-wave split grids won there (12 x 8192: 26 splits 206.8
    // us, one wave's 1 split 249.5; 6 x 4096 8 splits 60.9 against 2's 69.4; H200,
    // docs/perf_log.md 2026-12-02).
    traits.one_wave_splits = head_dim <= 128;
    if (!kv_fp8) {  // an fp8 block is 128 keys: a 64-key split would be half of one
      traits.short_split_keys = kDecodeShortSplitKeys;
      traits.short_split_workers = workers.sm_count;
    }
    // head_dim 64's CTAs carry half the bytes a key: a thin second wave of them idles the
    // copy engines (measured on 16-bit K/V only; split_plan.h).
    if (head_dim == 64 && !kv_fp8) {
      traits.tail_split_workers = traits.num_workers;
      // Its grids of 3-4 CTAs an SM run at two an SM (attention_launch.cuh D64TwoPerSmGrid).
      traits.tail_keep_tiles = kD64TwoPerSmGridMaxCtasPerSm * workers.sm_count;
    }
    // head_dim 128's one-split grids of 3.5 to 11 waves of long tiles: split to about 11
    // (measured on 16-bit K/V; not at the other head_dims: split_plan.h).
    if (head_dim == 128 && !kv_fp8) traits.wave_split_workers = traits.fill_workers;
    // head_dim 256's grids of up to one wave of its 2 resident CTAs an SM (the heuristic fills
    // 1): splits that fill the last resident wave (split_plan.h). Over an fp8 cache only for
    // grids past one CTA an SM, where the rule was measured faster (split_plan.h).
    if (head_dim == 256) {
      traits.fill_wave_workers =
          int64_t{workers.sm_count} * (kv_fp8 ? kFp8D256DecodeCtasPerSm : kBulkDecodeRingCtasPerSm);
      if (kv_fp8) traits.fill_wave_min_tiles = int64_t{workers.sm_count} + 1;
    }
  }
  traits.min_keys_per_split = tile.kind == TileKind::kDecode ? kDecodeMinKeysPerSplit : 256;
  traits.max_splits = tile.kind == TileKind::kDecode ? kDecodeMaxSplits : 64;
  traits.split_block_keys = tile.kind == TileKind::kDecode ? DecodeBlockKeys(static_cast<int>(head_dim))
                                                           : PrefillBlockKeys(static_cast<int>(head_dim));
  // Batch-invariant mode: no in-task splits on CUDA. A tile whose rows see one split writes
  // directly, which split_merge.cuh's merge of one non-empty split matches bit for bit.
  if (batch_invariant) traits.invariant_split_keys = kInvariantSplitKeys;
  return traits;
}

void PagedAttention(const PagedAttentionParams& p, const SplitPlan& plan) {
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const bool invariant = plan.invariant_split_keys > 0;
  const TileChoice tile = TileFor(invariant, group, p.max_q_len, p.kv_storage.fp8_e4m3, kPagedOp);
  CheckPlanMatches(kPagedOp, plan, p.max_q_len, tile.q_tile_tokens, p.batch_size, p.num_kv_heads);
  CheckFitsInt32(kPagedOp, "total_q", p.total_q);
  CheckFitsInt32(kPagedOp, "max_pages_per_seq * page_size", p.max_pages_per_seq * p.page_size);
  if (plan.num_tiles == 0) return;

  AttentionKernelParams k = CommonParams(p, plan, tile.q_tile_tokens, p.max_q_len);
  k.cu_seqlens_q = p.cu_seqlens_q;
  k.kv_offsets = p.kv_offsets;
  k.full_seq_lens = p.full_seq_lens;
  const PagedKvParams kv = PagedKvParamsOf(p);
  k.kv_vec = KvVec(p);
  // Hopper decode tiles fetch page runs through tensor maps where they apply (tensor_map.h).
  PagedKvMaps maps{};  // box_rows 0: row copies
  if (tile.kind == TileKind::kDecode && k.kv_vec && DeviceRunsSm90a(kPagedOp)) {
    maps = PagedKvMapsFor(p, DecodeBlockKeys(static_cast<int>(p.head_dim)));
  }
  auto stream = static_cast<cudaStream_t>(p.stream);
  // Hopper prefill tiles: the wgmma + TMA kernel over the cache's page maps where it serves
  // the call (prefill_sm90.h says which), else mma.sync; batch-invariant calls as TriesWgmma
  // says (the plan's decode tiles run where the kernel declines).
  if (TriesWgmma(invariant, tile, group, p.max_q_len, p.head_dim, p.kv_storage.fp8_e4m3, k.kv_vec, kPagedOp) &&
      LaunchPagedPrefillSm90(p, plan, k, kv, stream, kPagedOp)) {
    return;
  }
  RefuseUnservedTaskSplits(kPagedOp, plan, k.layout_shape, p.workspace.bytes);
  // The plan was sized by Traits() for this tile kind and head_dim: its workers are the split
  // grid's CTAs that fit on the device at once.
  const int64_t workers = plan.num_workers;
  // The SM count only head_dim 64's decode routes read (attention_launch.cuh D64WideBlocks,
  // D64TwoPerSmGrid): other calls skip the device lookup's lock.
  const int64_t sms = tile.kind == TileKind::kDecode && p.head_dim == 64
                          ? WorkersPerDevice(tile.kind, p.head_dim, p.kv_storage.fp8_e4m3, k.max_tile_rows, kPagedOp).sm_count
                          : 0;
  switch (p.head_dim) {
    case 64: return LaunchPaged<64>(p.dtype, tile.kind, k, kv, maps, plan.num_tiles, workers, sms, stream, kPagedOp);
    case 128:
      return LaunchPaged<128>(p.dtype, tile.kind, k, kv, maps, plan.num_tiles, workers, sms, stream, kPagedOp);
    case 256:
      return LaunchPaged<256>(p.dtype, tile.kind, k, kv, maps, plan.num_tiles, workers, sms, stream, kPagedOp);
    default:
      throw UnsupportedError(std::string(kPagedOp) + ": head_dim not supported on cuda: expected 64, 128 or 256, got " +
                             std::to_string(p.head_dim));
  }
}

void RaggedAttention(const RaggedAttentionParams& p, const SplitPlan& plan) {
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_q = p.max_q_len > 0 ? p.max_q_len : p.total_q;
  // Ragged calls run prefill tiles (decode tiles in batch-invariant mode on sm_90), cut with
  // the same q_tile_tokens Traits() reported.
  const bool invariant = plan.invariant_split_keys > 0;
  const TileChoice tile = TileFor(invariant, group, max_q, p.kv_storage.fp8_e4m3, kRaggedOp);
  CheckPlanMatches(kRaggedOp, plan, max_q, tile.q_tile_tokens, p.batch_size, p.num_kv_heads);
  CheckFitsInt32(kRaggedOp, "total_q", p.total_q);
  CheckFitsInt32(kRaggedOp, "total_kv", p.total_kv);
  if (plan.num_tiles == 0) return;

  AttentionKernelParams k = CommonParams(p, plan, tile.q_tile_tokens, max_q);
  k.cu_seqlens_q = p.cu_seqlens_q;
  RaggedKvParams kv;
  kv.k = p.k;
  kv.v = p.v;
  kv.k_stride_token = p.k_stride_token;
  kv.k_stride_head = p.k_stride_head;
  kv.v_stride_token = p.v_stride_token;
  kv.v_stride_head = p.v_stride_head;
  kv.cu_seqlens_kv = p.cu_seqlens_kv;
  k.kv_vec = KvVec(p);
  auto stream = static_cast<cudaStream_t>(p.stream);
  // Hopper: the wgmma + TMA kernel (prefill_sm90.h) when it serves the call, else mma.sync;
  // batch-invariant calls as TriesWgmma says (the plan's decode tiles run where it declines).
  if ((!invariant || TriesWgmma(invariant, tile, group, max_q, p.head_dim, p.kv_storage.fp8_e4m3, k.kv_vec,
                                kRaggedOp)) &&
      LaunchRaggedPrefillSm90(p, plan, k, stream, kRaggedOp)) {
    return;
  }
  RefuseUnservedTaskSplits(kRaggedOp, plan, k.layout_shape, p.workspace.bytes);
  const int64_t workers = plan.num_workers;
  switch (p.head_dim) {
    case 64: return LaunchRagged<64>(p.dtype, tile.kind, k, kv, plan.num_tiles, workers, stream, kRaggedOp);
    case 128: return LaunchRagged<128>(p.dtype, tile.kind, k, kv, plan.num_tiles, workers, stream, kRaggedOp);
    case 256: return LaunchRagged<256>(p.dtype, tile.kind, k, kv, plan.num_tiles, workers, stream, kRaggedOp);
    default:
      throw UnsupportedError(std::string(kRaggedOp) + ": head_dim not supported on cuda: expected 64, 128 or 256, got " +
                             std::to_string(p.head_dim));
  }
}

void ZeroCounterRegion(void* workspace, void* stream) {
  CheckCuda(cudaMemsetAsync(workspace, 0, kCounterRegionBytes, static_cast<cudaStream_t>(stream)),
            "reset_counter_region: cudaMemsetAsync");
}

void ReadStatusRecord(const void* workspace, void* stream, uint32_t* words) {
  const auto s = static_cast<cudaStream_t>(stream);
  CheckCuda(cudaMemcpyAsync(words, static_cast<const uint8_t*>(workspace) + kStatusOffset,
                            kStatusWords * sizeof(uint32_t), cudaMemcpyDeviceToHost, s),
            "check_workspace_status: cudaMemcpyAsync");
  CheckCuda(cudaStreamSynchronize(s), "check_workspace_status: cudaStreamSynchronize");
}

void* CreateOrderEvent() {
  cudaEvent_t event = nullptr;
  CheckCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "splitkv: cudaEventCreateWithFlags");
  return event;
}

void DestroyOrderEvent(void* event) noexcept { (void)cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

void RecordOrderEvent(void* event, void* stream) {
  CheckCuda(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
            "splitkv: cudaEventRecord");
}

void WaitOrderEvent(void* stream, void* event) {
  CheckCuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
            "splitkv: cudaStreamWaitEvent");
}

int CurrentDevice() {
  int device = 0;
  CheckCuda(cudaGetDevice(&device), "splitkv: cudaGetDevice");
  return device;
}

void SetDevice(int device) { CheckCuda(cudaSetDevice(device), "splitkv: cudaSetDevice"); }

bool StreamCapturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CheckCuda(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status), "splitkv: cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace splitkv::cuda
