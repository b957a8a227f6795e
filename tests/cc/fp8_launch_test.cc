// fp8 (e4m3) KV caches through the C++ launchers on the CPU: results against a float64
// reference (per-tensor and per-kv-head scales, paged and ragged, split, unsplit and
// batch-invariant, windows that start inside a dequantised chunk, requests longer than the
// per-thread ring of dequantised chunks), and the memory a long request leaves behind (the
// dequantised rows once took kv_len x head_dim x 8 bytes per thread, kept for the thread's life).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cc/splitkv/errors.h"
#include "cc/splitkv/launchers.h"
#include "cc/splitkv/workspace_layout.h"
#include "tests/cc/reference.h"
#include "tests/cc/test_check.h"
#include "tests/cc/test_dtypes.h"
#include "tests/cc/test_workspace.h"

namespace {

using splitkv::DType;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

splitkv_test::TestWorkspace& Ws() {
  static auto* ws = new splitkv_test::TestWorkspace(splitkv::kCounterRegionBytes + (int64_t{8} << 20));
  return *ws;
}

double Fp8Value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  double mag = e == 0 ? m / 512.0 : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

// A packed problem: q [tq][hq][d], k/v [tkv][hkv][d], stored in `dtype` (k/v fp8 if fp8).
struct Prob {
  int64_t hq = 4, hkv = 2, d = 16;
  std::vector<int32_t> q_lens, kv_lens, cu_q{0}, cu_kv{0};
  DType dtype = DType::kFloat32;
  bool fp8 = false;
  std::vector<double> q, k, v;                 // values (k, v: before scale)
  std::vector<uint8_t> qb, kb, vb;             // storage
  int64_t tq = 0, tkv = 0;
  std::vector<uint8_t> outb;
  std::vector<float> lse;
};

int64_t Eb(DType t) { return t == DType::kFloat32 ? 4 : 2; }

void Store(DType t, uint8_t* dst, double x) {
  if (t == DType::kFloat32) {
    float f = static_cast<float>(x);
    std::memcpy(dst, &f, 4);
  } else {
    uint16_t h = splitkv_test::EncodeHalfLike(t, x);
    std::memcpy(dst, &h, 2);
  }
}
double Load(DType t, const uint8_t* src) {
  if (t == DType::kFloat32) {
    float f;
    std::memcpy(&f, src, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, src, 2);
  return splitkv_test::DecodeHalfLike(t, h);
}

Prob Make(int64_t hq, int64_t hkv, int64_t d, std::vector<int32_t> q_lens, std::vector<int32_t> kv_lens,
          DType dtype = DType::kFloat32, bool fp8 = false, uint32_t seed = 1) {
  Prob p;
  p.hq = hq, p.hkv = hkv, p.d = d, p.q_lens = q_lens, p.kv_lens = kv_lens, p.dtype = dtype, p.fp8 = fp8;
  for (size_t b = 0; b < q_lens.size(); ++b) {
    p.cu_q.push_back(p.cu_q.back() + q_lens[b]);
    p.cu_kv.push_back(p.cu_kv.back() + kv_lens[b]);
  }
  p.tq = p.cu_q.back(), p.tkv = p.cu_kv.back();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  p.q.resize(p.tq * hq * d), p.qb.resize(std::max<int64_t>(1, p.q.size()) * Eb(dtype));
  for (size_t i = 0; i < p.q.size(); ++i) {
    p.q[i] = splitkv_test::RoundTo(dtype, u(rng));
    Store(dtype, &p.qb[i * Eb(dtype)], p.q[i]);
  }
  const int64_t kve = fp8 ? 1 : Eb(dtype);
  p.k.resize(p.tkv * hkv * d), p.v.resize(p.k.size());
  p.kb.resize(std::max<size_t>(1, p.k.size()) * kve), p.vb.resize(p.kb.size());
  for (size_t i = 0; i < p.k.size(); ++i) {
    for (int w = 0; w < 2; ++w) {
      auto& vals = w ? p.v : p.k;
      auto& bytes = w ? p.vb : p.kb;
      if (fp8) {
        uint8_t b;
        do b = static_cast<uint8_t>(rng() & 0xff); while ((b & 0x7f) == 0x7f || ((b >> 3) & 15) > 8);
        bytes[i] = b;
        vals[i] = Fp8Value(b);
      } else {
        vals[i] = splitkv_test::RoundTo(dtype, u(rng));
        Store(dtype, &bytes[i * kve], vals[i]);
      }
    }
  }
  p.outb.assign(std::max<int64_t>(1, p.tq * hq * d) * Eb(dtype), 0xEE);
  p.lse.assign(std::max<int64_t>(1, p.tq * hq), kNaN);
  return p;
}

// The fields paged and ragged params share: q, out, lse, heads, dtypes, options, workspace.
template <class Params>
void SetShared(Params& r, Prob& p, int32_t splits) {
  r.q = p.qb.data(), r.q_stride_token = p.hq * p.d, r.q_stride_head = p.d;
  r.cu_seqlens_q = p.cu_q.data();
  r.out = p.outb.data(), r.out_stride_token = p.hq * p.d, r.out_stride_head = p.d;
  r.lse = p.lse.data();
  r.total_q = p.tq;
  r.num_qo_heads = p.hq, r.num_kv_heads = p.hkv, r.head_dim = p.d;
  r.dtype = p.dtype;
  r.kv_storage.fp8_e4m3 = p.fp8;
  r.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(p.d));
  r.options.num_splits = splits;
  r.workspace.data = Ws().data(), r.workspace.bytes = Ws().bytes();
}

splitkv::RaggedAttentionParams Ragged(Prob& p, int32_t splits = 0) {
  splitkv::RaggedAttentionParams r;
  SetShared(r, p, splits);
  r.k = p.kb.data(), r.k_stride_token = p.hkv * p.d, r.k_stride_head = p.d;
  r.v = p.vb.data(), r.v_stride_token = p.hkv * p.d, r.v_stride_head = p.d;
  r.cu_seqlens_kv = p.cu_kv.data();
  r.batch_size = p.q_lens.size(), r.total_kv = p.tkv;
  return r;
}

// Paged copy of a Prob: pages shuffled, HND, separate k/v caches.
struct Paged {
  std::vector<uint8_t> kc, vc;
  std::vector<int32_t> bt, seq_lens;
  int64_t num_pages = 0, max_pages = 0, ps = 0;
};

splitkv::PagedAttentionParams MakePaged(Prob& p, Paged& g, int64_t ps, int32_t splits = 0) {
  const int64_t kve = p.fp8 ? 1 : Eb(p.dtype), B = p.q_lens.size();
  g.ps = ps;
  for (int64_t b = 0; b < B; ++b) g.max_pages = std::max<int64_t>(g.max_pages, (p.kv_lens[b] + ps - 1) / ps);
  g.max_pages = std::max<int64_t>(1, g.max_pages);
  std::vector<int32_t> order;
  for (int64_t b = 0; b < B; ++b) g.num_pages += (p.kv_lens[b] + ps - 1) / ps;
  g.num_pages += 1;
  for (int64_t i = 0; i < g.num_pages; ++i) order.push_back(static_cast<int32_t>(g.num_pages - 1 - i));
  const int64_t page_elems = p.hkv * ps * p.d;
  g.kc.assign(g.num_pages * page_elems * kve, 0), g.vc.assign(g.kc.size(), 0);
  g.bt.assign(std::max<int64_t>(1, B) * g.max_pages, 0);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    g.seq_lens.push_back(p.kv_lens[b]);
    for (int64_t t = 0; t < p.kv_lens[b]; ++t) {
      if (t % ps == 0) g.bt[b * g.max_pages + t / ps] = order[next++];
      const int64_t page = g.bt[b * g.max_pages + t / ps];
      for (int64_t h = 0; h < p.hkv; ++h) {
        const int64_t src = ((p.cu_kv[b] + t) * p.hkv + h) * p.d * kve;
        const int64_t dst = (page * page_elems + h * ps * p.d + (t % ps) * p.d) * kve;
        std::memcpy(&g.kc[dst], &p.kb[src], p.d * kve);
        std::memcpy(&g.vc[dst], &p.vb[src], p.d * kve);
      }
    }
  }
  if (g.seq_lens.empty()) g.seq_lens.push_back(0);
  splitkv::PagedAttentionParams r;
  SetShared(r, p, splits);
  r.k_cache = g.kc.data(), r.v_cache = g.vc.data();
  r.k_stride_page = r.v_stride_page = page_elems, r.k_stride_head = r.v_stride_head = ps * p.d;
  r.k_stride_slot = r.v_stride_slot = p.d;
  r.block_tables = g.bt.data(), r.block_tables_stride = g.max_pages;
  r.seq_lens = g.seq_lens.data();
  r.batch_size = B, r.num_pages = g.num_pages, r.page_size = ps, r.max_pages_per_seq = g.max_pages;
  int32_t mq = 1;
  for (int32_t x : p.q_lens) mq = std::max(mq, x);
  r.max_q_len = mq;
  return r;
}

