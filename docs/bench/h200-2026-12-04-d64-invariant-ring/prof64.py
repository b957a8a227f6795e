"""One d64 paged decode shape, 3 calls (for ncu: --launch-skip 2 --launch-count 1)."""
import sys
import torch
import splitkv
from tools.bench import inputs
dev = torch.device("cuda")
gen = torch.Generator(device="cuda").manual_seed(0)
ws = splitkv.Workspace(512 << 20, dev)
batch, kv_len = (int(x) for x in sys.argv[1].split("x"))
inv = sys.argv[2] == "inv"
q = inputs.randn((batch, 32, 64), torch.bfloat16, dev, gen)
k = inputs.randn((batch, 8, kv_len, 64), torch.bfloat16, dev, gen)
v = inputs.randn((batch, 8, kv_len, 64), torch.bfloat16, dev, gen)
p = inputs.paged_copy(inputs.DecodeCopy(q, k, v), 16, "HND", gen)
for _ in range(3):
    splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, max_q_len=1, batch_invariant=inv)
torch.cuda.synchronize()
