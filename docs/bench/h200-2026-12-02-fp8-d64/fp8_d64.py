"""fp8 d64 decode A/B: argv: tag. bf16 and fp8 (planned splits), 64 / 8 heads (gpt-oss), d64,
page 16, HND. JSON lines, graph us, copies rotated past L2; each fp8 output checked against
the bf16 call on the dequantised cache (max abs diff)."""
import json, math, sys, torch, splitkv
sys.path.insert(0, "tools/bench")
import timing
dev = torch.device("cuda"); g = torch.Generator(device=dev); g.manual_seed(3)
ws = splitkv.Workspace(512 << 20, "cuda")
tag = sys.argv[1]
H, KVH, D = 64, 8, 64
for batch, n in ((1, 1024), (1, 4096), (8, 4096), (16, 4096), (16, 8192), (64, 4096), (1, 32768), (1, 131072)):
    pages = n // 16
    for dtype in ("bf16", "fp8"):
        elt = 1 if dtype == "fp8" else 2
        nbytes = batch * n * KVH * D * 2 * elt
        ncopies = max(2, min(24, math.ceil((400 << 20) / nbytes)))
        copies = []
        for c in range(ncopies):
            kv = torch.randn(batch * pages, 2, KVH, 16, D, dtype=torch.bfloat16, device=dev, generator=g)
            if dtype == "fp8":
                kv = kv.to(torch.float8_e4m3fn)
            bt = torch.randperm(batch * pages, device=dev, generator=g).to(torch.int32).view(batch, pages)
            sl = torch.full((batch,), n, dtype=torch.int32, device=dev)
            q = torch.randn(batch, H, D, dtype=torch.bfloat16, device=dev, generator=g)
            copies.append((q, kv, bt, sl, torch.empty_like(q)))
        kw = dict(k_scale=0.5, v_scale=0.5) if dtype == "fp8" else {}
        c0 = copies[0]
        s = splitkv.plan_paged_attention(c0[0], c0[1], c0[2], c0[3], ws, **kw).num_splits
        calls = [lambda c=c: splitkv.paged_attention(c[0], c[1], c[2], c[3], ws, out=c[4], **kw) for c in copies]
        for f in calls: f()
        err = 0.0
        if dtype == "fp8":
            ref = splitkv.paged_attention(c0[0], (c0[1].float() * 0.5).to(torch.bfloat16), c0[2], c0[3], ws)
            err = float((c0[4].float() - ref.float()).abs().max())
        sec, how = timing.time_calls(calls, dev, 5, 25)
        print(json.dumps(dict(tag=tag, d=D, dtype=dtype, batch=batch, kv=n, splits=s,
                              us=round(sec * 1e6, 3), gbs=round(nbytes / sec / 1e9, 1), err=err)), flush=True)
        del copies, calls