// Reference with options, per-head scales and sinks.
struct RefOpts {
  splitkv::AttentionOptions o;
  std::vector<double> kscale, vscale;  // per kv head (empty: 1)
  std::vector<int64_t> q_ends;
};

splitkv_test::ReferenceResult Ref(const Prob& p, const RefOpts& ro) {
  std::vector<double> k = p.k, v = p.v;
  for (int64_t t = 0; t < p.tkv; ++t)
    for (int64_t h = 0; h < p.hkv; ++h)
      for (int64_t e = 0; e < p.d; ++e) {
        const int64_t i = (t * p.hkv + h) * p.d + e;
        if (!ro.kscale.empty()) k[i] *= ro.kscale[h];
        if (!ro.vscale.empty()) v[i] *= ro.vscale[h];
      }
  splitkv_test::ReferenceOptions opt;
  opt.causal = ro.o.causal, opt.window_left = ro.o.window_left, opt.logits_soft_cap = ro.o.logits_soft_cap;
  opt.sm_scale = ro.o.sm_scale, opt.q_ends = ro.q_ends;
  auto res = splitkv_test::ReferenceAttention(p.q, k, v, p.cu_q, p.cu_kv, p.hq, p.hkv, p.d, opt);
  if (ro.o.sinks != nullptr) {
    for (int64_t t = 0; t < p.tq; ++t)
      for (int64_t h = 0; h < p.hq; ++h) {
        double& l = res.lse[t * p.hq + h];
        const double s = ro.o.sinks[h];
        if (std::isinf(l) && l < 0) {
          l = s;
          continue;
        }
        const double top = std::max(l, s);
        const double total = std::exp(l - top) + std::exp(s - top);
        const double keep = std::exp(l - top) / total;
        for (int64_t e = 0; e < p.d; ++e) res.out[(t * p.hq + h) * p.d + e] *= keep;
        l = top + std::log(total);
      }
  }
  return res;
}

