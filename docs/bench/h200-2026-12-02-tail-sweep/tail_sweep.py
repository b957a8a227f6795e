"""Forced splits of decodes whose one-split grid is between one and three waves (the planner
plans 1 split once the tiles fill 80 % of a wave): does a split grid beat the tail? gpt-oss
heads at head_dim 64 (64 qo / 8 kv) and 32 / 8 at head_dim 128, bf16, page 16. JSON lines,
graph us (tools/bench/timing.py over input copies past L2)."""
import json, math, sys, torch, splitkv
sys.path.insert(0, "tools/bench")
import timing
dev = torch.device("cuda"); g = torch.Generator(device=dev); g.manual_seed(7)
ws = splitkv.Workspace(1024 << 20, "cuda")
cases = [  # (d, H, batch, n)
    (64, 64, 48, 4096), (64, 64, 64, 4096), (64, 64, 96, 4096), (64, 64, 128, 4096),
    (64, 64, 64, 8192), (64, 64, 128, 8192), (64, 64, 64, 2048),
    (128, 32, 64, 4096), (128, 32, 96, 4096), (128, 32, 64, 8192), (128, 32, 128, 4096)]
for D, H, batch, n in cases:
    KVH = 8
    pages = n // 16
    nbytes = batch * n * KVH * D * 2 * 2
    copies = []
    for c in range(max(2, min(24, math.ceil((400 << 20) / nbytes)))):
        kv = torch.randn(batch * pages, 2, KVH, 16, D, dtype=torch.bfloat16, device=dev, generator=g)
        bt = torch.randperm(batch * pages, device=dev, generator=g).to(torch.int32).view(batch, pages)
        sl = torch.full((batch,), n, dtype=torch.int32, device=dev)
        q = torch.randn(batch, H, D, dtype=torch.bfloat16, device=dev, generator=g)
        copies.append((q, kv, bt, sl, torch.empty_like(q)))
    c0 = copies[0]
    p = splitkv.plan_paged_attention(c0[0], c0[1], c0[2], c0[3], ws).num_splits
    for s in sorted({1, 2, 3, 4, 6, p}):
        calls = [lambda c=c, s=s: splitkv.paged_attention(c[0], c[1], c[2], c[3], ws, out=c[4], num_splits=s) for c in copies]
        for f in calls: f()
        sec, how = timing.time_calls(calls, dev, 5, 25)
        print(json.dumps(dict(d=D, heads=H, batch=batch, kv=n, splits=s, planned=s == p, ctas=batch * KVH * s,
                              us=round(sec * 1e6, 2), tbs=round(nbytes / sec / 1e12, 2))), flush=True)
    del copies, calls
    torch.cuda.empty_cache()
