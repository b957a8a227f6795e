"""Timing: CUDA events around CUDA-graph replays and around eager calls on the GPU,
perf_counter on the CPU.

A measured "round" runs every input copy once (calls[0](), calls[1](), ...): rotating
through copies whose total exceeds the cache keeps repeated runs from timing the cache.
The figure is the median over samples of the sample's time divided by the calls it ran.

On CUDA a sample is a graph of `reps` rounds (enough for about 2 ms of work, at most 50),
replayed once between two events, with the stream held by a sleep kernel while the host
queues the events and the replay: the figure is the GPU's time per call when calls run back
to back, as inside a serving step's graph, not the host's launch rate. (Events around one
replay of a one-call graph also timed the gap the GPU waited for the host's launch: up to
5 us of a 75 us decode call on the H200, for splitkv and its peers alike.)

The eager figure (`time_eager`) is the other end: one call from an idle GPU between two
events, so the host's work before the launch (Python, argument checks, planning done per
call) counts as it does for a caller outside a graph.
"""

import math
import statistics
import time

import torch

_TARGET_SAMPLE_S = 2e-3
_MAX_REPS = 50
_HOLD_CYCLES = 2_000_000  # ~1 ms of the GPU's clock: the host queues a sample meanwhile


def _cuda_samples(replay, calls_per_replay, warmup, iters):
    for _ in range(warmup):
        replay()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(_HOLD_CYCLES)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls_per_replay)
    return times


def time_calls(calls, device, warmup, iters, use_graph=True):
    """Median seconds per call, and how it was timed ("graph", "events" or "wall").

    On CUDA `reps` rounds are captured in one CUDA graph, so launch gaps and Python overhead
    stay out of the figure; a call that cannot be captured falls back to an eager round
    queued behind the same sleep ("events"). The calls must already have run once
    (compiled, handles created).
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

    if use_graph:
        reps = _reps(run_round)
        graph, _ = _capture(run_round, reps)
        if graph is not None:
            times = _cuda_samples(graph.replay, reps * len(calls), warmup, iters)
            return statistics.median(times), "graph"
    times = _cuda_samples(run_round, len(calls), warmup, iters)
    return statistics.median(times), "events"


def _reps(run_round):
    """Rounds per sample: about _TARGET_SAMPLE_S of GPU work, from one eager round."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(_HOLD_CYCLES)
    start.record()
    run_round()
    end.record()
    end.synchronize()
    round_s = max(start.elapsed_time(end) / 1e3, 1e-6)
    return max(1, min(_MAX_REPS, math.ceil(_TARGET_SAMPLE_S / round_s)))


def time_graph_and_eager(calls, device, warmup, iters):
    """Both figures of a row: dict(graph_s, eager_s, graph_error).

    graph_s: median seconds per call replayed from a CUDA graph (time_calls' figure), None
    on the CPU or when a call cannot be captured (graph_error then says why). eager_s: on
    CUDA time_eager's figure, on the CPU the wall time per call of a round.
    """
    if device.type != "cuda":
        seconds, _ = time_calls(calls, device, warmup, iters)
        return dict(graph_s=None, eager_s=seconds, graph_error="no CUDA graphs on the CPU")
    eager_s = time_eager(calls, warmup, iters)

    def run_round():
        for call in calls:
            call()

    # The same graph timing as time_calls' (kept apart so its fallback stays as it was).
    reps = _reps(run_round)
    graph, error = _capture(run_round, reps)
    if graph is None:
        return dict(graph_s=None, eager_s=eager_s, graph_error=error)
    times = _cuda_samples(graph.replay, reps * len(calls), warmup, iters)
    return dict(graph_s=statistics.median(times), eager_s=eager_s, graph_error=None)


def time_eager(calls, warmup, iters):
    """Median seconds of one call (CUDA), from the host's call to the end of its GPU work.

    Each sample starts from an idle GPU: an event, the call (copies rotated), an event, a
    synchronize. Host work before the launch shows as time, as for a caller outside a graph.
    """
    for i in range(warmup):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        calls[i % len(calls)]()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _capture(run_round, reps):
    """(A CUDA graph of `reps` rounds, None), or (None, why) when a call cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            run_round()  # allocations made before capture are reused by it
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                run_round()
        graph.replay()
        torch.cuda.synchronize()
        return graph, None
    except Exception as e:  # noqa: BLE001 - any capture failure: time eagerly instead
        torch.cuda.synchronize()
        text = f"{type(e).__name__}: {e}".strip().splitlines()
        return None, (text[0] if text else type(e).__name__)[:200]


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
