"""Forced splits of mid-batch decodes (tiles between a wave's 1/2 and 0.8): is a many-wave
split grid ever faster than one or two waves? JSON lines, graph us."""
import json, math, sys, torch, splitkv
sys.path.insert(0, "tools/bench")
import timing
dev = torch.device("cuda"); g = torch.Generator(device=dev); g.manual_seed(7)
ws = splitkv.Workspace(1024 << 20, "cuda")
cases = [  # (d, H, dtype, batch, n)
    (128, 32, "bf16", 12, 8192), (128, 32, "bf16", 24, 8192), (128, 32, "bf16", 32, 8192),
    (128, 32, "bf16", 24, 4096), (128, 32, "fp8", 24, 8192), (128, 32, "bf16", 10, 16384),
    (64, 64, "bf16", 20, 8192), (64, 64, "bf16", 32, 8192), (64, 64, "fp8", 32, 8192),
    (64, 64, "bf16", 24, 4096), (256, 32, "bf16", 12, 8192)]
for D, H, dtype, batch, n in cases:
    KVH = 8
    pages = n // 16
    elt = 1 if dtype == "fp8" else 2
    nbytes = batch * n * KVH * D * 2 * elt
    copies = []
    for c in range(max(2, min(24, math.ceil((400 << 20) / nbytes)))):
        kv = torch.randn(batch * pages, 2, KVH, 16, D, dtype=torch.bfloat16, device=dev, generator=g)
        if dtype == "fp8": kv = kv.to(torch.float8_e4m3fn)
        bt = torch.randperm(batch * pages, device=dev, generator=g).to(torch.int32).view(batch, pages)
        sl = torch.full((batch,), n, dtype=torch.int32, device=dev)
        q = torch.randn(batch, H, D, dtype=torch.bfloat16, device=dev, generator=g)
        copies.append((q, kv, bt, sl, torch.empty_like(q)))
    kw = dict(k_scale=0.5, v_scale=0.5) if dtype == "fp8" else {}
    c0 = copies[0]
    p = splitkv.plan_paged_attention(c0[0], c0[1], c0[2], c0[3], ws, **kw).num_splits
    for s in sorted({1, 2, 3, 4, 6, 8, p}):
        calls = [lambda c=c, s=s: splitkv.paged_attention(c[0], c[1], c[2], c[3], ws, out=c[4], num_splits=s, **kw) for c in copies]
        for f in calls: f()
        sec, how = timing.time_calls(calls, dev, 5, 25)
        print(json.dumps(dict(d=D, dtype=dtype, batch=batch, kv=n, splits=s, planned=s == p, ctas=batch * KVH * s,
                              us=round(sec * 1e6, 2), tbs=round(nbytes / sec / 1e12, 2))), flush=True)
    del copies, calls
