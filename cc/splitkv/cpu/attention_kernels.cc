// The CPU backend's kernels: enumerates work tiles x splits as tasks on the thread pool,
// as a GPU grid would run CTAs, and dispatches on dtype. Compiled once per instruction set
// (isa.h); attention_cpu.cc picks one at run time. Index data was validated by the launcher.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <vector>

#include "cc/splitkv/cpu/attention_kernels.h"
#include "cc/splitkv/cpu/attention_tile.h"
#include "cc/splitkv/cpu/invariant_tile.h"
#include "cc/splitkv/cpu/fp8_kv.h"
#include "cc/splitkv/cpu/thread_pool.h"

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {
namespace {

// Keys of one (request, kv head) in a paged cache.
template <typename T>
struct PagedKv {
  const T* k;
  const T* v;
  const int32_t* pages;
  int64_t page_size, k_stride_page, k_stride_slot, v_stride_page, v_stride_slot;
  const T* Key(int64_t j) const { return k + pages[j / page_size] * k_stride_page + (j % page_size) * k_stride_slot; }
  const T* Value(int64_t j) const { return v + pages[j / page_size] * v_stride_page + (j % page_size) * v_stride_slot; }
};

// Keys of one (request, kv head) in packed k, v.
template <typename T>
struct RaggedKv {
  const T* k;
  const T* v;
  int64_t k_stride_token, v_stride_token;
  const T* Key(int64_t j) const { return k + j * k_stride_token; }
  const T* Value(int64_t j) const { return v + j * v_stride_token; }
};

// One task's share of a tile: the default split rule, or the batch-invariant one.
template <typename T, typename Kv>
void RunSplit(const TileInputs<T>& in, const TileRows& rows, const Kv& kv, int64_t split) {
  if (in.plan->invariant_split_keys > 0) {
    RunTileInvariant(in, rows, kv, split);
  } else {
    RunTileSplit(in, rows, kv, split);
  }
}

struct RequestTile {
  int64_t request, q_tile;
};

// Below this many multiply-adds of q.k (an upper bound: total_q x num_qo_heads x the
// longest KV x head_dim), a launch runs its tasks on the calling thread. Waking the pool's
// workers costs a futex wake and a context switch each, microseconds on a loaded machine
// (a tiny decode beside torch, whose own threads spin for a while after each op, took
// 6 us longer through the pool: issue 15); this much work takes about as long on one core.
constexpr int64_t kInlineWork = int64_t{1} << 15;

// Multiply-adds of q.k bounded as kInlineWork says (saturating: the operands are sizes).
int64_t WorkBound(int64_t total_q, int64_t num_qo_heads, int64_t max_kv, int64_t head_dim) {
  int64_t work = 1;
  for (const int64_t factor : {total_q, num_qo_heads, max_kv, head_dim}) {
    if (factor <= 0) return 0;
    if (work > kInlineWork / factor) return kInlineWork;  // past the bound: no need to go on
    work *= factor;
  }
  return work;
}

// One task per (request tile, kv head, split); `run(tile, kv_head, split)`. On the pool,
// or inline for less than kInlineWork (`work`); either way every task runs and the first
// exception is rethrown after them (ThreadPool::ParallelFor's contract): a split's counter
// is only left zero when all its splits ran.
template <typename Run>
void RunTasks(const Vector<RequestTile>& tiles, int64_t num_kv_heads, int64_t num_splits, int64_t work,
              const Run& run) {
  const int64_t per_tile = num_kv_heads * num_splits;
  const int64_t num_tasks = static_cast<int64_t>(tiles.size()) * per_tile;
  const auto task = [&](int64_t task) {
    const RequestTile& tile = tiles[task / per_tile];
    const int64_t rest = task % per_tile;
    run(tile, rest / num_splits, rest % num_splits);
  };
  if (work >= kInlineWork) {
    ThreadPool::Global().ParallelFor(num_tasks, task);
    return;
  }
  std::exception_ptr error;
  for (int64_t i = 0; i < num_tasks; ++i) {
    try {
      task(i);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

Vector<RequestTile> EnumerateTiles(int64_t batch_size, const int32_t* cu_seqlens_q, int64_t q_tile_tokens) {
  Vector<RequestTile> tiles;
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t q_len = cu_seqlens_q == nullptr ? 1 : cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    for (int64_t t = 0; t * q_tile_tokens < q_len; ++t) tiles.push_back({b, t});
  }
  return tiles;
}

template <typename T, typename Params>
TileInputs<T> MakeInputs(const Params& p, const SplitPlan& plan) {
  return TileInputs<T>{static_cast<const T*>(p.q), p.q_stride_token, p.q_stride_head,
                       static_cast<T*>(p.out), p.out_stride_token, p.out_stride_head, p.lse,
                       p.num_qo_heads, p.head_dim, p.num_qo_heads / p.num_kv_heads, p.total_q,
                       p.options, &plan, static_cast<uint8_t*>(p.workspace.data)};
}

// q_start: the local position of the request's query 0 (TileRows).
TileRows MakeRows(int64_t q_begin, int64_t q_len, int64_t q_start, int64_t kv_len, int64_t q_tile,
                  int64_t q_tile_tokens, int64_t kv_head, int64_t request, int64_t num_kv_heads,
                  int64_t max_q_tiles) {
  const int64_t first = q_tile * q_tile_tokens;
  return TileRows{q_begin + first, std::min(q_tile_tokens, q_len - first), first, q_start, kv_len, kv_head,
                  TileCounterIndex(request, kv_head, q_tile, num_kv_heads, max_q_tiles)};
}

// Runs one task on `kv` (rows of KvT): as they are, or through Fp8Rows, which dequantises
// an fp8 cache with the kv head's scales (fp8_kv.h: the only place that knows fp8).
template <typename T, typename Kv>
void RunTask(const TileInputs<T>& in, const TileRows& rows, const Kv& kv, const KvStorage& storage,
             int64_t split) {
  if constexpr (std::is_same_v<KvElement<Kv>, Fp8E4M3>) {
    const float k_scale = storage.k_scales != nullptr ? storage.k_scales[rows.kv_head] : storage.k_scale;
    const float v_scale = storage.v_scales != nullptr ? storage.v_scales[rows.kv_head] : storage.v_scale;
    RunSplit(in, rows, Fp8Rows<Kv>(kv, rows.kv_len, in.head_dim, k_scale, v_scale), split);
  } else {
    RunSplit(in, rows, kv, split);
  }
}

// T: q and out; KvT: how k and v are stored (T, or Fp8E4M3).
template <typename T, typename KvT>
void Paged(const PagedAttentionParams& p, const SplitPlan& plan) {
  const TileInputs<T> in = MakeInputs<T>(p, plan);
  const int64_t q_tile_tokens = QTileTokens(in.group_size);
  const auto tiles = EnumerateTiles(p.batch_size, p.cu_seqlens_q, q_tile_tokens);
  const int64_t max_kv = p.max_kv_len > 0 ? p.max_kv_len : p.max_pages_per_seq * p.page_size;
  const int64_t work = WorkBound(p.total_q, p.num_qo_heads, max_kv, p.head_dim);
  RunTasks(tiles, p.num_kv_heads, plan.num_splits, work, [&](const RequestTile& rt, int64_t kv_head, int64_t split) {
    const int64_t b = rt.request;
    const int64_t q_begin = p.cu_seqlens_q == nullptr ? b : p.cu_seqlens_q[b];
    const int64_t q_len = p.cu_seqlens_q == nullptr ? 1 : p.cu_seqlens_q[b + 1] - q_begin;
    const PagedKv<KvT> kv{static_cast<const KvT*>(p.k_cache) + kv_head * p.k_stride_head,
                          static_cast<const KvT*>(p.v_cache) + kv_head * p.v_stride_head,
                          p.block_tables + b * p.block_tables_stride,
                          p.page_size, p.k_stride_page, p.k_stride_slot, p.v_stride_page, p.v_stride_slot};
    const int64_t kv_len = p.seq_lens[b];
    // Keys placed in a longer request (params.h): the queries sit full - offset past key 0.
    const int64_t q_end = p.full_seq_lens != nullptr ? int64_t{p.full_seq_lens[b]} - p.kv_offsets[b] : kv_len;
    RunTask(in, MakeRows(q_begin, q_len, q_end - q_len, kv_len, rt.q_tile, q_tile_tokens, kv_head, b,
                         p.num_kv_heads, plan.max_q_tiles),
            kv, p.kv_storage, split);
  });
}

template <typename T, typename KvT>
void Ragged(const RaggedAttentionParams& p, const SplitPlan& plan) {
  const TileInputs<T> in = MakeInputs<T>(p, plan);
  const int64_t q_tile_tokens = QTileTokens(in.group_size);
  const auto tiles = EnumerateTiles(p.batch_size, p.cu_seqlens_q, q_tile_tokens);
  const int64_t max_kv = p.max_kv_len > 0 ? p.max_kv_len : p.total_kv;
  const int64_t work = WorkBound(p.total_q, p.num_qo_heads, max_kv, p.head_dim);
  RunTasks(tiles, p.num_kv_heads, plan.num_splits, work, [&](const RequestTile& rt, int64_t kv_head, int64_t split) {
    const int64_t b = rt.request;
    const int64_t q_begin = p.cu_seqlens_q[b];
    const int64_t kv_begin = p.cu_seqlens_kv[b];
    const RaggedKv<KvT> kv{static_cast<const KvT*>(p.k) + kv_begin * p.k_stride_token + kv_head * p.k_stride_head,
                           static_cast<const KvT*>(p.v) + kv_begin * p.v_stride_token + kv_head * p.v_stride_head,
                           p.k_stride_token, p.v_stride_token};
    const int64_t q_len = p.cu_seqlens_q[b + 1] - q_begin;
    const int64_t kv_len = p.cu_seqlens_kv[b + 1] - kv_begin;
    RunTask(in, MakeRows(q_begin, q_len, kv_len - q_len, kv_len, rt.q_tile, q_tile_tokens, kv_head, b,
                         p.num_kv_heads, plan.max_q_tiles),
            kv, p.kv_storage, split);
  });
}

// An fp8 cache comes with float16 or bfloat16 q (the launcher refused anything else).
template <template <typename, typename> class Op, typename Params>
void DispatchDtype(const Params& p, const SplitPlan& plan) {
  if (p.kv_storage.fp8_e4m3) {
    if (p.dtype == DType::kFloat16) return Op<Half, Fp8E4M3>::Run(p, plan);
    if (p.dtype == DType::kBFloat16) return Op<BFloat16, Fp8E4M3>::Run(p, plan);
    return;
  }
  switch (p.dtype) {
    case DType::kFloat32: return Op<float, float>::Run(p, plan);
    case DType::kFloat16: return Op<Half, Half>::Run(p, plan);
    case DType::kBFloat16: return Op<BFloat16, BFloat16>::Run(p, plan);
  }
}

template <typename T, typename KvT>
struct PagedOp {
  static void Run(const PagedAttentionParams& p, const SplitPlan& plan) { Paged<T, KvT>(p, plan); }
};
template <typename T, typename KvT>
struct RaggedOp {
  static void Run(const RaggedAttentionParams& p, const SplitPlan& plan) { Ragged<T, KvT>(p, plan); }
};

}  // namespace

void PagedAttentionKernels(const PagedAttentionParams& params, const SplitPlan& plan) {
  DispatchDtype<PagedOp>(params, plan);
}

void RaggedAttentionKernels(const RaggedAttentionParams& params, const SplitPlan& plan) {
  DispatchDtype<RaggedOp>(params, plan);
}

}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu
