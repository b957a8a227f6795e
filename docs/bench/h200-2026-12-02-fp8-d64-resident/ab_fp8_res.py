"""Planned fp8 d64 decode, A/B of the fp8 d64 resident count (branch fp8-d64-resident): argv: tag. JSON lines (ab_report.py)."""
import json, math, sys, torch, splitkv
sys.path.insert(0, "tools/bench")
import timing
dev = torch.device("cuda"); g = torch.Generator(device=dev); g.manual_seed(11)
ws = splitkv.Workspace(1024 << 20, "cuda")
tag = sys.argv[1]
cases = [(64, 64, "fp8", b, n) for b, n in ((32, 8192), (16, 4096), (16, 8192), (8, 4096), (4, 8192), (20, 4096), (1, 32768), (1, 131072), (64, 4096), (1, 4096))]
for D, H, dtype, batch, n in cases:
    KVH = 8; pages = n // 16; elt = 1 if dtype == "fp8" else 2
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
    s = splitkv.plan_paged_attention(c0[0], c0[1], c0[2], c0[3], ws, **kw).num_splits
    calls = [lambda c=c: splitkv.paged_attention(c[0], c[1], c[2], c[3], ws, out=c[4], **kw) for c in copies]
    for f in calls: f()
    sec, how = timing.time_calls(calls, dev, 5, 25)
    print(json.dumps(dict(tag=tag, d=D, dtype=dtype, batch=batch, kv=n, splits=s, us=round(sec * 1e6, 2))), flush=True)
    del copies, calls
