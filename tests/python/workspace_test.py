"""The workspace contract (DESIGN.md): one workspace, zeroed once, serves every call.

Counters live at bytes [0, 8 MiB) for paged and ragged calls alike and are zero after
every call; the softmax and scratch regions may hold anything (NaN) at a call's start;
results are bitwise the same on a reused and on a fresh workspace, and run after run.
"""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import harness
import splitkv
from harness import DEVICES

_DTYPE = torch.bfloat16


def _calls(device):
    """Interleaved paged and ragged calls of different sizes and split counts."""
    paged = lambda lens, **kw: harness.make_paged(lens, dtype=_DTYPE, device=device, **kw)
    ragged = lambda q, kv, **kw: harness.make_ragged(q, kv, dtype=_DTYPE, device=device, **kw)
    return [
        (paged([700, 33, 1], page_size=16, group=4, seed=1), {"num_splits": 4}),
        (ragged([40, 0, 9], [300, 12, 9], group=2, seed=2), {"num_splits": 3}),
        (paged([5, 17, 64, 2], page_size=1, group=8, q_lens=[2, 3, 1, 2], seed=3),
         {"num_splits": 7}),
        (ragged([130], [600], group=1, head_dim=128, seed=4), {"num_splits": None}),
        (paged([2048], page_size=64, group=8, head_dim=128, seed=5), {"num_splits": None}),
        (ragged([3, 70, 1], [3, 500, 250], group=4, seed=6),
         {"num_splits": 8, "window_left": 100, "logits_soft_cap": 2.0}),
        (paged([90, 300], page_size=16, group=4, q_lens=[70, 4], seed=7), {"num_splits": 2}),
        (ragged([5, 5], [5, 5], group=1, seed=8), {"num_splits": 1}),
        (paged([1, 1, 1, 1, 1], page_size=16, group=2, seed=9), {"num_splits": 5}),
        (ragged([256], [1024], group=8, head_dim=128, seed=10), {"num_splits": 6, "causal": False}),
    ]


def _run_checked(problem, workspace, options):
    """One call on a poisoned workspace and output; checks the contract and the values."""
    plan = problem.plan(workspace, **options)
    harness.assert_plan_keeps_counter_region(plan)
    assert plan.layout.required_bytes <= workspace.nbytes
    if options.get("num_splits") is not None:
        assert plan.num_splits == options["num_splits"]
    harness.fill_garbage(workspace, float("nan"))
    out = torch.full_like(problem.q, float("nan"))
    out, lse = problem.run(workspace, out=out, return_lse=True, **options)
    harness.assert_counter_region_zero(workspace)
    assert not torch.isnan(out).any(), "an output element was not written"
    assert not torch.isnan(lse).any()
    expected, expected_lse = problem.reference(**options)
    harness.assert_close(out, expected, _DTYPE)
    harness.assert_lse_close(lse, expected_lse)
    return plan, out, lse


@pytest.mark.parametrize("device", DEVICES)
def test_one_workspace_serves_interleaved_calls(device):
    harness.require(device)
    workspace = splitkv.Workspace(48 << 20, device)
    calls = _calls(device)
    first = [_run_checked(problem, workspace, options) for problem, options in calls]
    assert any(plan.num_splits > 1 for plan, _, _ in first)

    # Again, in reverse order, with other garbage in the scratch: bitwise the same.
    for (problem, options), (_, out, lse) in reversed(list(zip(calls, first))):
        harness.fill_garbage(workspace, 3.0e38)
        again, again_lse = problem.run(workspace, return_lse=True, **options)
        harness.assert_bitwise_equal(again, out)
        harness.assert_bitwise_equal(again_lse, lse)
        harness.assert_counter_region_zero(workspace)

    # And on fresh workspaces (all zero): bitwise the same as on the reused one.
    for (problem, options), (_, out, lse) in zip(calls, first):
        fresh = splitkv.Workspace(48 << 20, device)
        fresh_out, fresh_lse = problem.run(fresh, return_lse=True, **options)
        harness.assert_bitwise_equal(fresh_out, out)
        harness.assert_bitwise_equal(fresh_lse, lse)


@pytest.mark.parametrize("device", DEVICES)
def test_counter_range_is_fixed_whatever_the_call(device):
    harness.require(device)
    workspace = splitkv.Workspace(48 << 20, device)
    ranges = set()
    for problem, options in _calls(device):
        plan = problem.plan(workspace, **options)
        ranges.add(plan.layout.regions()["counter"])
        harness.assert_plan_keeps_counter_region(plan)
    assert ranges == {(0, splitkv.COUNTER_REGION_BYTES)}


