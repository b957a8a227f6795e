"""d64 paged decode in one process: FlashInfer tensor-core decode, splitkv's bulk kernel
(planned), the wgmma-order tiles (SPLITKV_D64_WGMMA_ORDER, read each call) at forced split
counts, and batch-invariant mode; every config timed twice, alternating."""
import os
import sys

import torch

import splitkv
import flashinfer
from tools.bench import inputs, timing

gen = torch.Generator(device="cuda").manual_seed(0)
ws = splitkv.Workspace(512 << 20, torch.device("cuda"))
fi_ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
page = int(os.environ.get("PAGE", "16"))
shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[1:]]
print(f"page {page}")
for batch, kv_len in shapes:
    q = inputs.randn((batch, 32, 64), torch.bfloat16, torch.device("cuda"), gen)
    k = inputs.randn((batch, 8, kv_len, 64), torch.bfloat16, torch.device("cuda"), gen)
    v = inputs.randn((batch, 8, kv_len, 64), torch.bfloat16, torch.device("cuda"), gen)
    nbytes = 2 * k.numel() * 2
    p = inputs.paged_copy(inputs.DecodeCopy(q, k, v), page, "HND", gen)
    del k, v
    out = torch.empty_like(q)
    used = -(-kv_len // page)
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * used
    indices = p.block_tables[:, :used].reshape(-1).contiguous()
    last = torch.full((batch,), kv_len - (used - 1) * page, dtype=torch.int32, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(fi_ws, kv_layout="HND", use_tensor_cores=True)
    w.plan(indptr, indices, last, 32, 8, 64, page, q_data_type=q.dtype, kv_data_type=q.dtype)
    fi_out = torch.empty_like(q)
    planned = splitkv.plan_paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, max_q_len=1).num_splits
    configs = [("flashinfer tc", None, None, False), ("bulk planned", None, None, False)]
    for s in (1, 2, 4):
        configs.append((f"bulk {s}", None, s, False))
    for s in sorted({1, 2, 4, 8, planned}):
        configs.append((f"wgmma {s}", "1", s, False))
    rows = {}
    ref = None
    for rep in range(2):
        for what, env, splits, inv in configs:
            if env:
                os.environ["SPLITKV_D64_WGMMA_ORDER"] = env
            else:
                os.environ.pop("SPLITKV_D64_WGMMA_ORDER", None)
            if what == "flashinfer tc":
                def call():
                    return w.run(p.q, p.kv_cache, out=fi_out)
                o = fi_out
            else:
                def call(s=splits, inv=inv):
                    return splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, out=out,
                                                   max_q_len=1, num_splits=s, batch_invariant=inv)
                o = out
            o.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            if ref is None:
                ref = o.clone()
            err = float((o.float() - ref.float()).abs().max())
            t, _ = timing.time_calls([call], torch.device("cuda"), 3, 20)
            rows.setdefault(what, []).append((t, err))
    os.environ.pop("SPLITKV_D64_WGMMA_ORDER", None)
    fi_t = min(x[0] for x in rows["flashinfer tc"])
    line = [f"{batch}x{kv_len} (planned {planned})"]
    for what, ts in rows.items():
        t = min(x[0] for x in ts)
        line.append(f"{what} {t * 1e6:.1f}us {nbytes / t / 1e12:.2f}TB/s {100 * (fi_t / t - 1):+.1f}% d{max(x[1] for x in ts):.0e} [{ts[0][0]*1e6:.0f}/{ts[1][0]*1e6:.0f}]")
    print(" | ".join(line), flush=True)
    del p, out, ref, w
    torch.cuda.empty_cache()
