"""Where the per-call path of a tiny CUDA paged decode spends its host time: the call's
median host time, its pieces one by one (workspace view, layout key, version bump, capture
query) and a cProfile of 3000 calls, sorted by own time.

    PYTHONPATH=.device python3 tools/gpu/paged_call_profile.py

Made for the host-time question left open in docs/perf_log.md 2026-12-03 (session 27): on the
H200's host the cached `paged_attention(out=)` took 28.9 us against 16.0 on 2026-12-01 (the
same process's C++ launch call, torch SDPA and FlashInfer's run() within 0-8 % of their
2026-12-01 figures), while the CPU backend's per-call path kept its time (6.9 us). Batch 1,
16 keys, 32 qo / 8 kv heads, head_dim 128, bf16, page 16 (overhead.py's tiny decode).
Answer (2026-12-04, perf_log): the host's speed, not the code: two processes of one device
call took 35.7 and 17.9 us a call, every piece in the same 2:1 ratio. Compare pieces within
one run only. `--import_flashinfer` imports FlashInfer first, as overhead.py's process does.
"""

import argparse
import cProfile
import pstats
import time

import torch

import splitkv
from splitkv import _calls
from splitkv import workspace as workspace_module


def _median_us(fn, n=3000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for i in range(n):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
        if i % 64 == 0:  # keep the launch queue short, outside the timing
            torch.cuda.synchronize()
    samples.sort()
    return samples[len(samples) // 2] / 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--import_flashinfer", action="store_true",
                        help="import flashinfer first (overhead.py runs it in the same process)")
    args = parser.parse_args()
    if args.import_flashinfer:
        import flashinfer  # noqa: F401
        print(f"flashinfer {flashinfer.__version__} imported")
    print(f"torch {torch.__version__}; torch-function modes on the stack "
          f"{torch._C._len_torch_function_stack()}; "
          f"dispatch modes {len(torch.utils._python_dispatch._get_current_dispatch_mode_stack())}")
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    q = torch.randn(1, 32, 128, dtype=torch.bfloat16, device=device)
    kv_cache = torch.randn(4, 2, 8, 16, 128, dtype=torch.bfloat16, device=device)
    block_tables = torch.zeros(1, 1, dtype=torch.int32, device=device)
    seq_lens = torch.tensor([16], dtype=torch.int32, device=device)
    workspace = splitkv.Workspace(64 << 20, device)
    out = torch.empty_like(q)

    def call():
        return splitkv.paged_attention(q, kv_cache, block_tables, seq_lens, workspace, out=out)

    print(f"paged_attention(out=)            {_median_us(call):8.2f} us host")
    print(f"layouts cached                   {len(_calls._layouts)}")
    view = _calls.workspace_view(workspace)
    print(f"workspace_view                  {_median_us(lambda: _calls.workspace_view(workspace)):8.2f} us"
          f"  (view reused: {_calls.workspace_view(workspace) is view})")
    options = _calls._option_key("HND", None, True, -1, 0.0, None, False, None, False)
    extras = _calls.extras(None, None, None, None, None)
    print(f"_paged_key                       "
          f"{_median_us(lambda: _calls._paged_key(q, kv_cache, block_tables, seq_lens, view[1], None, out, options, extras)):8.2f} us")
    print(f"written(out)                    {_median_us(lambda: _calls.written(out)):8.2f} us")
    print(f"is_current_stream_capturing()    {_median_us(torch.cuda.is_current_stream_capturing):8.2f} us")
    print(f"q.stride()                       {_median_us(q.stride):8.2f} us")
    print(f"q.data_ptr()                     {_median_us(q.data_ptr):8.2f} us")
    print(f"q.is_neg()                       {_median_us(q.is_neg):8.2f} us")
    print(f"torch.empty_like(q)              {_median_us(lambda: torch.empty_like(q)):8.2f} us")
    layout = next(iter(_calls._layouts.values()))
    addresses = (q.data_ptr(), kv_cache.data_ptr(), kv_cache[:, 1].data_ptr(), 0,
                 block_tables.data_ptr(), seq_lens.data_ptr(), 0, 0, 0, out.data_ptr(), 0)
    stream, index = torch.cuda.current_stream().cuda_stream, q.device.index
    print(f"layout.launch (C++ template)     "
          f"{_median_us(lambda: layout.launch(*addresses, view[2], stream, index, 1, 0, 0, None)):8.2f} us")
    print(f"layout.launch + stream order     "
          f"{_median_us(lambda: layout.launch(*addresses, view[2], stream, index, 1, 0, 0, view[4])):8.2f} us")
    print(f"_launch (stream order, launch)   "
          f"{_median_us(lambda: _calls.launch_layout(layout, addresses, workspace, view, 1, None, None)):8.2f} us")
    print(f"current_raw_stream               "
          f"{_median_us(lambda: workspace_module.current_raw_stream(0)):8.2f} us")
    event = torch.cuda.Event()
    cur = torch.cuda.current_stream()
    print(f"torch event.record(stream)       {_median_us(lambda: event.record(cur)):8.2f} us"
          "  (the per-call record before the C++ stream order)")
    print(f"torch.cuda.current_device()      {_median_us(torch.cuda.current_device):8.2f} us")
    profile = cProfile.Profile()
    profile.enable()
    for i in range(3000):
        call()
        if i % 64 == 0:
            torch.cuda.synchronize()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
