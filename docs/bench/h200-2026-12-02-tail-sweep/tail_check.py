"""After the tail rule (split_plan.h tail_split_workers): the planned split count against
forced 1 and 2 at head_dim 64 (gpt-oss heads 64 / 8, bf16, page 16) inside and at the edges
of the band (tiles in (396, 594]), graph us. JSON lines."""
import json, math, sys, torch, splitkv
sys.path.insert(0, "tools/bench")
import timing
dev = torch.device("cuda"); g = torch.Generator(device=dev); g.manual_seed(11)
ws = splitkv.Workspace(1024 << 20, "cuda")
for batch, n in [(48, 4096), (52, 4096), (56, 4096), (64, 4096), (72, 4096), (76, 4096), (64, 16384), (56, 8192)]:
    D, H, KVH = 64, 64, 8
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
    for s in [None, 1, 2]:
        calls = [lambda c=c, s=s: splitkv.paged_attention(c[0], c[1], c[2], c[3], ws, out=c[4], num_splits=s) for c in copies]
        for f in calls: f()
        sec, how = timing.time_calls(calls, dev, 5, 25)
        print(json.dumps(dict(d=D, heads=H, batch=batch, kv=n, tiles=batch * KVH, splits=s or p, planned=s is None,
                              us=round(sec * 1e6, 2), tbs=round(nbytes / sec / 1e12, 2))), flush=True)
    del copies, calls
    torch.cuda.empty_cache()
