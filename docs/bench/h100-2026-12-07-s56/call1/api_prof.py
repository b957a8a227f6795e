"""Where the tiny ragged and paged calls' host time goes: torch.profiler (CUPTI) records every
CUDA runtime API call a call makes, splitkv's own included, with its CPU duration."""
import sys
import torch
import splitkv
from torch.profiler import profile, ProfilerActivity

dev = "cuda"
ws = splitkv.Workspace(64 << 20, dev)
q = torch.randn(16, 32, 128, dtype=torch.bfloat16, device=dev)
k = torch.randn(16, 8, 128, dtype=torch.bfloat16, device=dev)
v = torch.randn_like(k)
cu = torch.tensor([0, 16], dtype=torch.int32, device=dev)
out = torch.empty_like(q)
ragged = lambda: splitkv.ragged_attention(q, k, v, cu, cu, ws, out=out, max_q_len=16)
qd = torch.randn(1, 32, 128, dtype=torch.bfloat16, device=dev)
kv = torch.randn(1, 2, 8, 16, 128, dtype=torch.bfloat16, device=dev)
bt = torch.zeros(1, 1, dtype=torch.int32, device=dev)
sl = torch.tensor([16], dtype=torch.int32, device=dev)
outd = torch.empty_like(qd)
paged = lambda: splitkv.paged_attention(qd, kv, bt, sl, ws, out=outd)
for name, call in (("ragged", ragged), ("paged", paged)):
    for _ in range(200):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(200):
            call()
        torch.cuda.synchronize()
    print(f"==== {name} (200 calls)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
sys.stdout.flush()
