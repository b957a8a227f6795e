"""Experiment (not committed): invariant decode cost per forced splits_per_cta (SPLITKV_X_G), same process."""
import os, statistics, sys
import torch
sys.path.insert(0, os.getcwd())
import splitkv
from tools.bench.timing import time_calls
from tools.bench.invariant_cost import _decode_calls

rows = [(1, 32768), (1, 131072), (2, 65536), (8, 4096), (8, 16384), (16, 4096), (16, 8192), (12, 8192),
        (24, 8192), (32, 8192), (64, 4096), (64, 8192)]
gs = [1, 2, 3, 4]
ws = splitkv.Workspace(8192 << 20, "cuda")
print("case          default " + " ".join(f"g={g:<6}" for g in gs) + " planned(g)", flush=True)
for b, n in rows:
    call = _decode_calls(b, n, torch.device("cuda"), ws)
    fns = {"d": call(False), "i": call(True)}
    os.environ.pop("SPLITKV_X_G", None)
    fns["d"](); fns["i"]()
    q_plan = None
    times = {k: [] for k in ["d"] + gs}
    for _ in range(3):
        os.environ.pop("SPLITKV_X_G", None)
        times["d"].append(time_calls([fns["d"]], torch.device("cuda"), warmup=3, iters=20)[0])
        for g in gs:
            os.environ["SPLITKV_X_G"] = str(g)
            times[g].append(time_calls([fns["i"]], torch.device("cuda"), warmup=3, iters=20)[0])
    os.environ.pop("SPLITKV_X_G", None)
    d = statistics.median(times["d"])
    cells = " ".join(f"{100 * (statistics.median(times[g]) / d - 1):+6.1f}%" for g in gs)
    print(f"{b:>3} x {n:<7} {d * 1e6:8.1f}us {cells}", flush=True)
