"""Timing: CUDA events around CUDA-graph replays on the GPU, perf_counter on the CPU.

A measured "round" runs every input copy once (calls[0](), calls[1](), ...): rotating
through copies whose total exceeds the cache keeps repeated runs from timing the cache.
The figure is the median over rounds of the round's time divided by the number of calls.
"""

import statistics
import time

import torch


def _cuda_round_events(run_round, warmup, iters):
    for _ in range(warmup):
        run_round()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run_round()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def time_calls(calls, device, warmup, iters, use_graph=True):
    """Median seconds per call, and how it was timed ("graph", "events" or "wall").

    On CUDA the round is captured once in a CUDA graph, so launch gaps and Python overhead
    stay out of the figure; a call that cannot be captured falls back to events around an
    eager round. The calls must already have run once (compiled, handles created).
    """
    def run_round():
        for call in calls:
            call()

    if device.type != "cuda":
        for _ in range(warmup):
            run_round()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            run_round()
            times.append(time.perf_counter() - start)
        return statistics.median(times) / len(calls), "wall"

    method = "events"
    replay = run_round
    if use_graph:
        graph = _capture(run_round)
        if graph is not None:
            replay, method = graph.replay, "graph"
    times = _cuda_round_events(replay, warmup, iters)
    return statistics.median(times) / len(calls), method


def _capture(run_round):
    """A CUDA graph of one round, or None when a call cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            run_round()  # allocations made before capture are reused by it
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_round()
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:  # noqa: BLE001 - any capture failure: time eagerly instead
        torch.cuda.synchronize()
        return None


def copy_bandwidth(device, warmup, iters):
    """Bytes per second of a large copy_ (bytes read + bytes written over the time).

    CUDA: device to device, 1 GiB. CPU: one thread, 256 MiB (the figure BUILD_NOTES quotes).
    """
    if device.type == "cuda":
        nbytes = 1 << 30
        src = torch.randn(nbytes // 4, device=device)
        dst = torch.empty_like(src)
        seconds, _ = time_calls([lambda: dst.copy_(src)], device, warmup, iters, use_graph=False)
        return 2 * nbytes / seconds, "device-to-device copy_, 1 GiB"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        nbytes = 256 << 20
        src = torch.randn(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        seconds, _ = time_calls([lambda: dst.copy_(src)], device, warmup, max(iters, 5))
    finally:
        torch.set_num_threads(threads)
    return 2 * nbytes / seconds, "one-thread copy_, 256 MiB"
