"""fp8 d64 decode, forced splits around the plan (gpt-oss: 64 / 8 heads, page 16, HND).
JSON lines: shape, splits, planned?, graph us."""
import json, math, sys, torch, splitkv
sys.path.insert(0, "tools/bench")
import timing
dev = torch.device("cuda"); g = torch.Generator(device=dev); g.manual_seed(5)
ws = splitkv.Workspace(512 << 20, "cuda")
H, KVH, D = 64, 8, 64
for batch, n in ((1, 4096), (4, 8192), (8, 4096), (16, 4096), (16, 8192), (1, 32768), (1, 131072), (32, 8192)):
    pages = n // 16
    nbytes = batch * n * KVH * D * 2
    copies = []
    for c in range(max(2, min(24, math.ceil((400 << 20) / nbytes)))):
        kv = torch.randn(batch * pages, 2, KVH, 16, D, dtype=torch.bfloat16, device=dev, generator=g).to(torch.float8_e4m3fn)
        bt = torch.randperm(batch * pages, device=dev, generator=g).to(torch.int32).view(batch, pages)
        sl = torch.full((batch,), n, dtype=torch.int32, device=dev)
        q = torch.randn(batch, H, D, dtype=torch.bfloat16, device=dev, generator=g)
        copies.append((q, kv, bt, sl, torch.empty_like(q)))
    kw = dict(k_scale=0.5, v_scale=0.5)
    c0 = copies[0]
    p = splitkv.plan_paged_attention(c0[0], c0[1], c0[2], c0[3], ws, **kw).num_splits
    for s in sorted({max(1, p // 2), p, 2 * p, 3 * p, 4 * p}):
        if s * 128 > n: continue
        calls = [lambda c=c, s=s: splitkv.paged_attention(c[0], c[1], c[2], c[3], ws, out=c[4], num_splits=s, **kw) for c in copies]
        for f in calls: f()
        sec, how = timing.time_calls(calls, dev, 5, 25)
        print(json.dumps(dict(batch=batch, kv=n, splits=s, planned=s == p, ctas=batch * KVH * s,
                              us=round(sec * 1e6, 2), tbs=round(nbytes / sec / 1e12, 2))), flush=True)
    del copies, calls
