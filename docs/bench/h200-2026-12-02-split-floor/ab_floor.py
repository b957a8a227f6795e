"""A/B of the decode split floor: the same cells timed with whichever splitkv is on PYTHONPATH.
Prints one JSON line per cell: batch, kv_len, head_dim, dtype, planned num_splits, graph us.

    python3 ab_floor.py TAG [BATCHES [KV_LENS [FP8_HEAD_DIMS]]]   # comma lists

Defaults (the first call): batches 1,2,4,8,16, keys 256,512,1024,2048,4096, fp8 at every
head_dim. The second call passed 1,2,4,8,16 256,320,384,512; the third 1,4,16
512,1024,2048,4096 128."""
import json, math, sys, torch, splitkv
sys.path.insert(0, "tools/bench")
import timing
dev = torch.device("cuda")
g = torch.Generator(device=dev); g.manual_seed(1)
ws = splitkv.Workspace(256 << 20, "cuda")
tag = sys.argv[1]
def ints(i, default):
    return tuple(int(x) for x in sys.argv[i].split(",")) if len(sys.argv) > i else default
batches = ints(2, (1, 2, 4, 8, 16))
kv_lens = ints(3, (256, 512, 1024, 2048, 4096))
fp8_head_dims = ints(4, (64, 128, 256))
for d in (64, 128, 256):
    for dtype in ("bf16", "fp8"):
        if dtype == "fp8" and d not in fp8_head_dims: continue
        for batch in batches:
            for n in kv_lens:
                pages = n // 16
                elt = 1 if dtype == "fp8" else 2
                nbytes = batch * n * 8 * d * 2 * elt
                ncopies = max(2, min(48, math.ceil((160 << 20) / nbytes)))
                copies = []
                for c in range(ncopies):
                    kv = torch.randn(batch * pages, 2, 8, 16, d, dtype=torch.bfloat16, device=dev, generator=g)
                    if dtype == "fp8":
                        kv = kv.to(torch.float8_e4m3fn)
                    bt = torch.randperm(batch * pages, device=dev, generator=g).to(torch.int32).view(batch, pages)
                    sl = torch.full((batch,), n, dtype=torch.int32, device=dev)
                    q = torch.randn(batch, 32, d, dtype=torch.bfloat16, device=dev, generator=g)
                    copies.append((q, kv, bt, sl, torch.empty_like(q)))
                kw = dict(k_scale=0.5, v_scale=0.5) if dtype == "fp8" else {}
                c0 = copies[0]
                plan = splitkv.plan_paged_attention(c0[0], c0[1], c0[2], c0[3], ws, **kw)
                calls = [lambda c=c: splitkv.paged_attention(c[0], c[1], c[2], c[3], ws, out=c[4], **kw) for c in copies]
                for f in calls: f()
                sec, how = timing.time_calls(calls, dev, 5, 25)
                print(json.dumps(dict(tag=tag, d=d, dtype=dtype, batch=batch, kv=n, splits=plan.num_splits, us=round(sec * 1e6, 3))), flush=True)
                del copies, calls
