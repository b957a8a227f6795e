"""After the tail rule (split_plan.h tail_split_workers): the planned split count against
forced 1 and 2 at head_dim 64 (gpt-oss heads 64 / 8, bf16, page 16) inside and at the edges
of the band (tiles in (396, 594]), graph us. JSON lines. Inputs from tools/bench/inputs.py."""
import json, os, sys, torch, splitkv
sys.path.insert(0, os.getcwd())
from tools.bench import inputs, shapes, timing
dev = torch.device("cuda"); g = torch.Generator(device=dev); g.manual_seed(11)
ws = splitkv.Workspace(1024 << 20, "cuda")
for batch, n in [(48, 4096), (52, 4096), (56, 4096), (64, 4096), (72, 4096), (76, 4096), (64, 16384), (56, 8192)]:
    case = shapes.DecodeCase(batch, n, head_dim=64, num_qo_heads=64, num_kv_heads=8)
    nbytes = inputs.kv_bytes(case, torch.bfloat16)
    copies = [inputs.paged_copy(c, 16, "HND", g)
              for c in inputs.decode_copies(case, torch.bfloat16, dev, inputs.num_copies(nbytes, 400 << 20, 24), g)]
    outs = [torch.empty_like(c.q) for c in copies]
    c0 = copies[0]
    p = splitkv.plan_paged_attention(c0.q, c0.kv_cache, c0.block_tables, c0.seq_lens, ws).num_splits
    for s in [None, 1, 2]:
        calls = [lambda c=c, o=o, s=s: splitkv.paged_attention(c.q, c.kv_cache, c.block_tables, c.seq_lens, ws,
                                                                out=o, num_splits=s) for c, o in zip(copies, outs)]
        for f in calls: f()
        sec, how = timing.time_calls(calls, dev, 5, 25)
        print(json.dumps(dict(d=64, heads=64, batch=batch, kv=n, tiles=batch * 8, splits=s or p, planned=s is None,
                              us=round(sec * 1e6, 2), tbs=round(nbytes / sec / 1e12, 2))), flush=True)
    del copies, outs, calls
    torch.cuda.empty_cache()
