"""Wgmma-order ring depth probe: default and batch_invariant at the grid rule's stages
(SPLITKV_PROBE_RING unset) and at main's 3 (SPLITKV_PROBE_RING=3), alternating, one process;
bits of each mode compared across the two settings."""
import os
import sys
import torch
import splitkv
from tools.bench import inputs, timing

dev = torch.device("cuda")
gen = torch.Generator(device="cuda").manual_seed(0)
ws = splitkv.Workspace(1024 << 20, dev)


def setting(s):
    if not s:
        os.environ.pop("SPLITKV_PROBE_RING", None)
    else:
        os.environ["SPLITKV_PROBE_RING"] = str(s)


for arg in sys.argv[1:]:
    hd, shape = arg.split(":")
    hd = int(hd)
    batch, kv_len = (int(x) for x in shape.split("x"))
    q = inputs.randn((batch, 32, hd), torch.bfloat16, dev, gen)
    k = inputs.randn((batch, 8, kv_len, hd), torch.bfloat16, dev, gen)
    v = inputs.randn((batch, 8, kv_len, hd), torch.bfloat16, dev, gen)
    p = inputs.paged_copy(inputs.DecodeCopy(q, k, v), 16, "HND", gen)
    del k, v
    out = torch.empty_like(q)
    settings = [int(x) for x in os.environ["PROBE_SETTINGS"].split(",")] if "PROBE_SETTINGS" in os.environ else (
        [None, 3] if hd == 128 else [None, 3, 6, 12])
    res = {}
    bits = {}
    for rnd in range(2):
        for inv in (False, True):
            for s in settings:
                setting(s)

                def call(inv=inv):
                    return splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, out=out,
                                                   max_q_len=1, batch_invariant=inv)
                out.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                bits.setdefault((inv, s), out.clone())
                t = timing.time_calls([call], dev, 3, 20)[0]
                res.setdefault((inv, s), []).append(t)
    setting(None)
    line = f"d{hd} {shape}:"
    base = min(res[(False, 3)])
    for inv in (False, True):
        for s in settings:
            t = min(res[(inv, s)])
            line += f" {'inv' if inv else 'def'}@{s or 'rule'} {t * 1e6:.1f} ({100 * (t / base - 1):+.1f}%)"
    same = all(torch.equal(bits[(inv, s)], bits[(inv, 3)]) for inv in (False, True) for s in settings)
    nan = any(torch.isnan(b).any().item() for b in bits.values())
    line += f" | bits equal across stages: {same}, nan: {nan}"
    print(line, flush=True)
    del p, out, bits
    torch.cuda.empty_cache()
