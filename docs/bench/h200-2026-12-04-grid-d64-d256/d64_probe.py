"""d64 decode: the bulk kernel against the wgmma-order tiles (SPLITKV_D64_WGMMA_ORDER, read each
call) in one process, alternating; forced 1 split and the planned count. Run with the
experiment package (docs/bench/h200-2026-12-04-grid-d64-d256/wgmma_order_d64.patch)."""
import os
import sys

import torch

import splitkv
from tools.bench import inputs, timing

gen = torch.Generator(device="cuda").manual_seed(0)
ws = splitkv.Workspace(256 << 20, torch.device("cuda"))
shapes = [tuple(int(x) for x in s.split("x")) for s in (sys.argv[1:] or ["256x8192", "64x32768", "128x16384", "512x4096", "24x16384"])]
print("| shape | what | us | TB/s |\n|---|---|---|---|")
for batch, kv_len in shapes:
    q = inputs.randn((batch, 32, 64), torch.bfloat16, torch.device("cuda"), gen)
    k = inputs.randn((batch, 8, kv_len, 64), torch.bfloat16, torch.device("cuda"), gen)
    v = inputs.randn((batch, 8, kv_len, 64), torch.bfloat16, torch.device("cuda"), gen)
    nbytes = 2 * k.numel() * 2
    p = inputs.paged_copy(inputs.DecodeCopy(q, k, v), 16, "HND", gen)
    del k, v
    out = torch.empty_like(q)
    ref = None
    for what, env, splits in [("bulk, planned", None, None), ("bulk, 1 split", None, 1), ("wgmma-order, 1 split", "1", 1),
                              ("bulk, 1 split", None, 1), ("wgmma-order, 1 split", "1", 1), ("bulk, planned", None, None)]:
        if env:
            os.environ["SPLITKV_D64_WGMMA_ORDER"] = env
        else:
            os.environ.pop("SPLITKV_D64_WGMMA_ORDER", None)

        def call(s=splits):
            return splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, out=out, max_q_len=1,
                                           num_splits=s)
        out.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        if ref is None:
            ref = out.clone()
        err = float((out.float() - ref.float()).abs().max())
        t, _ = timing.time_calls([call], torch.device("cuda"), 3, 20)
        plan = splitkv.plan_paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, max_q_len=1, num_splits=splits)
        print(f"| {batch}x{kv_len} | {what} ({plan.num_splits}) | {t * 1e6:.1f} | {nbytes / t / 1e12:.2f} | diff {err:.1e}",
              flush=True)
    os.environ.pop("SPLITKV_D64_WGMMA_ORDER", None)
    del p, out, ref
    torch.cuda.empty_cache()