@pytest.mark.parametrize("device", DEVICES)
def test_corrupted_counter_is_found(device):
    harness.require(device)
    workspace = splitkv.Workspace(16 << 20, device)
    problem = harness.make_paged([300, 40], page_size=16, group=4, dtype=_DTYPE, device=device)
    plan = problem.plan(workspace, num_splits=2)
    tile = plan.num_tiles - 1
    counters = workspace.counter_region().view(torch.int32)
    counters[tile] = 7

    with pytest.raises(ValueError, match=rf"check_counter_region: counter region not zero: "
                       rf"expected all 2097152 words \(counters and status record\) 0, got 1 nonzero, the first at index "
                       rf"{tile} \(byte {4 * tile}\) holding 7"):
        workspace.check_counter_region()
    with pytest.raises(ValueError, match="counter region not zero"):
        splitkv.check_counter_region(workspace.tensor)  # a plain uint8 tensor works too

    if device == "cpu":  # the CPU launcher checks the counters it will use (CUDA: dirty_counters_test)
        with pytest.raises(ValueError, match=rf"paged_attention: workspace counter region "
                           rf"corrupted: expected counter {tile} \(bytes {4 * tile}\.\."
                           rf"{4 * tile + 4}\) to be 0 at rest, got 7"):
            problem.run(workspace, num_splits=2)
        # Refused before any work, and the region zeroed: healed.
        assert int(counters.count_nonzero()) == 0

    counters[tile] = 0
    harness.assert_counter_region_zero(workspace)
    out = problem.run(workspace, num_splits=2)
    harness.assert_close(out, problem.reference()[0], _DTYPE)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_last_counter_is_checked(device):
    harness.require(device, backend=False)
    workspace = splitkv.Workspace(splitkv.COUNTER_REGION_BYTES, device)
    workspace.counter_region().view(torch.int32)[-1] = 1
    with pytest.raises(ValueError, match=r"the first at index 2097151 \(byte 8388604\)"):
        workspace.check_counter_region()


@pytest.mark.parametrize("device", DEVICES)
def test_workspace_buffer_is_aligned_and_zeroed(device):
    harness.require(device, backend=False)
    for nbytes in (splitkv.COUNTER_REGION_BYTES, (9 << 20) + 1, 12345678):
        workspace = splitkv.Workspace(nbytes, device)
        assert workspace.nbytes == nbytes
        assert workspace.tensor.numel() == nbytes and workspace.tensor.dtype == torch.uint8
        assert workspace.tensor.data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
        assert workspace.tensor.device.type == device
        assert int(workspace.tensor.count_nonzero()) == 0
        assert workspace.counter_region().numel() == splitkv.COUNTER_REGION_BYTES
        assert repr(workspace) == f"Workspace(nbytes={nbytes}, device='{workspace.device}')"


def test_workspace_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"Workspace: nbytes too small: expected >= 8388608 "
                       r"\(the counter region\), got 4096"):
        splitkv.Workspace(4096)
    with pytest.raises(TypeError, match=r"Workspace: nbytes has the wrong type: expected an int"):
        splitkv.Workspace(1.5e7)
    with pytest.raises(ValueError, match=r"^Workspace: nbytes too large: expected <= "
                       r"9223372036854775552 \(2\*\*63 - 256: torch sizes are int64\), got "
                       r"18446744073709551616$"):
        splitkv.Workspace(2**64)


@pytest.mark.parametrize("nbytes, got", [
    (torch.tensor(float(16 << 20)), "a torch.float32 tensor of shape ()"),
    (torch.tensor([16 << 20]), "a torch.int64 tensor of shape (1,)"),
    (torch.tensor(True), "a torch.bool tensor of shape ()"),  # would read as 1
    (torch.tensor(16 << 20), "a torch.int64 tensor of shape ()"),  # read silently before
    (np.array([16 << 20]), "array([16777216])"),
    (np.array(16 << 20), "array(16777216)"),
])
def test_workspace_refuses_a_tensor_or_array_size(nbytes, got):
    # As the int options refuse them: torch's or numpy's __index__ raised its own TypeError,
    # naming no argument, for a float or one-element 1-D one, and read a 0-d int one.
    with pytest.raises(TypeError, match="^" + re.escape(
            f"Workspace: nbytes has the wrong type: expected an int, got {got}") + "$"):
        splitkv.Workspace(nbytes)
    with pytest.raises(TypeError, match=r"^splitkv.integrations.transformers.register: "
                       r"workspace_bytes has the wrong type: expected an int, got "):
        splitkv.workspace.checked_nbytes("splitkv.integrations.transformers.register",
                                         "workspace_bytes", nbytes)
    assert splitkv.Workspace(np.int64(16 << 20)).nbytes == 16 << 20  # numpy's int scalar: an int


