"""Per-kernel CUDA time of fp8 vs bf16 ragged/paged prefill (torch.profiler), d128 32/8 heads causal."""
import sys, torch, splitkv
from torch.profiler import profile, ProfilerActivity
dev = "cuda"
torch.manual_seed(0)
H, KH, D = 32, 8, 128
ws = splitkv.Workspace(1 << 30, dev)
rows = []
for batch, n in [(4, 4096), (8, 2048), (1, 16384)]:
    total = batch * n
    q = torch.randn(total, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(total, KH, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(total, KH, D, device=dev, dtype=torch.bfloat16)
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    cu = torch.arange(0, total + 1, n, device=dev, dtype=torch.int32)
    for name, kk, vv, sc in [("bf16", k, v, {}), ("fp8", k8, v8, dict(k_scale=1.0, v_scale=1.0))]:
        f = lambda: splitkv.ragged_attention(q, kk, vv, cu, cu, ws, causal=True, max_q_len=n, **sc)
        for _ in range(5): f()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(10): f()
            torch.cuda.synchronize()
        per = {}
        for e in p.key_averages():
            if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0):
                t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                if t: per[e.key[:70]] = t / 10
        for kname, t in sorted(per.items(), key=lambda x: -x[1]):
            rows.append(f"ragged {batch}x{n} {name:5s} {t:9.1f} us  {kname}")
            print(rows[-1], flush=True)

# paged (HND, page 16, shuffled pages), cu_seqlens_q: chunked-prefill of the whole prompt
P = 16
for batch, n in [(4, 4096), (8, 2048)]:
    total = batch * n
    pages_per = n // P
    num_pages = batch * pages_per
    q = torch.randn(total, H, D, device=dev, dtype=torch.bfloat16)
    cache = torch.randn(num_pages, 2, KH, P, D, device=dev, dtype=torch.bfloat16)
    cache8 = cache.to(torch.float8_e4m3fn)
    bt = torch.randperm(num_pages, device=dev, dtype=torch.int32).view(batch, pages_per)
    sl = torch.full((batch,), n, device=dev, dtype=torch.int32)
    cu = torch.arange(0, total + 1, n, device=dev, dtype=torch.int32)
    for name, c, sc in [("bf16", cache, {}), ("fp8", cache8, dict(k_scale=1.0, v_scale=1.0))]:
        f = lambda: splitkv.paged_attention(q, c, bt, sl, ws, cu_seqlens_q=cu, max_q_len=n, **sc)
        for _ in range(5): f()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(10): f()
            torch.cuda.synchronize()
        per = {}
        for e in p.key_averages():
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if t: per[e.key[:70]] = t / 10
        for kname, t in sorted(per.items(), key=lambda x: -x[1]):
            print(f"paged {batch}x{n} {name:5s} {t:9.1f} us  {kname}", flush=True)
