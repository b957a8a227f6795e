"""What merge_states costs (issue 20: context parallelism merges n ranks' partials with it).

    PYTHONPATH=.device python3 tools/bench/merge_cost.py --device=cuda
    PYTHONPATH=bazel-bin/python python3 tools/bench/merge_cost.py --device=cpu

Shapes: Llama-3-70B's attention (64 qo heads, head_dim 128), bf16 partials
[n, total_q, 64, 128] and float32 LSE [n, total_q, 64], n = 2, 4, 8 (ranks), total_q = 1
(one decode), 64 (a decode batch) and 4096 (a prefill chunk). Beside each merge: the paged
decode whose ranks it merges (1M keys split over n ranks, page 16, 8 kv heads, only the
1M / n keys of one rank timed), so the merge's share of a context-parallel decode reads off
the table. Times: GPU microseconds per call from CUDA-graph replays and eager calls
(tools/bench/timing.py); wall time on the CPU. Bytes: what the merge must read and write.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import splitkv  # noqa: E402
from tools.bench.timing import time_graph_and_eager  # noqa: E402

_HEADS, _KV_HEADS, _HEAD_DIM, _PAGE = 64, 8, 128, 16
_RANKS = (2, 4, 8)
_TOTAL_Q = (1, 64, 4096)
_DECODE_KEYS = 1 << 20


def _merge_call(n, total_q, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(n * 7919 + total_q)
    outs = torch.randn(n, total_q, _HEADS, _HEAD_DIM, generator=g).to(dtype).to(device)
    lses = (4.0 * torch.randn(n, total_q, _HEADS, generator=g)).to(device)
    return lambda: splitkv.merge_states(outs, lses), outs, lses


def _rank_decode_call(n, device, dtype, workspace):
    """One rank's share of a 1-request decode over _DECODE_KEYS keys dealt over n ranks."""
    keys = _DECODE_KEYS // n
    pages = keys // _PAGE
    g = torch.Generator(device="cpu").manual_seed(n)
    cache = torch.randn(pages, 2, _KV_HEADS, _PAGE, _HEAD_DIM, generator=g).to(dtype).to(device)
    tables = torch.randperm(pages, generator=g).to(torch.int32).view(1, pages).to(device)
    seq_lens = torch.full((1,), keys, dtype=torch.int32, device=device)
    q = torch.randn(1, _HEADS, _HEAD_DIM, generator=g).to(dtype).to(device)
    out = torch.empty_like(q)
    return lambda: splitkv.paged_attention(q, cache, tables, seq_lens, workspace, out=out,
                                           max_q_len=1, return_lse=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", default="", help="Also write the rows to this JSON file.")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    total_qs = _TOTAL_Q if device.type == "cuda" else (1, 64)
    workspace = splitkv.Workspace(512 << 20, device) if device.type == "cuda" else None
    rows = []
    print(f"{'case':<34}{'graph us':>10}{'eager us':>10}{'GB/s (graph)':>14}")
    for n in _RANKS:
        for total_q in total_qs:
            call, outs, lses = _merge_call(n, total_q, device, dtype)
            call()
            t = time_graph_and_eager([call], device, warmup=3, iters=args.iters)
            moved = outs.numel() * outs.element_size() + lses.numel() * 4
            moved += outs[0].numel() * outs.element_size() + lses[0].numel() * 4
            seconds = t["graph_s"] or t["eager_s"]
            row = dict(case=f"merge_states n={n} total_q={total_q}", n=n, total_q=total_q,
                       graph_us=None if t["graph_s"] is None else t["graph_s"] * 1e6,
                       eager_us=t["eager_s"] * 1e6, bytes=moved, gb_per_s=moved / seconds / 1e9)
            rows.append(row)
            graph = "-" if row["graph_us"] is None else f"{row['graph_us']:.1f}"
            print(f"{row['case']:<34}{graph:>10}{row['eager_us']:>10.1f}{row['gb_per_s']:>14.1f}",
                  flush=True)
        if workspace is not None:
            call = _rank_decode_call(n, device, dtype, workspace)
            call()
            t = time_graph_and_eager([call], device, warmup=3, iters=args.iters)
            row = dict(case=f"rank decode 1 x {_DECODE_KEYS // n}", n=n, total_q=1,
                       graph_us=t["graph_s"] * 1e6 if t["graph_s"] else None,
                       eager_us=t["eager_s"] * 1e6, bytes=None, gb_per_s=None)
            rows.append(row)
            graph = "-" if row["graph_us"] is None else f"{row['graph_us']:.1f}"
            print(f"{row['case']:<34}{graph:>10}{row['eager_us']:>10.1f}{'':>14}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=str(torch.cuda.get_device_name() if device.type == "cuda" else "cpu"),
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
