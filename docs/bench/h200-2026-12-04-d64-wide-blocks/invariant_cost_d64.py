"""d64 decode: default against batch_invariant=True, alternating, one process (package u13)."""
import sys
import torch
import splitkv
from tools.bench import inputs, timing
gen = torch.Generator(device="cuda").manual_seed(0)
ws = splitkv.Workspace(512 << 20, torch.device("cuda"))
for shape in sys.argv[1:]:
    batch, kv_len = (int(x) for x in shape.split("x"))
    q = inputs.randn((batch, 32, 64), torch.bfloat16, torch.device("cuda"), gen)
    k = inputs.randn((batch, 8, kv_len, 64), torch.bfloat16, torch.device("cuda"), gen)
    v = inputs.randn((batch, 8, kv_len, 64), torch.bfloat16, torch.device("cuda"), gen)
    p = inputs.paged_copy(inputs.DecodeCopy(q, k, v), 16, "HND", gen)
    del k, v
    out = torch.empty_like(q)
    res = {False: [], True: []}
    for _ in range(2):
        for inv in (False, True):
            def call(inv=inv):
                return splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, out=out, max_q_len=1,
                                               batch_invariant=inv)
            call(); torch.cuda.synchronize()
            res[inv].append(timing.time_calls([call], torch.device("cuda"), 3, 20)[0])
    d, i = min(res[False]), min(res[True])
    print(f"{shape} d64 p16: default {d * 1e6:.1f} us, invariant {i * 1e6:.1f} us ({100 * (i / d - 1):+.1f} %)", flush=True)
    del p, out
    torch.cuda.empty_cache()