def _aligned_buffer(nbytes, device="cpu"):
    raw = torch.zeros(nbytes + 255, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % 256
    return raw[skip:skip + nbytes]


def test_check_counter_region_of_any_rank():
    # A workspace of any rank is its flat bytes: a 0-d one is 1 byte (was an IndexError), a
    # 2-D one is read from its first byte, whatever its first dimension.
    with pytest.raises(ValueError, match=r"^check_counter_region: workspace too small: need at "
                       r"least 8388608 bytes \(the counter region\), got 1$"):
        splitkv.check_counter_region(torch.zeros((), dtype=torch.uint8))
    buffer = _aligned_buffer(4 * splitkv.COUNTER_REGION_BYTES).view(4, -1)
    buffer[1, 0] = 7  # past the counter region: scratch bytes
    splitkv.check_counter_region(buffer)
    buffer[0, -1] = 7
    with pytest.raises(ValueError, match=r"counter region not zero: .* the first at index "
                       r"2097151 \(byte 8388604\) holding 117440512$"):
        splitkv.check_counter_region(buffer)
    with pytest.raises(ValueError, match=r"^check_counter_region: workspace device unsupported: "
                       r"expected a cpu or cuda tensor, got meta$"):  # was NotImplementedError
        splitkv.check_counter_region(torch.zeros(16 << 20, dtype=torch.uint8, device="meta"))


def test_check_every_call_with_a_2d_workspace(monkeypatch):
    # SPLITKV_CHECK_WORKSPACE=1 scans the counter region of a workspace of any rank: a 2-D
    # one's rows were scanned instead (its scratch too), and a split call that computed its
    # result raised torch's "only one element tensors can be converted to Python scalars".
    monkeypatch.setattr(splitkv.workspace, "CHECK_EVERY_CALL", True)
    buffer = _aligned_buffer(64 << 20).view(2, -1)
    problem = harness.make_paged([3000, 2000], page_size=16, group=2, dtype=_DTYPE)
    buffer.view(-1)[splitkv.COUNTER_REGION_BYTES:].view(torch.float32).fill_(float("nan"))
    for _ in range(2):  # the full path, then the per-call path
        out = problem.run(buffer, num_splits=8)
        harness.assert_close(out, problem.reference()[0], _DTYPE)
    buffer[0, 4] = 3
    with pytest.raises(ValueError, match=r"^paged_attention: workspace counter region not zero "
                       r"before the call: .* the first at index 1 \(byte 4\) holding 3; the region "
                       r"was reset to zero$"):
        problem.run(buffer, num_splits=8)
    splitkv.check_counter_region(buffer)
    # A 0-d or misaligned one is the launcher's to refuse, with its message (was an IndexError).
    with pytest.raises(ValueError, match=r"^paged_attention: workspace misaligned"):
        problem.run(_aligned_buffer(1 << 10)[64:][:1].view(()))


def test_workspace_rejects_bad_devices():
    refusals = [
        ("bogus", ValueError, r"Workspace: device is not a device: expected 'cpu', 'cuda', "
                              r"'cuda:N' or an int N >= 0, got 'bogus'"),
        (-1, ValueError, r"Workspace: device is not a device: expected 'cpu', 'cuda', 'cuda:N' or an "
                         r"int N >= 0, got -1"),
        ("meta", ValueError, r"Workspace: device unsupported: expected a cpu or cuda device, got 'meta'"),
        (1.0, TypeError, r"Workspace: device has the wrong type: expected a torch.device, a str or an "
                         r"int, got 1.0"),
        (True, TypeError, r"Workspace: device has the wrong type"),
    ]
    count = torch.cuda.device_count()
    if count == 0:
        refusals.append(("cuda", ValueError, r"Workspace: device is not available: expected a CUDA "
                                             r"device \(this process sees none\), got 'cuda'"))
    # The name and the int of a device the process lacks read alike (an int N is cuda:N).
    for missing in (f"cuda:{count}", count):
        refusals.append((missing, ValueError,
                         r"Workspace: device is not available: expected a CUDA device" +
                         (f" index below {count}, got 'cuda:{count}'" if count else
                          r" \(this process sees none\), got 'cuda:0'")))
    for device, error, message in refusals:
        with pytest.raises(error, match=message):
            splitkv.Workspace(splitkv.COUNTER_REGION_BYTES, device)
    assert splitkv.Workspace(splitkv.COUNTER_REGION_BYTES, torch.device("cpu")).device == torch.device("cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_user_buffer_is_accepted(device):
    # A caller's own uint8 tensor (256-aligned, zeroed) works like a Workspace.
    harness.require(device)
    raw = torch.zeros((24 << 20) + 255, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % 256
    buffer = raw[skip:skip + (24 << 20)]
    problem = harness.make_ragged([30, 8], [200, 8], group=4, dtype=_DTYPE, device=device)
    out, lse = problem.run(buffer, num_splits=4, return_lse=True)
    expected, expected_lse = problem.reference()
    harness.assert_close(out, expected, _DTYPE)
    harness.assert_lse_close(lse, expected_lse)
    splitkv.check_counter_region(buffer)


@contextlib.contextmanager
def _held_by_another_thread(workspace):
    """Holds `workspace` from another thread, the way a running call does, until exit."""
    entered, release = threading.Event(), threading.Event()

    def hold():
        with splitkv.workspace.exclusive("test", workspace):
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        entered.wait(10)
        yield
    finally:
        release.set()
        holder.join()


def test_workspace_in_use_by_another_thread_is_refused():
    workspace = splitkv.Workspace(16 << 20)
    problem = harness.make_ragged([4], [40], dtype=_DTYPE)
    with _held_by_another_thread(workspace):
        with pytest.raises(ValueError, match=r"ragged_attention: workspace in use: expected a "
                           r"workspace no other call is using, got one that another thread is "
                           r"using; use one Workspace per thread"):
            problem.run(workspace)
    out = problem.run(workspace)  # free again
    harness.assert_close(out, problem.reference()[0], _DTYPE)


def test_counter_region_entry_points_wait_for_no_call():
    # reset (and the checks) while another thread's call holds the workspace would zero its
    # counters under it (silent NaN rows, counters left nonzero): refused as a call is.
    workspace = splitkv.Workspace(16 << 20)
    problem = harness.make_ragged([4], [400], dtype=_DTYPE)
    with _held_by_another_thread(workspace):
        for name, entry in [("reset", workspace.reset),
                            ("check_workspace", workspace.raise_if_error),
                            ("check_counter_region", workspace.check_counter_region)]:
            with pytest.raises(ValueError, match=rf"{name}: workspace in use: expected a workspace "
                               r"no other call is using"):
                entry()
    workspace.reset()  # free again
    workspace.raise_if_error()
    out = problem.run(workspace, num_splits=3)
    harness.assert_close(out, problem.reference()[0], _DTYPE)
    workspace.check_counter_region()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("new_bytes", [1 << 20, 64 << 20, None])
def test_workspace_tensor_resized_in_place(device, new_bytes):
    # The fast path caches the workspace's C++ view: a resize_ of Workspace.tensor (the same
    # object, another address or size) must be seen by the next call, never a freed pointer
    # used (grow) or a buffer smaller than the counter region accepted (shrink).
    harness.require(device, _DTYPE, 64)
    workspace = splitkv.Workspace(16 << 20, device)
    problem = harness.make_ragged([6, 2], [700, 9], group=4, dtype=_DTYPE, device=device)
    expected = problem.reference()[0]
    harness.assert_close(problem.run(workspace, num_splits=3), expected, _DTYPE)
    if new_bytes is None:  # the same size and address, restrided: no longer contiguous
        workspace.tensor.as_strided_((16 << 20,), (0,))
        with pytest.raises(ValueError, match=r"ragged_attention: workspace is not contiguous"):
            problem.run(workspace, num_splits=3)
        return
    workspace.tensor.resize_(new_bytes)
    assert workspace.nbytes == new_bytes
    if new_bytes < splitkv.COUNTER_REGION_BYTES:
        with pytest.raises(ValueError, match=r"ragged_attention: workspace too small"):
            problem.run(workspace, num_splits=3)
        return
    workspace.tensor[splitkv.COUNTER_REGION_BYTES:].fill_(0xFF)  # bytes resize_ left unset
    if workspace.tensor.data_ptr() % splitkv.WORKSPACE_ALIGNMENT:  # the new storage's address
        with pytest.raises(ValueError, match=r"ragged_attention: workspace misaligned"):
            problem.run(workspace, num_splits=3)
        return
    for _ in range(2):  # the full path, then the fast path on the new address
        harness.assert_close(problem.run(workspace, num_splits=3), expected, _DTYPE)
        harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_stray_in_use_word_is_healed(device):
    # The status record's last word is a CPU launch's claim; stray bytes there (a buffer not
    # zeroed) are a dirty region like any other: refused and healed, never a workspace left
    # "in use" until reset. CUDA launches never read the word.
    harness.require(device, _DTYPE, 64)
    raw = torch.zeros((16 << 20) + 255, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % 256
    buffer = raw[skip:skip + (16 << 20)]
    problem = harness.make_ragged([6, 2], [700, 9], group=4, dtype=_DTYPE, device=device)
    expected = problem.reference()[0]
    in_use_word = buffer[:splitkv.COUNTER_REGION_BYTES].view(torch.int32)[-1:]
    for check in (lambda: problem.run(buffer, num_splits=3), lambda: splitkv.check_workspace(buffer)):
        in_use_word.fill_(7)
        if device == "cpu":
            with pytest.raises(ValueError, match=r"workspace counter region corrupted: expected its "
                               r"in-use word \(bytes 8388604..8388608\) to be 0 at rest, got 7; nothing "
                               r"was computed and the counter region was reset to zero"):
                check()
            assert int(buffer[:splitkv.COUNTER_REGION_BYTES].count_nonzero()) == 0
        else:
            check()
            in_use_word.zero_()
        harness.assert_close(problem.run(buffer, num_splits=3), expected, _DTYPE)
        splitkv.check_counter_region(buffer)
    if device == "cpu":
        # A launch's own claim value (bytes cloned from a workspace in use) reads as in use
        # until reset_counter_region, as the message says.
        in_use_word.fill_(0x53504B56)
        with pytest.raises(ValueError, match=r"ragged_attention: workspace in use: expected its "
                           r"in-use word .*\(if no launch is running, ResetCounterRegion / "
                           r"splitkv.reset_counter_region clears it\); nothing was computed"):
            problem.run(buffer, num_splits=3)
        splitkv.reset_counter_region(buffer)
        harness.assert_close(problem.run(buffer, num_splits=3), expected, _DTYPE)
        splitkv.check_counter_region(buffer)


def test_plans_beside_another_threads_call():
    # A plan writes nothing to the workspace: it is made while another thread's call holds
    # the workspace, and is the plan the call would run.
    workspace = splitkv.Workspace(16 << 20)
    ragged = harness.make_ragged([6, 2], [700, 9], group=4, dtype=_DTYPE)
    paged = harness.make_paged([900, 40], page_size=16, group=4, dtype=_DTYPE)
    free = [p.plan(workspace, num_splits=3) for p in (ragged, paged)]
    with _held_by_another_thread(workspace):
        held = [p.plan(workspace, num_splits=3) for p in (ragged, paged)]
    for a, b in zip(free, held):
        assert (a.num_splits, a.num_tiles, a.layout.regions()) == (b.num_splits, b.num_tiles,
                                                                   b.layout.regions())
        assert a.num_splits == 3


def test_stream_order_is_recorded_when_the_held_call_raises(monkeypatch):
    # check_workspace that heals a dirty region enqueues the reset and then raises: on CUDA the
    # next launch from another stream must still wait for that reset, so the workspace's
    # stream order is recorded on the way out of an error too. (A recording stand-in for
    # the C++ StreamOrder, on a CPU buffer: the order is the same code on both devices.)
    calls = []

    class Recorder:
        def Before(self, stream):
            calls.append("before")
            return True

        def After(self, stream):
            calls.append("after")

    monkeypatch.setattr(splitkv.workspace, "stream_order", lambda key, device: Recorder())
    monkeypatch.setattr(splitkv.workspace, "current_raw_stream", lambda index: 0)
    workspace = splitkv.Workspace(16 << 20)
    workspace.counter_region().view(torch.int32)[-64] = 5  # the status record's code word
    with pytest.raises(ValueError, match=r"check_workspace: workspace counter region corrupted"):
        splitkv.check_workspace(workspace)
    assert calls == ["before", "after"]
    harness.assert_counter_region_zero(workspace)


def test_user_tensor_in_use_by_another_thread_is_refused():
    # A user's uint8 buffer is tracked by its memory: a call on another view of the same
    # memory is refused while the first call runs, rather than racing on the counters.
    raw = torch.zeros((16 << 20) + 256, dtype=torch.uint8)
    skip = -raw.data_ptr() % 256
    buffer = raw[skip:skip + (16 << 20)]
    problem = harness.make_ragged([4], [40], dtype=_DTYPE)
    with _held_by_another_thread(buffer):
        with pytest.raises(ValueError, match=r"ragged_attention: workspace in use"):
            problem.run(raw[skip:skip + (12 << 20)])  # another view of the same memory
    out = problem.run(buffer)
    harness.assert_close(out, problem.reference()[0], _DTYPE)
    splitkv.check_counter_region(buffer)


def test_threads_with_their_own_workspaces():
    # The launchers release the GIL; calls from two threads, each with its own workspace,
    # give the same bits as the same calls made one after the other.
    problems = [harness.make_paged([900, 40], page_size=16, group=4, dtype=_DTYPE, seed=21),
                harness.make_ragged([64, 3], [500, 3], group=2, dtype=_DTYPE, seed=22)]
    serial = [p.run(splitkv.Workspace(16 << 20), num_splits=3) for p in problems]
    results = [[] for _ in problems]
    errors = []

    def work(i):
        try:
            workspace = splitkv.Workspace(16 << 20)
            for _ in range(5):
                results[i].append(problems[i].run(workspace, num_splits=3))
            harness.assert_counter_region_zero(workspace)
        except Exception as error:  # re-raised in the test's thread below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(problems))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for expected, got in zip(serial, results):
        assert len(got) == 5
        for out in got:
            harness.assert_bitwise_equal(out, expected)


_THREADS_ENV_SCRIPT = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
import conftest  # makes splitkv importable as the parent's was (plain pytest: the built extension)
import torch, splitkv
workspace = splitkv.Workspace(16 << 20)
q, kv = torch.randn(1, 2, 64), torch.randn(1, 2, 2, 16, 64)
table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.tensor([16], dtype=torch.int32)
for attempt in range(2):  # the pool is not made: the next call reads the variable again
    try:
        splitkv.paged_attention(q, kv, table, lens, workspace)
    except ValueError as error:
        print(error)
splitkv.check_counter_region(workspace)
"""


@pytest.mark.parametrize("value", ["abc", "0", "-1", "2.5", "100000", " 3"])
def test_bad_thread_count_variable_is_refused(value):
    # SPLITKV_NUM_THREADS was read with atoi: "abc", "0" and "-1" fell back to the hardware's
    # count silently, "2.5" gave 2, "100000" failed every call with a thread error naming
    # nothing. Each is now a ValueError naming the variable, on every CPU call, the counters
    # untouched. (In a subprocess: the pool is made once per process.)
    env = dict(os.environ, SPLITKV_NUM_THREADS=value)
    paths = [str(pathlib.Path(__file__).parent)] + sys.path
    run = subprocess.run([sys.executable, "-c", _THREADS_ENV_SCRIPT, json.dumps(paths)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    message = (f"splitkv cpu: SPLITKV_NUM_THREADS invalid: expected an int in [1, 1024] (or "
               f"unset), got '{value}'")
    assert run.stdout.splitlines() == [message, message]


def _worker_call(workspace, problem_tensors):
    """A spawned process's call on the workspace it was sent (module level: picklable)."""
    q, kv_cache, block_tables, seq_lens = problem_tensors
    out = splitkv.paged_attention(q, kv_cache, block_tables, seq_lens, workspace, num_splits=3)
    return out, workspace.tensor.data_ptr() % splitkv.WORKSPACE_ALIGNMENT


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("used", [False, True])
@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle", "send"])
def test_workspace_copies_are_new_zeroed_aligned_workspaces(device, how, used):
    """copy, deepcopy and pickle make a new Workspace of the same size and device, aligned and
    zeroed (a pickled buffer came back 64-byte aligned and was refused as misaligned; a used
    one did not pickle at all: its cached C++ view). "send" is torch.multiprocessing's
    pickler, which shares a CUDA tensor's memory by IPC: the device goes as an empty tensor."""
    harness.require(device)
    make = harness.copier(how)
    workspace = splitkv.Workspace(16 << 20, device)
    problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE, device=device)
    expected = problem.run(workspace, num_splits=3)
    if not used:
        workspace = splitkv.Workspace(16 << 20, device)
    made = make(workspace)
    assert isinstance(made, splitkv.Workspace) and made is not workspace
    assert (made.nbytes, made.device) == (workspace.nbytes, workspace.device)
    assert made.tensor.data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
    assert made.tensor.untyped_storage().data_ptr() != workspace.tensor.untyped_storage().data_ptr()
    harness.assert_counter_region_zero(made)
    assert torch.equal(problem.run(made, num_splits=3), expected)
    harness.assert_counter_region_zero(made)


def test_workspace_sent_to_a_spawned_process():
    """torch.multiprocessing moved the workspace's storage into shared memory when it pickled
    it, at a new address the view no longer aligned: the parent's later calls and the child's
    were refused as misaligned. The child now gets a workspace of its own; the parent's is
    untouched."""
    import multiprocessing
    workspace = splitkv.Workspace(16 << 20, "cpu")
    problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE)
    expected = problem.run(workspace, num_splits=3)
    address = workspace.tensor.data_ptr()
    tensors = (problem.q, problem.kv_cache, problem.block_tables, problem.seq_lens)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        out, misalignment = pool.apply(_worker_call, (workspace, tensors))
    assert misalignment == 0
    assert torch.equal(out, expected)
    assert workspace.tensor.data_ptr() == address
    assert torch.equal(problem.run(workspace, num_splits=3), expected)
    harness.assert_counter_region_zero(workspace)


def _saved(workspace, monkeypatch=None, location=None):
    """torch.save's bytes of ``workspace``; ``location`` (e.g. "cuda:0") is the device its
    tensors are recorded on, as if saved there (this machine has no GPU)."""
    import io
    if location is not None:
        monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: location)
    saved = io.BytesIO()
    torch.save(workspace, saved)
    if location is not None:
        monkeypatch.undo()
    return saved.getvalue()


def _loaded(saved, map_location):
    import io
    return torch.load(io.BytesIO(saved), map_location=map_location, weights_only=False)


@pytest.mark.parametrize("map_location",
                         ["cpu", torch.device("cpu"), {"cuda:0": "cpu"}, "callable"],
                         ids=["str", "device", "dict", "callable"])
def test_torch_load_puts_a_workspace_saved_on_cuda_where_map_location_says(map_location,
                                                                           monkeypatch):
    """A Workspace named its device as a str, which torch.load's map_location does not move:
    one saved on CUDA was made on CUDA again on load (on a CPU-only machine, refused: "device
    is not available"), whatever map_location said. Its device now goes as an empty tensor,
    which map_location moves as it moves any tensor."""
    seen = []
    if map_location == "callable":
        map_location = lambda storage, location: seen.append(location) or storage  # noqa: E731
    workspace = _TaggedWorkspace(8 << 20, "cpu", tag="pool-a")
    saved = _saved(workspace, monkeypatch, "cuda:0")
    made = _loaded(saved, map_location)
    assert type(made) is _TaggedWorkspace and made.tag == "pool-a"
    assert (made.nbytes, made.device) == (8 << 20, torch.device("cpu"))
    assert made.tensor.data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
    assert not made.tensor.any()
    assert seen == ([] if not callable(map_location) else ["cuda:0"])
    # Without map_location it is made where it was saved: torch's own refusal, on this machine.
    with pytest.raises(RuntimeError, match="map_location=torch.device"):
        _loaded(saved, None)
    # Saved on the CPU, loaded there, as before.
    assert _loaded(_saved(workspace), None).device == torch.device("cpu")


def test_torch_load_refuses_a_map_location_no_workspace_can_live_on():
    """map_location="meta" was ignored (a CPU workspace came back); now it reaches the
    Workspace, which refuses the device."""
    with pytest.raises(ValueError) as caught:
        _loaded(_saved(splitkv.Workspace(8 << 20, "cpu")), "meta")
    assert str(caught.value) == ("Workspace: device unsupported: expected a cpu or cuda device, "
                                 "got 'meta'")


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool])
def test_workspace_tensor_reinterpreted_in_place_is_refused_on_every_path(dtype):
    """`workspace.tensor.data = workspace.tensor.view(dtype)` keeps the object, address, shape
    and strides: the cached view must still see the new dtype, as the full path does."""
    workspace = splitkv.Workspace(16 << 20, "cpu")
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    runner = splitkv.PagedAttentionRunner(workspace, problem.block_tables, problem.seq_lens)
    for _ in range(2):
        problem.run(workspace)
        runner.run(problem.q, problem.kv_cache)
    workspace.tensor.data = workspace.tensor.view(dtype)
    message = rf"^paged_attention: workspace dtype unsupported: expected torch.uint8, got {dtype}$"
    with pytest.raises(TypeError, match=message):
        problem.run(workspace)
    with pytest.raises(TypeError, match=message):
        runner.run(problem.q, problem.kv_cache)
    workspace.tensor.data = workspace.tensor.view(torch.uint8)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_workspace_subclass_copies_keep_class_and_attributes(how):
    """__reduce__ named Workspace itself: a subclass's copy was a plain Workspace without the
    subclass's attributes."""
    make = harness.copier(how)
    workspace = _TaggedWorkspace(8 << 20, "cpu", tag="pool-a")
    made = make(workspace)
    assert type(made) is _TaggedWorkspace and made.tag == "pool-a"
    assert made.tensor.data_ptr() != workspace.tensor.data_ptr()
    assert made.tensor.data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
    harness.assert_counter_region_zero(made)


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle", "pickle0"])
def test_workspace_subclass_copies_keep_slots_and_their_own_state(how):
    """__reduce__ kept the subclass's __dict__ only: an attribute in its __slots__ was lost (an
    AttributeError on the copy), and a __getstate__ of its own was passed over (its
    __setstate__ got the __dict__ instead)."""
    make = harness.copier(how)
    slotted = _SlottedWorkspace(8 << 20, "cpu", tag="pool-b")
    slotted.note = "kept too"
    made = make(slotted)
    assert (type(made), made.tag, made.note) == (_SlottedWorkspace, "pool-b", "kept too")
    assert made.tensor.data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
    own = make(_OwnStateWorkspace(8 << 20, "cpu"))
    assert (type(own), own.restored) == (_OwnStateWorkspace, ("own state",))
    harness.assert_counter_region_zero(own)


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle", "send"])
def test_workspace_subclass_keeping_views_of_its_buffer_copies_them_as_views(how):
    """A subclass attribute that is a view of its own buffer (its counter region, an int32
    view of the scratch) went as a tensor: its copy took the whole buffer's bytes and viewed
    them, not the copy's buffer, and torch.multiprocessing moved the original's storage into
    shared memory (its tensor at a new address: every later call refused as misaligned, more
    often than not). The copy's attribute is now the same view of its own new buffer."""
    make = harness.copier(how)
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    for _ in range(4):  # buffers at several offsets into their storages
        workspace = _ViewingWorkspace(16 << 20, "cpu")
        address = workspace.tensor.data_ptr()
        expected = problem.run(workspace, num_splits=3)
        made = make(workspace)
        assert workspace.tensor.data_ptr() == address  # the original stays where it was
        assert torch.equal(problem.run(workspace, num_splits=3), expected)
        for original, copied in ((workspace.counters, made.counters),
                                 (workspace.words, made.words)):
            assert (copied.dtype, copied.shape, copied.stride()) == (
                original.dtype, original.shape, original.stride())
            offset = original.data_ptr() - workspace.tensor.data_ptr()
            assert copied.data_ptr() == made.tensor.data_ptr() + offset
        assert made.alias is made.counters  # one object, one view
        assert made.tensor.untyped_storage().nbytes() == workspace._raw.numel()  # no 2nd copy
        made.words.fill_(5)  # the scratch: the copy's own bytes
        assert made.tensor[splitkv.COUNTER_REGION_BYTES:].view(torch.int32).eq(5).all()
        assert torch.equal(problem.run(made, num_splits=3), expected)


