"""Quick check of the Hopper ragged prefill on the GPU machine: errors against float64 on a
few small problems (head_dim 128 and 64), then causal prefill TFLOP/s of the wgmma kernel
and of the mma.sync kernel (SPLITKV_DISABLE_SM90=1) in the same process.

    PYTHONPATH=.device_prefill:tests/python python3 tools/gpu/prefill_sm90_probe.py
"""

import os
import sys

import torch

import harness
import splitkv


def check(head_dim=128):
    workspace = splitkv.Workspace(64 << 20, "cuda")
    cases = [
        ("g4 bf16 causal", [37, 300, 129], [37, 300, 200], 4, torch.bfloat16, {}),
        ("g1 f16 noncausal", [130, 7], [130, 260], 1, torch.float16, dict(causal=False)),
        ("g8 bf16 window cap", [257, 64], [257, 500], 8, torch.bfloat16,
         dict(window_left=70, logits_soft_cap=2.0)),
        ("g2 f16 short kv", [200], [50], 2, torch.float16, {}),
    ]
    bad = 0
    for name, q_lens, kv_lens, group, dtype, opts in cases:
        problem = harness.make_ragged(q_lens, kv_lens, group=group, head_dim=head_dim, dtype=dtype,
                                      device="cuda")
        opts = dict(opts, sm_scale=head_dim ** -0.5)
        for disable in ("0", "1"):
            os.environ["SPLITKV_DISABLE_SM90"] = disable
            out, lse = problem.run(workspace, num_splits=1, return_lse=True, **opts)
            torch.cuda.synchronize()
            exp, exp_lse = problem.reference(**opts)
            err = float((out.cpu().double() - exp).abs().max())
            finite = torch.isfinite(exp_lse)
            lerr = float((lse.cpu().double()[finite] - exp_lse[finite]).abs().max())
            lse_inf_ok = bool(torch.equal(torch.isfinite(lse.cpu()), finite))
            ok = err < 2e-2 and lerr < 1e-3 and lse_inf_ok
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {name} d{head_dim} disable_sm90={disable}: out err {err:.2e}, "
                  f"lse err {lerr:.2e}, lse -inf rows match {lse_inf_ok}")
    os.environ["SPLITKV_DISABLE_SM90"] = "0"
    return bad


def bench(batch, seq_len, dtype=torch.bfloat16, heads=(32, 8), iters=20, head_dim=128):
    workspace = splitkv.Workspace(256 << 20, "cuda")
    hq, hk = heads
    total = batch * seq_len
    q = torch.randn(total, hq, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(total, hk, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(total, hk, head_dim, device="cuda", dtype=dtype)
    cu = torch.arange(0, total + 1, seq_len, device="cuda", dtype=torch.int32)
    flops = 4 * batch * hq * head_dim * seq_len * (seq_len + 1) / 2
    results = {}
    # PROBE_BENCH_ONLY=1 (A/B of builds, prefill_sm90_ab.sh): the wgmma kernel's time only.
    for disable in ("0",) if os.environ.get("PROBE_BENCH_ONLY") == "1" else ("1", "0"):
        os.environ["SPLITKV_DISABLE_SM90"] = disable
        run = lambda: splitkv.ragged_attention(q, k, v, cu, cu, workspace, causal=True,
                                               sm_scale=head_dim ** -0.5, max_q_len=seq_len)
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(iters):
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        t = sorted(times)[len(times) // 2]
        results[disable] = run()
        print(f"causal {batch} x {seq_len} d{head_dim} {str(dtype)[6:]} disable_sm90={disable}: {t:.3f} ms, "
              f"{flops / t / 1e9:.0f} TFLOP/s")
    if "1" in results:
        diff = float((results["0"].float() - results["1"].float()).abs().max())
        print(f"  max |wgmma - mma.sync| = {diff:.2e}")
    os.environ["SPLITKV_DISABLE_SM90"] = "0"


def main():
    print(torch.cuda.get_device_name())
    bad = 0 if os.environ.get("PROBE_BENCH_ONLY") == "1" else check(128) + check(64)
    bench(4, 4096)
    bench(1, 16384)
    bench(4, 4096, dtype=torch.float16)
    bench(4, 4096, head_dim=64)
    bench(1, 16384, head_dim=64)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
