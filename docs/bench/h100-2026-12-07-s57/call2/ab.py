"""Ragged/paged prefill kernel time (CUDA events, median of 7 x 10 calls), one package."""
import sys, statistics, torch, splitkv
dev = "cuda"
torch.manual_seed(0)
ws = splitkv.Workspace(1 << 30, dev)
def timeit(f):
    for _ in range(3): f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10): f()
        b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 10 * 1000)
    return statistics.median(ts)
H, KH = 32, 8
rows = []
for D, causal, batch, n, kind in [(128, True, 4, 4096, "bf16"), (128, True, 8, 2048, "bf16"), (128, True, 1, 16384, "bf16"),
                                  (128, True, 16, 1024, "bf16"), (128, False, 4, 4096, "bf16"), (64, True, 4, 4096, "bf16"),
                                  (64, True, 8, 2048, "bf16"), (128, True, 8, 2048, "fp8"), (128, True, 8, 2048, "paged")]:
    total = batch * n
    q = torch.randn(total, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(total, KH, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(total, KH, D, device=dev, dtype=torch.bfloat16)
    cu = torch.arange(0, total + 1, n, device=dev, dtype=torch.int32)
    if kind == "paged":
        P = 16; pp = n // P
        cache = torch.randn(batch * pp, 2, KH, P, D, device=dev, dtype=torch.bfloat16)
        bt = torch.randperm(batch * pp, device=dev, dtype=torch.int32).view(batch, pp)
        sl = torch.full((batch,), n, device=dev, dtype=torch.int32)
        f = lambda: splitkv.paged_attention(q, cache, bt, sl, ws, cu_seqlens_q=cu, max_q_len=n, causal=causal)
    elif kind == "fp8":
        k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        f = lambda: splitkv.ragged_attention(q, k8, v8, cu, cu, ws, causal=causal, max_q_len=n, k_scale=1.0, v_scale=1.0)
    else:
        f = lambda: splitkv.ragged_attention(q, k, v, cu, cu, ws, causal=causal, max_q_len=n)
    us = timeit(f)
    flops = 4 * batch * n * n * H * D * (0.5 if causal else 1.0)
    print(f"{kind:5s} d{D} {'causal' if causal else 'full  '} {batch:2d}x{n:<5d} {us:9.1f} us {flops / us / 1e6:7.1f} TFLOP/s", flush=True)
    cr = ws.counter_region().view(torch.int32)
    assert int(cr.abs().sum()) == 0, "counter region not zero"
