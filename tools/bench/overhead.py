"""Host overhead per call: splitkv's eager calls beside torch SDPA and FlashInfer's run().

    ./tools/bazel run //tools/bench:overhead -- --device=cpu                 # this machine
    PYTHONPATH=.device python3 tools/bench/overhead.py --device=cuda         # GPU machine

Issue 15's figures, on tiny problems (the kernel takes a few microseconds, so what is
measured is the host's work):

- ``host us``: CPU time from entry to return of one call, ``time.perf_counter_ns`` around
  it, median over ``--iters`` calls. On the CPU backend the call is synchronous (it
  includes the tiny attention itself, as torch SDPA's figure does); on CUDA it is the
  enqueue only (the stream is synchronized every 64 calls, outside the timing, so the
  launch queue never fills).
- CUDA only, ``gpu us``: one call between two CUDA events (``eager``), or one replay of a
  graph holding that call (``graph``), median: the issue's eager and graph columns.

Rows: splitkv ``paged_attention`` / ``ragged_attention`` through the per-call path (the
layout cache hit, the usual case), their runners' ``run`` (``PagedAttentionRunner``,
``RaggedAttentionRunner``: the index tensors, workspace and options bound once), and
through the full path (``full path``: the cache
emptied before each call, as every call ran before issue 15); the C++ launcher alone
(``LaunchPagedAttention`` on a filled params struct: plan + validate + launch, plus the
pybind11 call); torch SDPA on the same tiny contiguous tensors; on CUDA FlashInfer's
``BatchDecodeWithPagedKVCacheWrapper.run()`` when ``import flashinfer`` works. With
``--issue_rows`` also the issue's table: decode 1 x 32768, 16 x 4096, 8 x 8192 (head_dim
128) and 64 x 4096 (head_dim 64), bf16, 32 qo / 8 kv heads, page 16, eager and graph.

A benchmark, not a test: nothing here asserts a time. Writes overhead.json and overhead.md
to --out_dir.
"""

import contextlib
import json
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__ in (None, "") and sys.path and os.path.abspath(sys.path[0]) == _HERE:
    sys.path[0] = os.path.dirname(os.path.dirname(_HERE))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import splitkv  # noqa: E402
from splitkv import _splitkv  # noqa: E402

try:  # absent before issue 15: then only the public calls are timed (a before/after run)
    from splitkv import _calls  # noqa: E402
except ImportError:
    _calls = None

FLAGS = flags.FLAGS
flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "Where to run; auto: cuda when present.")
flags.DEFINE_integer("iters", 2000, "Timed calls per row (the median is reported).")
flags.DEFINE_bool("issue_rows", False, "Also the issue's decode shapes, eager and graph (CUDA).")
flags.DEFINE_bool("flashinfer", True, "Time FlashInfer's decode run() when it imports (CUDA).")
flags.DEFINE_string("out_dir", "/tmp/splitkv_overhead", "Where overhead.json and overhead.md go.")

_SYNC_EVERY = 64


def _host_us(call, iters, cuda, before=None):
    """Median host time of `call` in microseconds; `before` runs untimed before each call."""
    for _ in range(min(50, iters)):
        call()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for i in range(iters):
        if before is not None:
            before()
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
        if cuda and i % _SYNC_EVERY == _SYNC_EVERY - 1:
            torch.cuda.synchronize()
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def _paired_us(a, b, iters, cuda=False):
    """Medians of `a` and `b` timed alternately, call by call: on a machine whose host speed
    drifts (a shared CPU machine's load; the H200 host's speed, which moved 2x between
    processes of one device call on 2026-12-04), both see the same speed, so their ratio is
    the figure to trust. CUDA: the stream is synchronized every _SYNC_EVERY pairs, untimed."""
    for _ in range(min(50, iters)):
        a()
        b()
    if cuda:
        torch.cuda.synchronize()
    times_a, times_b = [], []
    for i in range(iters):
        start = time.perf_counter_ns()
        a()
        middle = time.perf_counter_ns()
        b()
        times_b.append(time.perf_counter_ns() - middle)
        times_a.append(middle - start)
        if cuda and i % _SYNC_EVERY == _SYNC_EVERY - 1:
            torch.cuda.synchronize()
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(times_a) / 1e3, statistics.median(times_b) / 1e3


