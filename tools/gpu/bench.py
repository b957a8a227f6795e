"""First speed figures of the CUDA backend: paged decode (TB/s of KV read) and ragged
causal prefill (TFLOP/s), on random bf16 data, with torch SDPA for context.

Each figure is the median of CUDA-event timings of single launches replayed from a CUDA
graph (so Python overhead stays out), after warm-up. Run on the GPU machine through
tools/gpu/run_checks.sh bench.
"""

import statistics

import torch
import torch.nn.functional as F

import splitkv


def time_graph(fn, reps=30, warmup=3):
    """Median milliseconds of one replay of a graph that calls fn once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_decode(workspace, batch, kv_len, *, num_qo_heads=32, num_kv_heads=8, head_dim=128,
                 page_size=16, layout="HND"):
    dtype = torch.bfloat16
    pages_per_seq = (kv_len + page_size - 1) // page_size
    num_pages = batch * pages_per_seq
    shape = ((num_pages, 2, num_kv_heads, page_size, head_dim) if layout == "HND"
             else (num_pages, 2, page_size, num_kv_heads, head_dim))
    cache = torch.randn(shape, device="cuda", dtype=dtype)
    block_tables = torch.randperm(num_pages, device="cuda").to(torch.int32).view(batch, pages_per_seq)
    seq_lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, num_qo_heads, head_dim, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    plan = splitkv.plan_paged_attention(q, cache, block_tables, seq_lens, workspace, kv_layout=layout,
                                        max_q_len=1)
    ms = time_graph(lambda: splitkv.paged_attention(q, cache, block_tables, seq_lens, workspace,
                                                    kv_layout=layout, out=out, max_q_len=1))
    kv_bytes = batch * kv_len * num_kv_heads * head_dim * 2 * 2
    return ms, kv_bytes / (ms * 1e-3) / 1e12, plan.num_splits


def bench_prefill(workspace, batch, seq_len, *, num_qo_heads=32, num_kv_heads=32, head_dim=128,
                  with_sdpa=True):
    dtype = torch.bfloat16
    total = batch * seq_len
    q = torch.randn(total, num_qo_heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(total, num_kv_heads, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(total, num_kv_heads, head_dim, device="cuda", dtype=dtype)
    cu = torch.arange(0, total + 1, seq_len, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    plan = splitkv.plan_ragged_attention(q, k, v, cu, cu, workspace, max_q_len=seq_len)
    ms = time_graph(lambda: splitkv.ragged_attention(q, k, v, cu, cu, workspace, out=out,
                                                     max_q_len=seq_len), reps=10)
    # Causal: half of the q x kv products, 2 matmuls of 2 flops per multiply-add.
    flops = batch * num_qo_heads * 4 * head_dim * seq_len * seq_len / 2
    sdpa = None
    if with_sdpa:
        qs, ks, vs = (x.view(batch, seq_len, -1, head_dim).transpose(1, 2) for x in (q, k, v))
        group = num_qo_heads // num_kv_heads
        if group > 1:
            ks, vs = ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1)
        sdpa_ms = time_graph(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True), reps=10)
        sdpa = flops / (sdpa_ms * 1e-3) / 1e12
    return ms, flops / (ms * 1e-3) / 1e12, plan.num_splits, sdpa


def main():
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs; splitkv cuda: "
          f"{splitkv.cuda_backend_available()}")
    workspace = splitkv.Workspace(256 << 20, "cuda")

    print("\npaged decode, bf16, 32 qo / 8 kv heads, head_dim 128 unless noted, page 16")
    print(f"{'shape':<34}{'splits':>7}{'ms':>10}{'TB/s':>8}")
    for batch, kv_len, extra in [(64, 4096, {}), (16, 8192, {}), (1, 32768, {}), (128, 2048, {}),
                                 (64, 4096, {"layout": "NHD"}), (64, 4096, {"head_dim": 64}),
                                 (32, 4096, {"head_dim": 256}), (64, 4096, {"num_kv_heads": 32}),
                                 (64, 4096, {"page_size": 1})]:
        ms, tbs, splits = bench_decode(workspace, batch, kv_len, **extra)
        label = f"{batch} x {kv_len}" + "".join(f" {k}={v}" for k, v in extra.items())
        print(f"{label:<34}{splits:>7}{ms:>10.3f}{tbs:>8.2f}")
        torch.cuda.empty_cache()

    print("\nragged causal prefill, bf16, head_dim 128 (torch SDPA on the same shape for context)")
    print(f"{'shape':<34}{'splits':>7}{'ms':>10}{'TFLOP/s':>9}{'SDPA':>8}")
    for batch, seq_len, extra in [(4, 4096, {}), (1, 16384, {}), (16, 1024, {}),
                                  (4, 4096, {"num_kv_heads": 8}), (4, 4096, {"head_dim": 64})]:
        ms, tflops, splits, sdpa = bench_prefill(workspace, batch, seq_len, **extra)
        label = f"{batch} x {seq_len}, 32 heads" + "".join(f" {k}={v}" for k, v in extra.items())
        sdpa_text = f"{sdpa:8.0f}" if sdpa else "       -"
        print(f"{label:<34}{splits:>7}{ms:>10.3f}{tflops:>9.0f}{sdpa_text}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
