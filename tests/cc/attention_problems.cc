#include "tests/cc/attention_problems.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

namespace splitkv_test {
namespace {

constexpr int64_t kQPad = 8;     // extra elements per q token row
constexpr int64_t kOutPad = 16;  // extra elements per out token row
constexpr int32_t kUnusedPageId = 1 << 30;  // in block_tables past a request's pages

std::vector<int32_t> PrefixSum(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

// Fills q, out, lse and the packed reference copy of q, k, v. k_ref/v_ref hold values
// already rounded to the dtype, in [total_kv, num_kv_heads, head_dim] order.
void FillBase(const ProblemSpec& spec, const std::vector<int32_t>& q_lens, std::mt19937& rng, ProblemBase* p) {
  p->spec = spec;
  if (p->spec.options.sm_scale == 0.0f) p->spec.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
  const int64_t hq = spec.num_qo_heads, hkv = spec.num_kv_heads, d = spec.head_dim;
  p->batch_size = static_cast<int64_t>(spec.kv_lens.size());
  p->cu_q = PrefixSum(q_lens);
  p->cu_kv = PrefixSum(spec.kv_lens);
  p->total_q = p->cu_q.back();
  p->max_q_len = std::max<int64_t>(1, q_lens.empty() ? 1 : *std::max_element(q_lens.begin(), q_lens.end()));
  std::uniform_real_distribution<double> qk(-2.0, 2.0), vals(-1.0, 1.0);

  p->q_stride_token = hq * d + kQPad;
  p->q = TypedArray(spec.dtype, p->total_q * p->q_stride_token, std::numeric_limits<double>::quiet_NaN());
  p->q_ref.resize(p->total_q * hq * d);
  for (int64_t t = 0; t < p->total_q; ++t) {
    for (int64_t i = 0; i < hq * d; ++i) p->q_ref[t * hq * d + i] = p->q.Set(t * p->q_stride_token + i, qk(rng));
  }
  const int64_t total_kv = p->cu_kv.back();
  p->k_ref.resize(total_kv * hkv * d);
  p->v_ref.resize(total_kv * hkv * d);
  for (auto& x : p->k_ref) x = RoundTo(spec.dtype, qk(rng));
  for (auto& x : p->v_ref) x = RoundTo(spec.dtype, vals(rng));

  p->out_stride_token = hq * d + kOutPad;
  p->out = TypedArray(spec.dtype, p->total_q * p->out_stride_token);
  p->ClearOutputs();
}

}  // namespace

std::string ProblemSpec::Describe() const {
  std::ostringstream os;
  os << DTypeName(dtype) << " hq=" << num_qo_heads << " hkv=" << num_kv_heads << " d=" << head_dim << " kv_lens=[";
  for (size_t i = 0; i < kv_lens.size(); ++i) os << (i ? "," : "") << kv_lens[i];
  os << "] q_lens=[";
  for (size_t i = 0; i < q_lens.size(); ++i) os << (i ? "," : "") << q_lens[i];
  os << "] page_size=" << page_size << (nhd ? " NHD" : " HND") << (separate_kv ? " separate k/v" : "") << " causal=" << options.causal
     << " window_left=" << options.window_left << " soft_cap=" << options.logits_soft_cap;
  return os.str();
}

std::vector<double> ProblemBase::Out() const {
  const int64_t row = spec.num_qo_heads * spec.head_dim;
  std::vector<double> result(total_q * row);
  for (int64_t t = 0; t < total_q; ++t) {
    for (int64_t i = 0; i < row; ++i) result[t * row + i] = out.Get(t * out_stride_token + i);
  }
  return result;
}

bool ProblemBase::OutPaddingIntact() const {
  const int64_t row = spec.num_qo_heads * spec.head_dim;
  for (int64_t t = 0; t < total_q; ++t) {
    for (int64_t i = row; i < out_stride_token; ++i) {
      if (out.Get(t * out_stride_token + i) != kOutSentinel) return false;
    }
  }
  return true;
}

void ProblemBase::ClearOutputs() {
  for (int64_t i = 0; i < out.size(); ++i) out.Set(i, kOutSentinel);
  lse.assign(total_q * spec.num_qo_heads, std::numeric_limits<float>::quiet_NaN());
}

ReferenceResult ProblemBase::Reference() const {
  ReferenceOptions options;
  options.causal = spec.options.causal;
  options.window_left = spec.options.window_left;
  options.logits_soft_cap = spec.options.logits_soft_cap;
  options.sm_scale = spec.options.sm_scale;
  for (size_t b = 0; b < spec.full_seq_lens.size(); ++b) {
    options.q_ends.push_back(int64_t{spec.full_seq_lens[b]} - spec.kv_offsets[b]);
  }
  return ReferenceAttention(q_ref, k_ref, v_ref, cu_q, cu_kv, spec.num_qo_heads, spec.num_kv_heads, spec.head_dim,
                            options);
}

CacheView PagedProblem::KView() {
  const int64_t hkv = spec.num_kv_heads, ps = spec.page_size, d = spec.head_dim, half = hkv * ps * d;
  const int64_t head = spec.nhd ? d : ps * d, slot = spec.nhd ? hkv * d : d;
  if (spec.separate_kv) return {&k_cache, 0, half, head, slot};
  return {&kv_cache, 0, 2 * half, head, slot};
}

CacheView PagedProblem::VView() {
  const int64_t hkv = spec.num_kv_heads, ps = spec.page_size, d = spec.head_dim, half = hkv * ps * d;
  if (spec.separate_kv) {  // the other layout than k
    return {&v_cache, 0, half, spec.nhd ? ps * d : d, spec.nhd ? d : hkv * d};
  }
  return {&kv_cache, half, 2 * half, spec.nhd ? d : ps * d, spec.nhd ? hkv * d : d};
}

PagedProblem MakePagedProblem(const ProblemSpec& spec) {
  std::mt19937 rng(spec.seed);
  PagedProblem p;
  const bool decode = spec.q_lens.empty();
  FillBase(spec, decode ? std::vector<int32_t>(spec.kv_lens.size(), 1) : spec.q_lens, rng, &p);
  const int64_t hkv = spec.num_kv_heads, d = spec.head_dim, ps = spec.page_size;

  // Pages in a shuffled order, plus spare pages nobody uses; a spare column in block_tables,
  // and rows padded past max_pages_per_seq.
  std::vector<int64_t> pages_of(p.batch_size);
  int64_t used_pages = 0;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    pages_of[b] = (spec.kv_lens[b] + ps - 1) / ps;
    used_pages += pages_of[b];
    p.max_pages_per_seq = std::max(p.max_pages_per_seq, pages_of[b]);
  }
  p.max_pages_per_seq += 1;
  p.block_tables_stride = p.max_pages_per_seq + 2;
  p.num_pages = used_pages + 3;
  std::vector<int32_t> order(p.num_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  p.block_tables.assign(p.batch_size * p.block_tables_stride, kUnusedPageId);
  p.seq_lens = spec.kv_lens;

  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t cache_elements = p.num_pages * hkv * ps * d;
  if (spec.separate_kv) {
    p.k_cache = TypedArray(spec.dtype, cache_elements, nan);
    p.v_cache = TypedArray(spec.dtype, cache_elements, nan);
  } else {
    p.kv_cache = TypedArray(spec.dtype, 2 * cache_elements, nan);
  }
  const CacheView k = p.KView(), v = p.VView();
  int64_t next = 0;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    for (int64_t i = 0; i < pages_of[b]; ++i) p.block_tables[b * p.block_tables_stride + i] = order[next++];
    for (int64_t j = 0; j < spec.kv_lens[b]; ++j) {
      const int64_t page = p.block_tables[b * p.block_tables_stride + j / ps], slot = j % ps;
      for (int64_t h = 0; h < hkv; ++h) {
        const int64_t src = ((p.cu_kv[b] + j) * hkv + h) * d;
        const int64_t k_at = k.base + page * k.page_stride + h * k.head_stride + slot * k.slot_stride;
        const int64_t v_at = v.base + page * v.page_stride + h * v.head_stride + slot * v.slot_stride;
        for (int64_t e = 0; e < d; ++e) {
          k.array->Set(k_at + e, p.k_ref[src + e]);
          v.array->Set(v_at + e, p.v_ref[src + e]);
        }
      }
    }
  }
  return p;
}

splitkv::PagedAttentionParams PagedProblem::Params(void* workspace, int64_t workspace_bytes, int32_t num_splits) {
  const int64_t d = spec.head_dim, elem = ElementBytes(spec.dtype);
  const CacheView k = KView(), v = VView();
  splitkv::PagedAttentionParams params;
  params.q = q.data();
  params.q_stride_token = q_stride_token;
  params.q_stride_head = d;
  params.k_cache = static_cast<const unsigned char*>(k.array->data()) + k.base * elem;
  params.v_cache = static_cast<const unsigned char*>(v.array->data()) + v.base * elem;
  params.k_stride_page = k.page_stride;
  params.k_stride_head = k.head_stride;
  params.k_stride_slot = k.slot_stride;
  params.v_stride_page = v.page_stride;
  params.v_stride_head = v.head_stride;
  params.v_stride_slot = v.slot_stride;
  params.block_tables = block_tables.data();
  params.block_tables_stride = block_tables_stride;
  params.seq_lens = seq_lens.data();
  params.cu_seqlens_q = spec.q_lens.empty() ? nullptr : cu_q.data();
  if (!spec.kv_offsets.empty()) {
    params.kv_offsets = spec.kv_offsets.data();
    params.full_seq_lens = spec.full_seq_lens.data();
  }
  params.out = out.data();
  params.out_stride_token = out_stride_token;
  params.out_stride_head = d;
  params.lse = lse.data();
  params.batch_size = batch_size;
  params.total_q = total_q;
  params.num_pages = num_pages;
  params.page_size = spec.page_size;
  params.max_pages_per_seq = max_pages_per_seq;
  params.num_qo_heads = spec.num_qo_heads;
  params.num_kv_heads = spec.num_kv_heads;
  params.head_dim = d;
  params.max_q_len = max_q_len;
  params.dtype = spec.dtype;
  params.options = spec.options;
  params.options.num_splits = num_splits;
  params.workspace = {workspace, workspace_bytes};
  return params;
}

RaggedProblem MakeRaggedProblem(const ProblemSpec& spec) {
  std::mt19937 rng(spec.seed);
  RaggedProblem p;
  FillBase(spec, spec.q_lens, rng, &p);
  const int64_t hkv = spec.num_kv_heads, d = spec.head_dim;
  p.total_kv = p.cu_kv.back();
  p.kv = TypedArray(spec.dtype, p.total_kv * hkv * 2 * d);
  for (int64_t t = 0; t < p.total_kv; ++t) {
    for (int64_t h = 0; h < hkv; ++h) {
      for (int64_t e = 0; e < d; ++e) {
        const int64_t src = (t * hkv + h) * d + e;
        p.kv.Set(((t * hkv + h) * 2 + 0) * d + e, p.k_ref[src]);
        p.kv.Set(((t * hkv + h) * 2 + 1) * d + e, p.v_ref[src]);
      }
    }
  }
  return p;
}

splitkv::RaggedAttentionParams RaggedProblem::Params(void* workspace, int64_t workspace_bytes, int32_t num_splits) {
  const int64_t hkv = spec.num_kv_heads, d = spec.head_dim;
  splitkv::RaggedAttentionParams params;
  params.q = q.data();
  params.q_stride_token = q_stride_token;
  params.q_stride_head = d;
  params.k = kv.data();
  params.v = static_cast<const unsigned char*>(kv.data()) + d * ElementBytes(spec.dtype);
  params.k_stride_token = params.v_stride_token = hkv * 2 * d;
  params.k_stride_head = params.v_stride_head = 2 * d;
  params.cu_seqlens_q = cu_q.data();
  params.cu_seqlens_kv = cu_kv.data();
  params.out = out.data();
  params.out_stride_token = out_stride_token;
  params.out_stride_head = d;
  params.lse = lse.data();
  params.batch_size = batch_size;
  params.total_q = total_q;
  params.total_kv = total_kv;
  params.num_qo_heads = spec.num_qo_heads;
  params.num_kv_heads = hkv;
  params.head_dim = d;
  params.max_q_len = max_q_len;
  params.max_kv_len = 0;
  params.dtype = spec.dtype;
  params.options = spec.options;
  params.options.num_splits = num_splits;
  params.workspace = {workspace, workspace_bytes};
  return params;
}

Tolerance OutTolerance(splitkv::DType dtype) {
  switch (dtype) {
    // Half an ulp of the output's rounding (round to nearest) plus float32 accumulation.
    case splitkv::DType::kFloat16: return {2e-5, std::ldexp(1.0, -11) + 2e-5};
    case splitkv::DType::kBFloat16: return {2e-5, std::ldexp(1.0, -8) + 2e-5};
    default: return {2e-5, 1e-4};
  }
}

}  // namespace splitkv_test