class _SlottedWorkspace(splitkv.Workspace):
    """A subclass keeping its attribute in __slots__ (module level: pickled)."""

    __slots__ = ("tag",)

    def __init__(self, nbytes, device, tag):
        super().__init__(nbytes, device)
        self.tag = tag


class _OwnStateWorkspace(splitkv.Workspace):
    """A subclass with __getstate__ / __setstate__ of its own, whose state is no dict."""

    def __getstate__(self):
        return ("own state",)

    def __setstate__(self, state):
        self.restored = state


class _ViewingWorkspace(splitkv.Workspace):
    """A subclass keeping views of its own buffer."""

    def __init__(self, nbytes, device):
        super().__init__(nbytes, device)
        self.counters = self.counter_region()
        self.alias = self.counters
        self.words = self.tensor[splitkv.COUNTER_REGION_BYTES:].view(torch.int32)


class _TaggedWorkspace(splitkv.Workspace):
    """A subclass with another constructor and an attribute of its own (module level: pickled)."""

    def __init__(self, nbytes, device, tag):
        super().__init__(nbytes, device)
        self.tag = tag


def test_workspace_pickles_under_fake_tensor_mode():
    """The device token made under FakeTensorMode was a FakeTensor, which does not pickle
    ("Can't pickle local object"): pickling a workspace there raised, where it had worked
    with the device as a str. The device goes as a str under a tensor mode."""
    import pickle
    from torch._subclasses.fake_tensor import FakeTensorMode
    workspace = splitkv.Workspace(8 << 20, "cpu")
    with FakeTensorMode():
        data = pickle.dumps(workspace)
    made = pickle.loads(data)
    assert type(made) is splitkv.Workspace and made.device == torch.device("cpu")
    assert made.tensor.data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
    harness.assert_counter_region_zero(made)
