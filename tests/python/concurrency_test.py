"""Concurrency, as documented (splitkv.Workspace, docs/bad_inputs.md):

- one Workspace, two threads at once: the second call is refused ("workspace in use"),
  never run on top of the first; every call that runs is right;
- a user's own uint8 buffer shared by two threads is tracked the same way (by its memory):
  a second call while one runs is refused; every call that runs is right;
- one workspace on two CUDA streams: the launches are serialized on the GPU (event waits);
- two workspaces on two threads (CPU) or two streams (CUDA) run at the same time, and both
  results are right (bitwise those of the same calls made one after the other).

Calls here are real: nothing holds the workspace artificially (workspace_test.py does).
"""

import re
import threading
import time

import pytest
import torch

import harness
import splitkv
from harness import DEVICES

_DTYPE = torch.bfloat16
_IN_USE = (r"(paged|ragged)_attention: workspace in use: expected a workspace no other call "
           r"is using, got one that another thread is using; use one Workspace per thread "
           r"\(and per CUDA stream\)")

def _problems(device):
    """Calls long enough (milliseconds on the CPU) for two threads to meet inside them;
    max_q_len given, so that no call syncs a CUDA stream."""
    return [
        (harness.make_paged([900, 400, 33], page_size=16, group=4, dtype=_DTYPE, device=device,
                            seed=31), {"num_splits": 4}),
        (harness.make_ragged([64, 3, 20], [500, 300, 20], group=2, dtype=_DTYPE, device=device,
                             seed=32), {"num_splits": 3, "max_q_len": 64}),
        (harness.make_paged([300, 70], page_size=4, group=2, q_lens=[9, 5], dtype=_DTYPE,
                            device=device, seed=33), {"num_splits": None, "max_q_len": 9}),
        (harness.make_ragged([128], [700], group=8, head_dim=128, dtype=_DTYPE, device=device,
                             seed=34), {"num_splits": 6, "max_q_len": 128}),
    ]


def _serial(problems, device):
    """Each call alone on a fresh workspace: the bits every concurrent run must give."""
    results = []
    for problem, options in problems:
        out, lse = problem.run(splitkv.Workspace(32 << 20, device), return_lse=True, **options)
        expected, expected_lse = problem.reference(**options)
        harness.assert_close(out, expected, _DTYPE)
        harness.assert_lse_close(lse, expected_lse)
        results.append((out, lse))
    return results


def _run_threads(work, count):
    """Runs work(i) on `count` threads started together; re-raises the first error."""
    errors = []
    barrier = threading.Barrier(count)

    def body(i):
        try:
            barrier.wait(10)
            work(i)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]


def _overlapped(spans):
    """True if a call of one thread ran while a call of another thread was running."""
    for i, mine in enumerate(spans):
        for theirs in spans[i + 1:]:
            if any(a < d and c < b for a, b in mine for c, d in theirs):
                return True
    return False


def test_workspace_docs_say_concurrent_calls_are_refused():
    doc = " ".join(splitkv.Workspace.__doc__.split())
    assert ("a call that finds this workspace's memory in use by another thread's call raises "
            "ValueError") in doc
    assert "Use one workspace per CUDA stream (or per thread on the CPU)" in doc


def test_one_workspace_two_threads_refused_never_wrong():
    problems = _problems("cpu")[:2]
    serial = _serial(problems, "cpu")
    workspace = splitkv.Workspace(32 << 20)
    done = [0, 0]
    refused = [0, 0]
    deadline = time.monotonic() + 60

    def work(i):
        problem, options = problems[i]
        # Retry on refusal, as a caller would, until this thread's calls have run and the
        # threads have met inside a call once.
        while (done[i] < 5 or sum(refused) == 0) and time.monotonic() < deadline:
            try:
                out, lse = problem.run(workspace, return_lse=True, **options)
            except ValueError as error:
                assert re.fullmatch(_IN_USE, str(error)), str(error)
                refused[i] += 1
                continue
            harness.assert_bitwise_equal(out, serial[i][0])
            harness.assert_bitwise_equal(lse, serial[i][1])
            done[i] += 1

    _run_threads(work, 2)
    harness.assert_counter_region_zero(workspace)
    assert min(done) >= 5, (done, refused)
    assert sum(refused) >= 1, "the two threads never met inside a call"


