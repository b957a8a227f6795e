# Session 48 (CPU, this 2-core machine): the per-call Python path of paged_attention(out=) and
# ragged_attention(out=) on tiny calls, with the cached layouts' C++ launch stubbed out, so
# only the Python work is timed (us a call, 20,000 calls, three rounds).
#   PYTHONPATH=<built package> python3 python_path_split.py
import time, torch, splitkv
from splitkv import _calls
torch.manual_seed(0)
dev="cpu"
nh, nkv, d = 4, 4, 64
q1 = torch.randn(1, nh, d)
kv = torch.randn(4, 2, nkv, 16, d)
bt = torch.arange(4, dtype=torch.int32).view(1, 4)
sl = torch.tensor([16], dtype=torch.int32)
ws = splitkv.Workspace(16 << 20, dev)
out1 = torch.empty_like(q1)
q = torch.randn(16, nh, d); k = torch.randn(16, nkv, d); v = torch.randn(16, nkv, d)
cu = torch.tensor([0, 16], dtype=torch.int32)
out = torch.empty_like(q)
paged = lambda: splitkv.paged_attention(q1, kv, bt, sl, ws, out=out1)
ragged = lambda: splitkv.ragged_attention(q, k, v, cu, cu, ws, out=out, max_q_len=16)
for f in (paged, ragged): f()
# stub the launches so only Python work is timed
for key, lay in list(_calls._layouts.items()):
    lay.launch = lambda *a: True
def t(f, n=20000):
    for _ in range(200): f()
    s = time.perf_counter_ns()
    for _ in range(n): f()
    return (time.perf_counter_ns() - s) / n / 1000
for r in range(3):
    print("paged %.2f us  ragged %.2f us" % (t(paged), t(ragged)))