// Compares p's out/lse (dense) with the reference; returns max abs err of out.
double Compare(const Prob& p, const splitkv_test::ReferenceResult& ref, const std::string& label, double atol,
               bool check_lse = true) {
  double worst = 0.0;
  int bad = 0;
  for (int64_t i = 0; i < p.tq * p.hq * p.d; ++i) {
    const double got = Load(p.dtype, &p.outb[i * Eb(p.dtype)]);
    const double err = std::fabs(got - ref.out[i]);
    if (!(err <= atol + 1e-2 * std::fabs(ref.out[i]))) {
      if (bad++ < 3) std::fprintf(stderr, "  %s: out[%ld] got %g want %g\n", label.c_str(), (long)i, got, ref.out[i]);
    }
    if (err > worst || std::isnan(err)) worst = err;
  }
  if (check_lse)
    for (int64_t i = 0; i < p.tq * p.hq; ++i) {
      const double got = p.lse[i], want = ref.lse[i];
      const bool ok = (std::isinf(want) && got == want) || std::fabs(got - want) <= 1e-3 + 1e-4 * std::fabs(want);
      if (!ok && bad++ < 6) std::fprintf(stderr, "  %s: lse[%ld] got %g want %g\n", label.c_str(), (long)i, got, want);
    }
  if (bad) splitkv_test::Fail(__FILE__, __LINE__, label + ": " + std::to_string(bad) + " mismatches");
  else splitkv_test::Pass();
  return worst;
}

void CountersZero(const std::string& label) {
  const int64_t n = Ws().NonzeroCounters();
  if (n != 0) {
    splitkv_test::Fail(__FILE__, __LINE__, label + ": counter region has " + std::to_string(n) + " nonzero words");
    std::memset(Ws().data(), 0, splitkv::kCounterRegionBytes);
  }
}


