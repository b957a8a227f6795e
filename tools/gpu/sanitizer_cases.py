"""Small launches of each operation for compute-sanitizer (memcheck, racecheck, synccheck).

Covers both tile kinds of the paged kernel (decode and prefill tiles; on sm_90 decode tiles
with 16-byte aligned KV run the bulk-copy kernel, head_dim 256 with pages of 8+ slots through
its K/V ring), the ragged kernel, the sm_90 wgmma + TMA
ragged prefill (1 split, float16/bfloat16, head_dim 128, 256 and 64: partial last key blocks whose tail
V rows it zeroes, partial query tiles, a window), attention sinks (decode split, wgmma),
head_dim 64's default decode on the 128-key wgmma-order tiles (unsplit, a grid of 3-4 CTAs an
SM at two an SM, and a split grid past 4 CTAs an SM) and head_dim 128's (unsplit, pages of 8,
a window; a split grid past one wave, merging in row chunks), fp8 K/V (the sm_90 bulk decode kernel at d64/d128/d256, mma.sync: prefill
tiles, ragged; 1-split prefill on sm_90: the 16-bit copy in the workspace and the wgmma
prefill over it), split merges (num_splits > 1; in row chunks where a tile's partials outgrow the
decode kernel's shared memory) and direct
writes, page tails holding NaN, a row that sees no key, and split launches over a dirty
counter region (0xFF bytes, counts of num_splits - 1: they must end and report), and
batch-invariant calls (sm_90: the wgmma prefill folding its splits, the decode kernel's
wgmma-order path by tensor copies, at three CTAs an SM and at two on head_dim 64's grids of
3-4 an SM, and by row copies, paged and ragged), and
paged calls over shards of longer requests (kv_offsets, full_seq_lens) with windows, and
paged prefill on the sm_90 wgmma kernel by page-box tensor copies (HND and NHD, pages of 8,
16 and 64 slots, head_dim 64/128/256, a window whose first key is inside a page box,
kv_offsets). Prints one line per case; exits nonzero if a result is off or a counter stays
set (the sanitizer's own exit code reports its findings). An argument runs only the cases
whose name contains it.

    compute-sanitizer --tool racecheck python3 tools/gpu/sanitizer_cases.py [substring]
"""

import sys

import torch

import harness  # tests/python on PYTHONPATH
import splitkv
import splitkv_reference


def _fp8(problem, scale):
    """The paged problem with its cache stored as fp8 (value / scale); the reference's keys and
    values become what the bytes mean (stored x scale)."""
    fp8 = torch.float8_e4m3fn
    problem.kv_cache = (problem.kv_cache.float() / scale).to(fp8)
    problem.keys = [(k.float() / scale).to(fp8).float() * scale for k in problem.keys]
    problem.values = [(v.float() / scale).to(fp8).float() * scale for v in problem.values]
    return problem


class _Fp8Ragged:
    """A ragged problem over fp8 k, v whose reference sees the dequantised values."""

    def __init__(self, problem, scale):
        fp8 = torch.float8_e4m3fn
        self.inner, self.scale = problem, scale
        self.k, self.v = (problem.k.float() / scale).to(fp8), (problem.v.float() / scale).to(fp8)

    def run(self, workspace, **options):
        p = self.inner
        return splitkv.ragged_attention(p.q, self.k, self.v, p.cu_seqlens_q, p.cu_seqlens_kv,
                                        workspace, **options)

    def reference(self, **options):
        p = self.inner
        options = {k: v for k, v in options.items() if k in ("causal", "window_left", "sinks")}
        return splitkv_reference.ragged_attention(
            p.q.cpu(), self.k.float().cpu() * self.scale, self.v.float().cpu() * self.scale,
            p.cu_seqlens_q, p.cu_seqlens_kv, **options)


def _fp8_ragged(problem, scale):
    return _Fp8Ragged(problem, scale)