def test_user_buffer_two_threads_refused_never_wrong():
    # Tracked by its memory like a Workspace: a call while the other thread's runs is
    # refused as "in use", never run on top of it; the counters end at zero.
    problems = _problems("cpu")[:2]
    serial = _serial(problems, "cpu")
    raw = torch.zeros((32 << 20) + 255, dtype=torch.uint8)
    skip = -raw.data_ptr() % splitkv.WORKSPACE_ALIGNMENT
    buffer = raw[skip:skip + (32 << 20)]
    done = [0, 0]
    deadline = time.monotonic() + 60

    def work(i):
        problem, options = problems[i]
        while done[i] < 5 and time.monotonic() < deadline:
            try:
                out = problem.run(buffer, **options)
            except ValueError as error:
                message = str(error)
                assert re.fullmatch(_IN_USE, message), message
                continue
            harness.assert_bitwise_equal(out, serial[i][0])
            done[i] += 1

    _run_threads(work, 2)
    splitkv.check_counter_region(buffer)
    assert min(done) == 5, done


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_threads", [2, 4])
def test_workspaces_on_threads_run_together(device, num_threads):
    # Each thread (on CUDA: each with its own stream) has its own Workspace and runs every
    # problem, in its own order, several times: all results are the serial bits.
    harness.require(device)
    problems = _problems(device)
    serial = _serial(problems, device)
    spans = [[] for _ in range(num_threads)]
    results = [[] for _ in range(num_threads)]
    workspaces = [splitkv.Workspace(32 << 20, device) for _ in range(num_threads)]
    streams = [torch.cuda.Stream(device) if device == "cuda" else None for _ in workspaces]

    def work(i):
        order = [(i + j) % len(problems) for j in range(len(problems))] * 3
        for index in order:
            problem, options = problems[index]
            start = time.monotonic()
            if streams[i] is not None:
                with torch.cuda.stream(streams[i]):
                    out, lse = problem.run(workspaces[i], return_lse=True, **options)
            else:
                out, lse = problem.run(workspaces[i], return_lse=True, **options)
            spans[i].append((start, time.monotonic()))
            results[i].append((index, out, lse))
        if streams[i] is not None:
            streams[i].synchronize()

    _run_threads(work, num_threads)
    for i in range(num_threads):
        assert len(results[i]) == 3 * len(problems)
        for index, out, lse in results[i]:
            harness.assert_bitwise_equal(out, serial[index][0])
            harness.assert_bitwise_equal(lse, serial[index][1])
        harness.assert_counter_region_zero(workspaces[i])
    if device == "cpu":  # CUDA calls return at once; their kernels overlap on the device
        assert _overlapped(spans), "no two calls of different threads ran at the same time"


def _queue_on_streams(problems, workspaces, rounds, sleep_cycles=0):
    """One thread queues `rounds` calls on each of two new streams without syncing (round r
    runs problem (r + s) % len(problems) on stream s, with workspaces[s]). With sleep_cycles,
    each round first holds both streams on the GPU: stream 0 sleeps that long and stream 1
    waits for it, so the round's two calls are both queued before either may start, and
    without an order between them they would start at the same instant. Returns [(problem
    index, out, lse)] once the device is idle."""
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    results = []
    for round_ in range(rounds):
        if sleep_cycles:
            with torch.cuda.stream(streams[0]):
                torch.cuda._sleep(sleep_cycles)
            streams[1].wait_stream(streams[0])
        for s, stream in enumerate(streams):
            index = (round_ + s) % len(problems)
            problem, options = problems[index]
            with torch.cuda.stream(stream):
                out, lse = problem.run(workspaces[s], return_lse=True, **options)
            results.append((index, out, lse))
    torch.cuda.synchronize()
    return results


def _assert_serial_bits(results, serial):
    for index, out, lse in results:
        harness.assert_bitwise_equal(out, serial[index][0])
        harness.assert_bitwise_equal(lse, serial[index][1])


def _assert_counters_zero(workspace):
    if isinstance(workspace, splitkv.Workspace):
        harness.assert_counter_region_zero(workspace)
    else:
        splitkv.check_counter_region(workspace)


