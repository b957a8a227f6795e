"""Times the prototype (dlpack_exchange_proto.cc) against the per-call path's Python key and
lookup, on a tiny CPU paged call (1 x 16 keys, 4 heads, d64, float32, out= given).

    g++ -O2 -shared -fPIC -std=c++17 -I<pybind11 include> -I<python include> \
        -I<torch>/include dlpack_exchange_proto.cc -o proto$(python3-config --extension-suffix)
    PYTHONPATH=.:<cpu package> python3 time_proto.py [cpu|cuda]
"""
import sys
import timeit

import torch

import proto
import splitkv
from splitkv import _calls

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
dtype = torch.float32 if device == "cpu" else torch.bfloat16
q = torch.randn(1, 4, 64, dtype=dtype, device=device)
kv = torch.randn(4, 2, 4, 16, 64, dtype=dtype, device=device)
bt = torch.zeros(1, 2, dtype=torch.int32, device=device)
sl = torch.tensor([16], dtype=torch.int32, device=device)
out = torch.empty_like(q)
ws = splitkv.Workspace(16 << 20, device)
view = _calls.workspace_view(ws)
n = 200000


def py_key():
    return _calls._paged_key(q, kv, bt, sl, view[1], None, out, _calls._option_key(
        "HND", None, True, -1, 0.0, None, False, None, False), None)


def lookup():
    return _calls._paged_lookup(q, kv, bt, sl, ws, None, "HND", None, True, -1, 0.0, None, False,
                                out, None, False, None, None, None, None, None)


splitkv.paged_attention(q, kv, bt, sl, ws, out=out)
print(device, torch.__version__, torch.cuda.get_device_name() if device == "cuda" else "")
for name, f in [("python key", py_key), ("python lookup", lookup),
                ("dlpack meta x5", lambda: proto.meta(q, kv, bt, sl, out)),
                ("call overhead", lambda: proto.meta())]:
    best = min(timeit.timeit(f, number=n) for _ in range(5)) / n * 1e6
    print(f"{name:18s} {best:6.2f} us")
call = lambda: splitkv.paged_attention(q, kv, bt, sl, ws, out=out)  # noqa: E731
print(f"{'paged(out=)':18s} {min(timeit.timeit(call, number=20000) for _ in range(5)) / 20000 * 1e6:6.2f} us")