def _add_paired(rows, shape, name_a, a, name_b, b, iters, cuda):
    """A row of `a` and `b` interleaved call by call (see _paired_us), printed."""
    ours, theirs = _paired_us(a, b, iters, cuda)
    rows.append({"shape": shape, "impl": f"interleaved: {name_a} / {name_b}",
                 "host_us": ours, "peer_host_us": theirs, "ratio": ours / theirs})
    print(f"{shape:40s} interleaved: {name_a} {ours:.2f} us, {name_b} {theirs:.2f} us, "
          f"ratio {ours / theirs:.2f}", flush=True)


def _gpu_us(call, iters=30):
    """Median time between two CUDA events around one call (or replay)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters + 3):
        torch.cuda.synchronize()
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times[3:])


def _graph(call):
    """A CUDA graph replaying `call` (captured on a side stream after a warm-up there)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def _decode(batch, kv_len, heads, kv_heads, head_dim, page_size, dtype, device):
    """A paged decode problem with pages in a random order: the tensors of every call."""
    pages_per_seq = -(-kv_len // page_size)
    num_pages = batch * pages_per_seq
    kv_cache = torch.randn(num_pages, 2, kv_heads, page_size, head_dim, dtype=dtype, device=device)
    order = torch.randperm(num_pages, device=device).to(torch.int32)
    return {
        "q": torch.randn(batch, heads, head_dim, dtype=dtype, device=device),
        "kv_cache": kv_cache,
        "block_tables": order.view(batch, pages_per_seq).contiguous(),
        "seq_lens": torch.full((batch,), kv_len, dtype=torch.int32, device=device),
        "out": torch.empty(batch, heads, head_dim, dtype=dtype, device=device),
    }


def _flashinfer_decode(problem, use_tensor_cores, workspace_bytes=128 << 20):
    """FlashInfer's decode wrapper planned for `problem` (HND): its run() as a call."""
    import flashinfer
    q, kv_cache, block_tables = problem["q"], problem["kv_cache"], problem["block_tables"]
    batch, pages_per_seq = block_tables.shape
    _, _, kv_heads, page_size, head_dim = kv_cache.shape
    kv_len = int(problem["seq_lens"][0])
    device = q.device
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * pages_per_seq
    last = torch.full((batch,), kv_len - (pages_per_seq - 1) * page_size, dtype=torch.int32,
                      device=device)
    buffer = torch.empty(workspace_bytes, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        buffer, "HND", use_tensor_cores=use_tensor_cores)
    wrapper.plan(indptr, block_tables.flatten(), last, q.shape[1], kv_heads, head_dim, page_size,
                 q_data_type=q.dtype, kv_data_type=kv_cache.dtype)
    out = problem["out"]
    return lambda: wrapper.run(q, kv_cache, out=out)


def _splitkv_paged(problem, workspace):
    p = problem
    return lambda: splitkv.paged_attention(p["q"], p["kv_cache"], p["block_tables"],
                                           p["seq_lens"], workspace, out=p["out"])


def _rows_tiny(device, iters, cuda):
    """The tiny decode and prefill rows: per-call host time, splitkv and peers."""
    rows = []
    if cuda:
        dtype, heads, kv_heads, head_dim = torch.bfloat16, 32, 8, 128
    else:  # the issue's CPU problem: batch 1, 16 keys, 4 heads, head_dim 64
        dtype, heads, kv_heads, head_dim = torch.float32, 4, 4, 64
    workspace = splitkv.Workspace(64 << 20, device)
    decode = _decode(1, 16, heads, kv_heads, head_dim, 16, dtype, device)
    shape = f"decode 1 x 16, {heads}/{kv_heads} heads, d{head_dim}, {str(dtype)[6:]}"
    paged = _splitkv_paged(decode, workspace)

    def add(name, call, before=None, gpu=True):
        row = {"shape": shape, "impl": name, "host_us": _host_us(call, iters, cuda, before)}
        if cuda and gpu:
            row["eager_gpu_us"] = _gpu_us(call)
        rows.append(row)
        print(f"{shape:40s} {name:34s} host {row['host_us']:8.2f} us"
              + (f"  eager {row['eager_gpu_us']:7.2f} us" if "eager_gpu_us" in row else ""),
              flush=True)
        return row

    add("splitkv paged_attention(out=)", paged)
    p = decode
    add("splitkv paged_attention (new out)",
        lambda: splitkv.paged_attention(p["q"], p["kv_cache"], p["block_tables"], p["seq_lens"],
                                        workspace))
    runner = None
    if hasattr(splitkv, "PagedAttentionRunner"):  # absent before the runners (a before/after run)
        bound = splitkv.PagedAttentionRunner(workspace, p["block_tables"], p["seq_lens"])
        runner = lambda: bound.run(p["q"], p["kv_cache"], out=p["out"])  # noqa: E731
        add("splitkv PagedAttentionRunner.run(out=)", runner)
        _add_paired(rows, shape, "splitkv runner.run(out=)", runner,
                    "splitkv paged_attention(out=)", paged, iters, cuda)
    if _calls is not None:
        add("splitkv paged, full path", paged, before=_calls._layouts.clear, gpu=False)
        params, _, _ = _calls.paged_params(
            _calls.PAGED, p["q"], p["kv_cache"], p["block_tables"], p["seq_lens"], workspace,
            None, "HND", None, True, -1, 0.0, None, False, p["out"], None, launch=True)
        with torch.cuda.device(p["q"].device) if cuda else contextlib.nullcontext():
            add("C++ LaunchPagedAttention", lambda: _splitkv.LaunchPagedAttention(params),
                gpu=False)
            add("C++ PlanPagedAttention", lambda: _splitkv.PlanPagedAttention(params), gpu=False)
    if cuda:
        graph = _graph(paged)
        row = add("splitkv paged, graph replay", graph.replay)
        row["graph_gpu_us"] = row.pop("eager_gpu_us")
    if cuda:  # what torch's own per-call queries cost here, for reading the rows above
        event, q = torch.cuda.Event(), decode["q"]
        stream = torch.cuda.current_stream()
        for name, call in (("torch.cuda.current_stream()", torch.cuda.current_stream),
                           ("torch.cuda.current_device()", torch.cuda.current_device),
                           ("torch.cuda.is_current_stream_capturing()",
                            torch.cuda.is_current_stream_capturing),
                           ("torch.cuda.Event().record(stream)", lambda: event.record(stream)),
                           ("torch.empty_like(q)", lambda: torch.empty_like(q))):
            add(name, call, gpu=False)
    q4 = decode["q"].view(1, heads, 1, head_dim)
    k4 = torch.randn(1, kv_heads, 16, head_dim, dtype=dtype, device=device)
    v4 = torch.randn_like(k4)
    gqa = {"enable_gqa": True} if heads != kv_heads else {}
    sdpa = lambda: F.scaled_dot_product_attention(q4, k4, v4, **gqa)  # noqa: E731
    add("torch SDPA (contiguous)", sdpa)
    if not cuda:  # the issue's CPU target: splitkv (new out, as SDPA's) / SDPA, interleaved
        new_out = lambda: splitkv.paged_attention(  # noqa: E731
            p["q"], p["kv_cache"], p["block_tables"], p["seq_lens"], workspace)
        _add_paired(rows, shape, "splitkv (new out)", new_out, "SDPA", sdpa, iters, cuda)
        if runner is not None:
            runner_new_out = lambda: bound.run(p["q"], p["kv_cache"])  # noqa: E731
            _add_paired(rows, shape, "splitkv runner.run (new out)", runner_new_out, "SDPA", sdpa,
                        iters, cuda)
    if cuda and FLAGS.flashinfer:
        for tc in (False, True):
            name = f"FlashInfer decode run(){' tensor cores' if tc else ''}"
            try:
                run = _flashinfer_decode(decode, tc)
                add(name, run)
            except Exception as e:  # noqa: BLE001 - a missing or failing peer is a row's note
                rows.append({"shape": shape, "impl": name, "error": f"{type(e).__name__}: {e}"[:300]})
                print(f"{shape:40s} {name:34s} error {rows[-1]['error']}", flush=True)
                continue
            # Issue 15's comparison, free of the host's drift between rows.
            _add_paired(rows, shape, "splitkv paged_attention(out=)", paged, name, run, iters,
                        cuda)
            if runner is not None:
                _add_paired(rows, shape, "splitkv runner.run(out=)", runner, name, run, iters,
                            cuda)
    if cuda:
        _add_paired(rows, shape, "splitkv paged_attention(out=)", paged, "SDPA", sdpa, iters,
                    cuda)

    # Ragged prefill: one request of 16 queries over 16 keys.
    shape = f"prefill 1 x 16, {heads}/{kv_heads} heads, d{head_dim}, {str(dtype)[6:]}"
    q = torch.randn(16, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(16, kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    cu = torch.tensor([0, 16], dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    ragged = lambda: splitkv.ragged_attention(q, k, v, cu, cu, workspace, out=out,  # noqa: E731
                                              max_q_len=16)
    add("splitkv ragged_attention(out=)", ragged)
    if hasattr(splitkv, "RaggedAttentionRunner"):
        bound_ragged = splitkv.RaggedAttentionRunner(workspace, cu, cu, max_q_len=16)
        add("splitkv RaggedAttentionRunner.run(out=)",
            lambda: bound_ragged.run(q, k, v, out=out))
    if _calls is not None:
        add("splitkv ragged, full path", ragged, before=_calls._layouts.clear, gpu=False)
        params, _, _ = _calls.ragged_params(
            _calls.RAGGED, q, k, v, cu, cu, workspace, True, None, -1, 0.0, None, False, out, 16,
            launch=True)
        with torch.cuda.device(q.device) if cuda else contextlib.nullcontext():
            add("C++ LaunchRaggedAttention", lambda: _splitkv.LaunchRaggedAttention(params),
                gpu=False)
            add("C++ PlanRaggedAttention", lambda: _splitkv.PlanRaggedAttention(params), gpu=False)
    if cuda:  # where the ragged launch's host time goes: the sm_90 kernel's three tensor
        # maps (encoded every call) against the mma.sync kernel's launch (no maps)
        os.environ["SPLITKV_DISABLE_SM90"] = "1"
        try:
            add("splitkv ragged_attention(out=), SPLITKV_DISABLE_SM90=1", ragged)
        finally:
            del os.environ["SPLITKV_DISABLE_SM90"]
    q4, k4, v4 = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    sdpa_causal = lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, **gqa)  # noqa: E731
    add("torch SDPA causal (contiguous)", sdpa_causal)
    if cuda:
        _add_paired(rows, shape, "splitkv ragged_attention(out=)", ragged, "SDPA causal",
                    sdpa_causal, iters, cuda)
    return rows


def _rows_issue(device):
    """Issue 15's table: GPU time per call, eager and graph, splitkv and FlashInfer."""
    rows = []
    workspace = splitkv.Workspace(256 << 20, device)
    for batch, kv_len, head_dim in ((1, 32768, 128), (16, 4096, 128), (8, 8192, 128),
                                    (64, 4096, 64)):
        shape = f"decode {batch} x {kv_len} d{head_dim}"
        problem = _decode(batch, kv_len, 32, 8, head_dim, 16, torch.bfloat16, device)
        calls = {"splitkv": _splitkv_paged(problem, workspace)}
        if FLAGS.flashinfer:
            for tc in (True, False):
                try:
                    calls[f"FlashInfer{' tc' if tc else ''}"] = _flashinfer_decode(problem, tc)
                except Exception as e:  # noqa: BLE001
                    print(f"{shape}: FlashInfer{' tc' if tc else ''}: {type(e).__name__}: {e}"[:300])
        for name, call in calls.items():
            call()
            row = {"shape": shape, "impl": name, "eager_gpu_us": _gpu_us(call),
                   "host_us": _host_us(call, 200, True)}
            try:
                row["graph_gpu_us"] = _gpu_us(_graph(call).replay)
            except Exception as e:  # noqa: BLE001
                row["graph_error"] = f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            print(f"{shape:24s} {name:14s} eager {row['eager_gpu_us']:8.2f} us  graph "
                  f"{row.get('graph_gpu_us', float('nan')):8.2f} us  host {row['host_us']:7.2f} us",
                  flush=True)
        del problem, calls
        torch.cuda.empty_cache()
    return rows


def _markdown(rows):
    lines = ["| shape | implementation | host us / call | eager GPU us | graph GPU us |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = [f"{r[k]:.2f}" if k in r else "" for k in ("host_us", "eager_gpu_us", "graph_gpu_us")]
        if "error" in r:
            cells = [r["error"], "", ""]
        if "ratio" in r:
            peer = r["impl"].split(" / ", 1)[1]
            cells = [f"{r['host_us']:.2f} vs {peer} {r['peer_host_us']:.2f}: {r['ratio']:.2f} x", "", ""]
        lines.append(f"| {r['shape']} | {r['impl']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    device = FLAGS.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    torch.manual_seed(0)
    rows = _rows_tiny(device, FLAGS.iters, cuda)
    if cuda and FLAGS.issue_rows:
        rows += _rows_issue(device)
    info = {"device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    with open(os.path.join(FLAGS.out_dir, "overhead.json"), "w") as f:
        json.dump(info, f, indent=1)
    table = _markdown(rows)
    with open(os.path.join(FLAGS.out_dir, "overhead.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    app.run(main)