class _Shard:
    """A paged problem whose keys are one shard of longer requests (kv_offsets,
    full_seq_lens); the reference places each row at its local position."""

    def __init__(self, problem, kv_offsets, full_lens):
        self.inner, self.offsets, self.full_lens = problem, kv_offsets, full_lens
        as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=problem.q.device)
        self.shift = dict(kv_offsets=as_int(kv_offsets), full_seq_lens=as_int(full_lens))

    def run(self, workspace, **options):
        return self.inner.run(workspace, **options, **self.shift)

    def plan(self, workspace, **options):
        return self.inner.plan(workspace, **options, **self.shift)

    def reference(self, **options):
        p = self.inner
        options = {k: v for k, v in options.items() if k in ("causal", "window_left", "sinks")}
        q, outs, lses, row = p.q.cpu(), [], [], 0
        for b, (q_len, k, v) in enumerate(zip(p.q_lens, p.keys, p.values)):
            start = self.full_lens[b] - self.offsets[b] - q_len
            out, lse = splitkv_reference.attention(q[row:row + q_len], k, v,
                                                   positions=torch.arange(start, start + q_len), **options)
            outs.append(out)
            lses.append(lse)
            row += q_len
        return torch.cat(outs), torch.cat(lses)


def main():
    workspace = splitkv.Workspace(16 << 20, "cuda")
    cases = [
        ("paged decode, decode tiles, 3 splits",
         harness.make_paged([1, 45, 130], page_size=16, group=4, head_dim=128,
                            dtype=torch.bfloat16, device="cuda"), dict(num_splits=3)),
        ("paged decode d128 group 8, 2 tokens (sm_90: the merge from shared memory in row chunks), 32 splits",
         harness.make_paged([2100, 700, 1], page_size=16, group=8, head_dim=128, dtype=torch.bfloat16,
                            device="cuda", q_lens=[2, 2, 1]), dict(num_splits=32, max_q_len=2)),
        ("paged decode d128 unsplit (sm_90: the wgmma-order tiles of the default route), pages of 8, a window",
         harness.make_paged([5, 333, 2049, 700], page_size=8, group=4, head_dim=128, dtype=torch.bfloat16,
                            device="cuda"), dict(num_splits=1, window_left=37)),
        ("paged decode d128 group 8, 2 tokens, 32 splits past one wave (sm_90: the wgmma-order tiles' merge "
         "from shared memory in row chunks)",
         harness.make_paged([2100, 700, 1] * 5, page_size=16, group=8, head_dim=128, dtype=torch.bfloat16,
                            device="cuda", q_lens=[2, 2, 1] * 5), dict(num_splits=32, max_q_len=2)),
        ("paged decode, head_dim 256 (sm_90: the K/V ring), 3 splits, NHD",
         harness.make_paged([700, 45, 130], page_size=16, group=4, head_dim=256,
                            dtype=torch.bfloat16, device="cuda", kv_layout="NHD"), dict(num_splits=3)),
        ("paged chunked prefill, prefill tiles, 2 splits, NHD",
         harness.make_paged([70, 200], page_size=8, group=2, head_dim=64, dtype=torch.float16,
                            device="cuda", kv_layout="NHD", q_lens=[70, 33]),
         dict(num_splits=2, max_q_len=70)),
        ("paged spec decode, head_dim 256, 1 split, window",
         harness.make_paged([300, 3], page_size=32, group=1, head_dim=256, dtype=torch.bfloat16,
                            device="cuda", q_lens=[3, 3]),
         dict(num_splits=1, window_left=50, max_q_len=3)),
        ("ragged causal, 2 splits, soft cap, q > kv",
         harness.make_ragged([90, 20], [40, 150], group=4, head_dim=128, dtype=torch.float16,
                             device="cuda"), dict(num_splits=2, logits_soft_cap=10.0, max_q_len=90)),
        ("ragged wgmma (sm_90), bf16 d128 GQA causal, partial last blocks, 1 split",
         harness.make_ragged([37, 130, 5, 257], [37, 200, 5, 257], group=4, head_dim=128,
                             dtype=torch.bfloat16, device="cuda"), dict(num_splits=1)),
        ("ragged wgmma (sm_90), bf16 d256 GQA causal, partial last blocks, 1 split",
         harness.make_ragged([37, 130, 5, 100], [37, 200, 5, 100], group=4, head_dim=256,
                             dtype=torch.bfloat16, device="cuda"), dict(num_splits=1)),
        ("ragged wgmma (sm_90), f16 d64 window, soft cap, q > kv, 1 split",
         harness.make_ragged([150, 40], [120, 300], group=2, head_dim=64, dtype=torch.float16,
                             device="cuda"),
         dict(num_splits=1, window_left=50, logits_soft_cap=5.0)),
        ("paged decode with sinks (sm_90 decode kernel), 3 splits",
         harness.make_paged([1, 45, 700], page_size=16, group=8, head_dim=64,
                            dtype=torch.bfloat16, device="cuda"),
         dict(num_splits=3, sinks=torch.linspace(-4, 4, 16, device="cuda"))),
        ("paged decode d64 (sm_90: the 128-key wgmma-order tiles, default mode), sinks, 1 split",
         harness.make_paged([1, 45, 700, 130], page_size=16, group=8, head_dim=64,
                            dtype=torch.bfloat16, device="cuda"),
         dict(num_splits=1, sinks=torch.linspace(-4, 4, 16, device="cuda"))),
        ("paged decode d64 (sm_90: the 128-key wgmma-order tiles at two CTAs an SM, a grid of 3-4 an SM on a "
         "132-SM H200), 1 split",
         harness.make_paged([1 + (53 * i) % 900 for i in range(232)], page_size=16, group=4, head_dim=64,
                            dtype=torch.bfloat16, device="cuda"), dict(num_splits=1)),
        ("paged decode d64 (sm_90: the 128-key wgmma-order tiles past 4 CTAs an SM), f16, 8 splits",
         harness.make_paged([1 + (37 * i) % 700 for i in range(48)], page_size=16, group=4, head_dim=64,
                            dtype=torch.float16, device="cuda"), dict(num_splits=8)),
        ("ragged wgmma (sm_90) with sinks and a window, bf16 d128, q > kv, 1 split",
         harness.make_ragged([130, 40], [100, 300], group=4, head_dim=128, dtype=torch.bfloat16,
                             device="cuda"),
         dict(num_splits=1, window_left=64, sinks=torch.linspace(-3, 5, 8, device="cuda"))),
        ("batch-invariant ragged (sm_90: the wgmma kernel, splits folded in the CTA), bf16 d128, window, 2 splits",
         harness.make_ragged([300, 40], [2300, 300], group=4, head_dim=128, dtype=torch.bfloat16,
                             device="cuda"), dict(batch_invariant=True, window_left=700)),
        ("batch-invariant paged chunk + decode (sm_90: the paged wgmma kernel), d64, 2 splits",
         harness.make_paged([2300, 300], page_size=16, group=4, head_dim=64, dtype=torch.bfloat16,
                            device="cuda", q_lens=[9, 1]), dict(batch_invariant=True, max_q_len=9)),
        ("batch-invariant paged decode (sm_90: the decode kernel's wgmma order, tensor copies), d128, "
         "sinks, 2 splits",
         harness.make_paged([2300, 300, 1], page_size=16, group=4, head_dim=128, dtype=torch.bfloat16,
                            device="cuda"),
         dict(batch_invariant=True, sinks=torch.linspace(-2, 2, 8, device="cuda"))),
        ("batch-invariant paged decode (sm_90: the wgmma-order tiles at two CTAs an SM, a grid of 3-4 an SM "
         "on a 132-SM H200), d64, 4 splits",
         harness.make_paged([6145 + (211 * i) % 2000 for i in range(58)], page_size=16, group=4, head_dim=64,
                            dtype=torch.bfloat16, device="cuda"), dict(batch_invariant=True)),
        ("batch-invariant paged verify (sm_90: the decode kernel's wgmma order, row copies), pages of 4, "
         "f16 d64, 2 splits",
         harness.make_paged([2300, 300], page_size=4, group=2, head_dim=64, dtype=torch.float16,
                            device="cuda", q_lens=[3, 2]), dict(batch_invariant=True, max_q_len=3)),
        ("batch-invariant ragged decode (sm_90: the decode kernel's wgmma order, row copies), d128, "
         "window, 2 splits",
         harness.make_ragged([1, 2], [2300, 300], group=4, head_dim=128, dtype=torch.bfloat16,
                             device="cuda"), dict(batch_invariant=True, window_left=900)),
        ("paged fp8 (e4m3) cache, d256 NHD, sinks, a window (sm_90: the bulk decode kernel), 3 splits",
         _fp8(harness.make_paged([700, 3, 130], page_size=16, group=4, head_dim=256,
                                 dtype=torch.bfloat16, device="cuda", kv_layout="NHD"), 0.5),
         dict(num_splits=3, k_scale=0.5, v_scale=0.5, window_left=300,
              sinks=torch.linspace(-2, 3, 8, device="cuda"))),
        ("paged fp8 (e4m3) cache, d64 NHD pages of 8, sinks, a window (sm_90: the bulk decode "
         "kernel, 64-byte rows, keys as rows in 256-key blocks), 3 splits",
         _fp8(harness.make_paged([700, 3, 130], page_size=8, group=4, head_dim=64,
                                 dtype=torch.bfloat16, device="cuda", kv_layout="NHD"), 0.5),
         dict(num_splits=3, k_scale=0.5, v_scale=0.5, window_left=300,
              sinks=torch.linspace(-2, 3, 8, device="cuda"))),
        ("paged fp8 (e4m3) cache, d64 (sm_90: keys as rows, four CTAs an SM, a grid past 2 an SM on a "
         "132-SM H200), sinks, 3 splits",
         _fp8(harness.make_paged([1 + (97 * i + 13) % 1500 for i in range(58)], page_size=16, group=4,
                                 head_dim=64, dtype=torch.bfloat16, device="cuda"), 0.5),
         dict(num_splits=3, k_scale=0.5, v_scale=0.5, sinks=torch.linspace(-2, 3, 8, device="cuda"))),
        ("paged fp8 (e4m3) cache, d64 group 16 (sm_90: the query rows at three CTAs an SM), a window, 3 splits",
         _fp8(harness.make_paged([700, 3, 130], page_size=16, group=16, head_dim=64,
                                 dtype=torch.bfloat16, device="cuda"), 0.5),
         dict(num_splits=3, k_scale=0.5, v_scale=0.5, window_left=300)),
        ("paged fp8 (e4m3) cache, d64 group 16 (sm_90: the query rows at four CTAs an SM, a grid past 3 an SM "
         "on a 132-SM H200), 4 splits",
         _fp8(harness.make_paged([1 + (97 * i + 13) % 1500 for i in range(58)], page_size=16, group=16,
                                 head_dim=64, dtype=torch.bfloat16, device="cuda"), 0.5),
         dict(num_splits=4, k_scale=0.5, v_scale=0.5)),
        ("paged fp8 (e4m3) cache, f16 d64 (mma.sync), chunked prefill tiles, 2 splits",
         _fp8(harness.make_paged([70, 200], page_size=8, group=2, head_dim=64, dtype=torch.float16,
                                 device="cuda", q_lens=[70, 33]), 0.25),
         dict(num_splits=2, max_q_len=70, k_scale=0.25, v_scale=0.25)),
        ("paged fp8 (e4m3) cache, per-head k scales (sm_90: the bulk decode kernel), 2 splits, decode",
         _fp8(harness.make_paged([1, 45, 300], page_size=16, group=4, head_dim=128,
                                 dtype=torch.bfloat16, device="cuda"), 0.25),
         dict(num_splits=2, k_scale=torch.tensor([0.25, 0.25], device="cuda"), v_scale=0.25)),
        ("ragged fp8 (e4m3) k, v, f16 d64, causal q > kv (sm_90: a 16-bit copy in the workspace, "
         "the wgmma prefill), 1 split",
         _fp8_ragged(harness.make_ragged([70, 20], [50, 130], group=2, head_dim=64,
                                         dtype=torch.float16, device="cuda"), 0.5),
         dict(num_splits=1, k_scale=0.5, v_scale=0.5)),
        ("paged fp8 (e4m3) cache, bf16 d128 NHD page 16, chunked prefill, sinks, a window, per-head "
         "k scales (sm_90: a 16-bit copy in the workspace, the wgmma prefill), 1 split",
         _fp8(harness.make_paged([300, 40, 129], page_size=16, group=4, head_dim=128, dtype=torch.bfloat16,
                                 device="cuda", kv_layout="NHD", q_lens=[130, 40, 3]), 0.5),
         dict(num_splits=1, k_scale=torch.tensor([0.5, 0.5], device="cuda"), v_scale=0.5, window_left=90,
              sinks=torch.linspace(-2, 3, 8, device="cuda"))),
        ("paged decode over shards (kv_offsets), a window (sm_90: the bulk decode kernel), d128, 3 splits",
         _Shard(harness.make_paged([700, 45, 300, 0], page_size=16, group=4, head_dim=128,
                                   dtype=torch.bfloat16, device="cuda"),
                [0, 900, 100, 7], [1000, 945, 450, 7]),
         dict(num_splits=3, window_left=400)),
        ("paged chunked prefill over shards (kv_offsets), a window, sinks (mma.sync), d64, 2 splits",
         _Shard(harness.make_paged([70, 200, 20], page_size=8, group=2, head_dim=64,
                                   dtype=torch.float16, device="cuda", q_lens=[70, 150, 40]),
                [0, 30, 100], [70, 300, 130]),
         dict(num_splits=2, max_q_len=150, window_left=60, sinks=torch.linspace(-2, 2, 4, device="cuda"))),
        ("paged wgmma prefill (sm_90), bf16 d128 HND page 16, window, page tails NaN, 1 split",
         harness.make_paged([300, 40, 129], page_size=16, group=4, head_dim=128,
                            dtype=torch.bfloat16, device="cuda", q_lens=[130, 40, 3]),
         dict(num_splits=1, window_left=70)),
        ("paged wgmma prefill (sm_90), f16 d64 NHD page 8, non-causal, sinks, 1 split",
         harness.make_paged([200, 9], page_size=8, group=2, head_dim=64, dtype=torch.float16,
                            device="cuda", kv_layout="NHD", q_lens=[150, 9]),
         dict(num_splits=1, causal=False, sinks=torch.linspace(-2, 2, 4, device="cuda"))),
        ("paged wgmma prefill (sm_90) over shards (kv_offsets), bf16 d256 NHD page 64, window, 1 split",
         _Shard(harness.make_paged([300, 70], page_size=64, group=4, head_dim=256,
                                   dtype=torch.bfloat16, device="cuda", kv_layout="NHD",
                                   q_lens=[100, 90]),
                [50, 0], [450, 70]),
         dict(num_splits=1, window_left=90)),
        ("ragged non-causal, 1 split, strided",
         harness.make_ragged([65, 7], [65, 100], group=1, head_dim=64, dtype=torch.bfloat16,
                             device="cuda", strided=True), dict(num_splits=1, causal=False, max_q_len=65)),
    ]
    if len(sys.argv) > 1:
        cases = [case for case in cases if sys.argv[1] in case[0]]
    failed = 0
    for name, problem, options in cases:
        out, lse = problem.run(workspace, return_lse=True, **options)
        torch.cuda.synchronize()
        expected, _ = problem.reference(**options)
        error = float((out.cpu().double() - expected).abs().max()) if out.numel() else 0.0
        zero = int(workspace.counter_region().count_nonzero()) == 0
        ok = zero and error < 2e-2
        failed += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: max abs error {error:.2e}, counters zero: {zero}")
    failed += dirty_counter_cases(workspace, cases)
    return 1 if failed else 0


def dirty_counter_cases(workspace, cases):
    """Split launches over a counter region of 0xFF bytes and of num_splits - 1 counts: they
    must end, read and write in bounds, and report (DESIGN.md invariant 8). Returns failures."""
    failed = 0
    for name, problem, options in cases:
        if options.get("num_splits", 1) < 2:
            continue
        for label, value in (("0xFF", -1), ("num_splits - 1", options["num_splits"] - 1)):
            plan = problem.plan(workspace, **options)
            workspace.counter_region().view(torch.int32)[:plan.num_tiles] = value
            problem.run(workspace, **options)
            torch.cuda.synchronize()
            try:
                workspace.raise_if_error()
                reported = False
            except ValueError:
                reported = True
            torch.cuda.synchronize()
            zero = int(workspace.counter_region().count_nonzero()) == 0
            ok = reported and zero
            failed += not ok
            print(f"{'ok ' if ok else 'BAD'} dirty counters ({label}), {name}: reported {reported}, "
                  f"counters zero after: {zero}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