TEST(Fp8MatchesTheReference) {
  int configs = 0;
  for (int64_t d : {16, 100, 128}) {
    for (const DType dt : {DType::kFloat16, DType::kBFloat16}) {
      const Prob base = Make(4, 2, d, {1, 37, 0, 5}, {1500, 700, 9, 0}, dt, true, 17 + static_cast<uint32_t>(d));
      for (int32_t splits : {1, 3, 0}) {
        for (int opt = 0; opt < 4; ++opt) {
          Prob p = base;
          auto r = Ragged(p, splits);
          RefOpts ro;
          std::vector<float> ks = {0.5f, 1.75f}, vs = {2.0f, 0.25f};
          if (opt % 2) {
            r.kv_storage.k_scales = ks.data(), r.kv_storage.v_scales = vs.data();
            ro.kscale = {0.5, 1.75}, ro.vscale = {2.0, 0.25};
          } else {
            r.kv_storage.k_scale = 0.75f, r.kv_storage.v_scale = 1.5f;
            ro.kscale.assign(2, 0.75), ro.vscale.assign(2, 1.5);
          }
          if (opt == 1) r.options.window_left = 300;  // starts inside a 64-row chunk
          if (opt == 2) r.options.causal = false, r.options.window_left = 77;
          if (opt == 3 && splits == 0) r.options.batch_invariant = true;
          ro.o = r.options;
          const std::string label = "fp8 d" + std::to_string(d) + " " + splitkv_test::DTypeName(dt) + " splits " +
                                    std::to_string(splits) + " opt " + std::to_string(opt);
          splitkv::LaunchRaggedAttention(r);
          CountersZero(label);
          Compare(p, Ref(p, ro), "ragged " + label, 2e-2);
          for (int64_t ps : {1, 16}) {
            Prob pp = base;
            Paged g;
            auto pr = MakePaged(pp, g, ps, splits);
            pr.options = r.options;
            pr.kv_storage = r.kv_storage;
            splitkv::LaunchPagedAttention(pr);
            CountersZero(label);
            Compare(pp, Ref(pp, ro), "paged ps " + std::to_string(ps) + " " + label, 2e-2);
          }
          ++configs;
        }
      }
    }
  }
  EXPECT_GT(configs, 0);
}

// One query over 64k keys, head_dim 128 (a one-page cache whose slots share one row): the
// dequantised rows of a task are a ring of a few chunks, not the request's 64 MiB per thread.
TEST(Fp8LongRequestKeepsLittleMemory) {
  const auto rss_kb = [] {
    FILE* f = std::fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f != nullptr && std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "VmRSS:", 6) == 0) kb = std::atol(line + 6);
    }
    if (f != nullptr) std::fclose(f);
    return kb;
  };
  const int64_t d = 128, kv = int64_t{1} << 16;
  // q of float16 1.0s (bytes 0x00 0x3C): every logit is the same, whatever q, since all keys are equal.
  std::vector<uint8_t> cache(d, 0x38), q(d * 2, 0), out(d * 2, 0);
  for (int64_t e = 0; e < d; ++e) q[2 * e + 1] = 0x3C;
  std::vector<int32_t> bt = {0}, seq = {static_cast<int32_t>(kv)}, cu = {0, 1};
  splitkv::PagedAttentionParams r;
  r.q = q.data(), r.q_stride_token = d, r.q_stride_head = d;
  r.k_cache = cache.data(), r.v_cache = cache.data();
  r.block_tables = bt.data(), r.block_tables_stride = 1, r.seq_lens = seq.data(), r.cu_seqlens_q = cu.data();
  r.out = out.data(), r.out_stride_token = d, r.out_stride_head = d;
  r.batch_size = 1, r.total_q = 1, r.num_pages = 1, r.page_size = kv, r.max_pages_per_seq = 1;
  r.num_qo_heads = 1, r.num_kv_heads = 1, r.head_dim = d, r.dtype = DType::kFloat16;
  r.kv_storage.fp8_e4m3 = true;
  r.workspace.data = Ws().data(), r.workspace.bytes = Ws().bytes();
  const long before = rss_kb();
  for (int32_t splits : {1, 8}) {
    r.options.num_splits = splits;
    splitkv::LaunchPagedAttention(r);
  }
  const long grown = rss_kb() - before;
  if (grown > 16 * 1024) {
    splitkv_test::Fail(__FILE__, __LINE__, "an fp8 call over 64k keys grew the RSS by " + std::to_string(grown) + " kB");
  } else {
    splitkv_test::Pass();
  }
  // Every key holds 1.0 (0x38) in k and v: out is 1.
  EXPECT_EQ(1.0, Load(DType::kFloat16, out.data()));
  CountersZero("fp8 long request");
}

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
