"""fp8 decode variants: argv: tag. For each shape: bf16 planned, fp8 planned, fp8 forced to
fill 3 CTAs an SM (396 CTAs). JSON lines, graph us, copies rotated past L2."""
import json, math, sys, torch, splitkv
sys.path.insert(0, "tools/bench")
import timing
dev = torch.device("cuda"); g = torch.Generator(device=dev); g.manual_seed(3)
ws = splitkv.Workspace(512 << 20, "cuda")
tag = sys.argv[1]
for batch, n in ((16, 4096), (16, 8192), (1, 32768), (64, 4096), (1, 131072), (4, 8192)):
    pages = n // 16
    for dtype in ("bf16", "fp8"):
        elt = 1 if dtype == "fp8" else 2
        nbytes = batch * n * 8 * 128 * 2 * elt
        ncopies = max(2, min(24, math.ceil((400 << 20) / nbytes)))
        copies = []
        for c in range(ncopies):
            kv = torch.randn(batch * pages, 2, 8, 16, 128, dtype=torch.bfloat16, device=dev, generator=g)
            if dtype == "fp8":
                kv = kv.to(torch.float8_e4m3fn)
            bt = torch.randperm(batch * pages, device=dev, generator=g).to(torch.int32).view(batch, pages)
            sl = torch.full((batch,), n, dtype=torch.int32, device=dev)
            q = torch.randn(batch, 32, 128, dtype=torch.bfloat16, device=dev, generator=g)
            copies.append((q, kv, bt, sl, torch.empty_like(q)))
        kw = dict(k_scale=0.5, v_scale=0.5) if dtype == "fp8" else {}
        c0 = copies[0]
        planned = splitkv.plan_paged_attention(c0[0], c0[1], c0[2], c0[3], ws, **kw).num_splits
        tiles = batch * 8
        fill3 = max(1, min(396 // tiles, n // 128))
        variants = [planned] if dtype == "bf16" or __import__("os").environ.get("PLANNED_ONLY") else sorted({planned, fill3})
        for s in variants:
            calls = [lambda c=c, s=s: splitkv.paged_attention(c[0], c[1], c[2], c[3], ws, out=c[4], num_splits=s, **kw) for c in copies]
            for f in calls: f()
            sec, how = timing.time_calls(calls, dev, 5, 25)
            print(json.dumps(dict(tag=tag, dtype=dtype, batch=batch, kv=n, splits=s, planned=s == planned,
                                  us=round(sec * 1e6, 3), gbs=round(nbytes / sec / 1e9, 1))), flush=True)
        del copies, calls