def _shared_buffer(kind):
    """A Workspace, or a user's 256-aligned zeroed uint8 buffer, of 32 MiB on the GPU."""
    if kind == "Workspace":
        return splitkv.Workspace(32 << 20, "cuda")
    raw = torch.zeros((32 << 20) + 256, dtype=torch.uint8, device="cuda")
    skip = -raw.data_ptr() % 256
    return raw[skip:skip + (32 << 20)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["Workspace", "user buffer"])
def test_one_workspace_two_streams_serialized(kind):
    # One thread queues calls on two streams sharing ONE workspace (a Workspace, or a user's
    # uint8 buffer: each view of its memory shares one stream order), without syncing: the
    # second stream's launch waits on the GPU for the first one's, so every result is the
    # serial bits and the counters end at zero.
    harness.require("cuda")
    problems = _problems("cuda")
    serial = _serial(problems, "cuda")
    workspace = _shared_buffer(kind)
    _assert_serial_bits(_queue_on_streams(problems, [workspace, workspace], 20), serial)
    _assert_counters_zero(workspace)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["Workspace", "user buffer"])
def test_one_workspace_two_streams_meeting_on_the_gpu(kind):
    # The calls above finish on the GPU before the host enqueues the next, so they would pass
    # unordered too. Here both streams are held on the GPU (~1 ms) until a round's two calls
    # are queued, then released together: two decodes of 16384 keys in 16 splits (128 CTAs
    # each, so both grids fit the GPU at once) over different data, or one of them beside a
    # short three-request split decode, on the same counters and partial slots. Unordered,
    # each tile's counter would count both launches' arrivals and merge a mix of their
    # partials (this test fails with the stream order switched off). Ordered, the later-
    # queued call waits for the other: the serial bits, every round, and the counters zero.
    harness.require("cuda")
    problems = [
        (harness.make_paged([16384], page_size=16, num_kv_heads=8, group=4, head_dim=128,
                            dtype=_DTYPE, device="cuda", seed=41), {"num_splits": 16}),
        (harness.make_paged([16384], page_size=16, num_kv_heads=8, group=4, head_dim=128,
                            dtype=_DTYPE, device="cuda", seed=43), {"num_splits": 16}),
        (harness.make_paged([2000, 700, 1500], page_size=16, num_kv_heads=8, group=4,
                            head_dim=128, dtype=_DTYPE, device="cuda", seed=42), {"num_splits": 8}),
    ]
    serial = [problem.run(splitkv.Workspace(32 << 20, "cuda"), return_lse=True, **options)
              for problem, options in problems]
    workspace = _shared_buffer(kind)
    results = _queue_on_streams(problems, [workspace, workspace], 6, sleep_cycles=2_000_000)
    _assert_serial_bits(results, serial)
    _assert_counters_zero(workspace)


@pytest.mark.gpu
def test_two_streams_one_thread_run_together():
    # One thread queues calls on two streams without syncing in between, each stream with
    # its own workspace; the GPU may run them at once. Every result is the serial bits.
    harness.require("cuda")
    problems = _problems("cuda")
    serial = _serial(problems, "cuda")
    workspaces = [splitkv.Workspace(32 << 20, "cuda") for _ in range(2)]
    _assert_serial_bits(_queue_on_streams(problems, workspaces, 20), serial)
    for workspace in workspaces:
        harness.assert_counter_region_zero(workspace)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_forked_child_is_not_refused_for_the_parents_calls():
    """A claim the parent's other thread held when the process forked is not the child's: the
    child's call on that memory meets the launch's own bytes (the C++ in-use word), which
    reset() clears. (Before, the copied claim refused every call and reset() in the child.)
    The launch is simulated by a claim the test takes itself, so the child never waits on a
    pool the fork cut off."""
    import os
    workspace = splitkv.Workspace(16 << 20, "cpu")
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    expected = problem.run(workspace)
    from splitkv import workspace as workspace_module
    key = workspace_module.busy_key(workspace.tensor)
    workspace_module.acquire("test", key)
    try:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                workspace.reset()
                status = 0 if torch.equal(problem.run(workspace), expected) else 2
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
    finally:
        workspace_module.release(key)
    assert os.WEXITSTATUS(status) == 0
