"""fp8 (e4m3) K/V prefill against the same call over bf16 K/V: causal ragged and paged (page 16,
HND) prefill, bf16 q, 32 qo / 8 kv heads, graph-replay GPU time per call (tools/bench/timing).
Prints JSON lines: case, kv dtype, us, TFLOP/s (causal: half the square)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
import splitkv  # noqa: E402
from tools.bench.timing import time_calls  # noqa: E402

dev = torch.device("cuda")
ws = splitkv.Workspace(1 << 30, "cuda")
g = torch.Generator(device="cpu").manual_seed(5)
for head_dim, batch, length in [(128, 4, 4096), (128, 1, 16384), (128, 8, 2048), (64, 4, 4096)]:
    total = batch * length
    q = torch.randn(total, 32, head_dim, generator=g).to(torch.bfloat16).to(dev)
    k = torch.randn(total, 8, head_dim, generator=g).to(dev)
    v = torch.randn(total, 8, head_dim, generator=g).to(dev)
    cu = torch.arange(0, total + 1, length, dtype=torch.int32, device=dev)
    page = 16
    pages = total // page
    tables = torch.arange(pages, dtype=torch.int32, device=dev).view(batch, length // page)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    flops = 4.0 * batch * length * length / 2 * 32 * head_dim
    for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        kk, vv = k.to(kv_dtype), v.to(kv_dtype)
        cache = torch.stack([kk.view(pages, page, 8, head_dim), vv.view(pages, page, 8, head_dim)], 1).transpose(2, 3)
        cache = cache.contiguous()  # [pages, 2, kv_heads, page, head_dim] (HND)
        scales = {} if kv_dtype == torch.bfloat16 else dict(k_scale=1.0, v_scale=1.0)
        calls = {
            "ragged": lambda: splitkv.ragged_attention(q, kk, vv, cu, cu, ws, out=out, max_q_len=length, **scales),
            "paged": lambda: splitkv.paged_attention(q, cache, tables, seq_lens, ws, cu_seqlens_q=cu, out=out,
                                                     max_q_len=length, **scales),
        }
        for name, fn in calls.items():
            fn()
            sec, _ = time_calls([fn], dev, warmup=3, iters=10)
            print(json.dumps(dict(case=f"{name} {batch} x {length} d{head_dim}", kv=str(kv_dtype).split(".")[-1],
                                  us=round(sec * 1e6, 1), tflops=round(flops / sec / 1e12, 1))), flush=True)
        del cache, kk, vv
    del q, k, v, out
    torch.cuda.empty_cache()
