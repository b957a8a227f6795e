"""Paged decode times (default and batch_invariant), one line a shape: for A/B across packages."""
import sys
import torch
import splitkv
from tools.bench import inputs, timing

dev = torch.device("cuda")
gen = torch.Generator(device="cuda").manual_seed(0)
ws = splitkv.Workspace(1024 << 20, dev)
tag = sys.argv[1]
for arg in sys.argv[2:]:
    hd, shape = arg.split(":")
    hd = int(hd)
    batch, kv_len = (int(x) for x in shape.split("x"))
    q = inputs.randn((batch, 32, hd), torch.bfloat16, dev, gen)
    k = inputs.randn((batch, 8, kv_len, hd), torch.bfloat16, dev, gen)
    v = inputs.randn((batch, 8, kv_len, hd), torch.bfloat16, dev, gen)
    p = inputs.paged_copy(inputs.DecodeCopy(q, k, v), 16, "HND", gen)
    del k, v
    out = torch.empty_like(q)
    res = {}
    modes = (False, True) if hd <= 128 else (False,)
    for _ in range(2):
        for inv in modes:
            def call(inv=inv):
                return splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, out=out,
                                               max_q_len=1, batch_invariant=inv)
            call()
            torch.cuda.synchronize()
            res.setdefault(inv, []).append(timing.time_calls([call], dev, 3, 20)[0])
    line = f"{tag} d{hd} {shape}: def {min(res[False]) * 1e6:.1f}"
    if True in res:
        line += f" inv {min(res[True]) * 1e6:.1f}"
    print(line, flush=True)
    del p, out
    torch.cuda.empty_cache()
