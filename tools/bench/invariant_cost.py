"""The cost of batch_invariant: the same calls timed in the default mode and with
batch_invariant=True, side by side (GPU time per call from CUDA-graph replays, as bench.py;
wall time on the CPU).

    PYTHONPATH=.device python3 tools/bench/invariant_cost.py --device=cuda
    PYTHONPATH=bazel-bin/python python3 tools/bench/invariant_cost.py --device=cpu

Shapes: bf16, 32 qo / 8 kv heads, head_dim 128 (--head_dim picks 64, 128 or 256), page 16
(the bench's main shape); paged decode B x L (every request L keys) and causal ragged prefill
B x L (--kinds picks). Prints one row per case: microseconds per call in each mode (medians
over --rounds alternations of the two modes) and the invariant mode's slowdown in percent (the
median of the rounds' own), then each round's.
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import splitkv  # noqa: E402
from tools.bench.timing import time_calls  # noqa: E402

# 12 x 8192 and 8 x 16384: grids where the invariant plan's 2048-key splits run past one wave
# of the two-an-SM wgmma-order kernel (384 and 512 CTAs) and the default's fit one.
_DECODE = [(1, 32768), (1, 131072), (8, 4096), (8, 16384), (12, 8192), (16, 4096), (16, 8192), (24, 8192),
           (64, 4096)]
_PREFILL = [(1, 4096), (4, 4096), (8, 2048), (1, 16384)]
_CPU_DECODE = [(1, 8192), (8, 2048)]
_CPU_PREFILL = [(1, 2048)]


def _decode_calls(batch, kv_len, device, workspace, heads=(32, 8), head_dim=128, page=16):
    g = torch.Generator(device="cpu").manual_seed(batch * kv_len)
    pages = batch * (kv_len // page)
    cache = torch.randn(pages, 2, heads[1], page, head_dim, generator=g).to(torch.bfloat16).to(device)
    tables = torch.randperm(pages, generator=g).to(torch.int32).view(batch, kv_len // page).to(device)
    seq_lens = torch.full((batch,), kv_len, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads[0], head_dim, generator=g).to(torch.bfloat16).to(device)
    out = torch.empty_like(q)

    def call(invariant):
        return lambda: splitkv.paged_attention(q, cache, tables, seq_lens, workspace, out=out, max_q_len=1,
                                               batch_invariant=invariant)
    return call


def _prefill_calls(batch, length, device, workspace, heads=(32, 8), head_dim=128):
    g = torch.Generator(device="cpu").manual_seed(batch + length)
    total = batch * length
    q = torch.randn(total, heads[0], head_dim, generator=g).to(torch.bfloat16).to(device)
    k = torch.randn(total, heads[1], head_dim, generator=g).to(torch.bfloat16).to(device)
    v = torch.randn(total, heads[1], head_dim, generator=g).to(torch.bfloat16).to(device)
    cu = torch.arange(0, total + 1, length, dtype=torch.int32, device=device)
    out = torch.empty_like(q)

    def call(invariant):
        return lambda: splitkv.ragged_attention(q, k, v, cu, cu, workspace, out=out, max_q_len=length,
                                                batch_invariant=invariant)
    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--workspace_mb", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3,
                        help="Alternate the two modes this many times per case; the cost column is the median "
                             "of the rounds' costs, the range their spread (drift between device calls moved "
                             "single-round decode costs by 2-3 points).")
    parser.add_argument("--kinds", default="decode,prefill", help="Comma-separated: decode, prefill.")
    parser.add_argument("--head_dim", type=int, default=128, choices=[64, 128, 256])
    args = parser.parse_args()
    kinds = set(args.kinds.split(","))
    if not kinds <= {"decode", "prefill"}:
        parser.error(f"--kinds invalid: expected a comma-separated subset of decode,prefill, got {args.kinds!r}")
    device = torch.device(args.device)
    workspace = splitkv.Workspace(args.workspace_mb << 20, device)
    cases = ([("decode", b, n, _decode_calls) for b, n in (_DECODE if device.type == "cuda" else _CPU_DECODE)] +
             [("prefill", b, n, _prefill_calls) for b, n in (_PREFILL if device.type == "cuda" else _CPU_PREFILL)])
    cases = [c for c in cases if c[0] in kinds]
    if args.rounds < 1:
        parser.error(f"--rounds invalid: expected at least 1, got {args.rounds}")
    print(f"head_dim {args.head_dim}")
    print(f"{'case':<22}{'default us':>12}{'invariant us':>14}{'cost':>9}  rounds' costs")
    for kind, batch, length, make in cases:
        call = make(batch, length, device, workspace, head_dim=args.head_dim)
        fns = {invariant: call(invariant) for invariant in (False, True)}
        for fn in fns.values():
            fn()  # plans, raises the kernels' shared-memory limits: before any capture
        times = {False: [], True: []}
        for _ in range(args.rounds):
            for invariant, fn in fns.items():
                times[invariant].append(time_calls([fn], device, warmup=3, iters=args.iters)[0])
        costs = [100.0 * (inv / dflt - 1.0) for dflt, inv in zip(times[False], times[True])]
        spread = " ".join(f"{c:+.1f}" for c in costs)
        print(f"{kind + f' {batch} x {length}':<22}{statistics.median(times[False]) * 1e6:>12.1f}"
              f"{statistics.median(times[True]) * 1e6:>14.1f}{statistics.median(costs):>+8.1f}%  {spread}",
              flush=True)


if __name__ == "__main__":
    main()
