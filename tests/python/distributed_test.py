"""splitkv.distributed.paged_attention on 2 and 3 ranks spawned by the test (gloo over a
FileStore on the CPU; NCCL on the GPU variant), each rank holding a shard of every
request's keys.

Checked on every rank, case by case: the result against float64 attention over all the
keys and against the single-process splitkv.paged_attention (tolerances: each partial is
rounded to the dtype before the merge); bitwise the same on every rank and on a repeat;
bitwise the single-process call when one rank holds every key (same forced num_splits) or
the group has one rank; the rank's counter region zero after the calls. The 3-rank run
also calls with group= a 2-rank subgroup (ranks 0 and 2). Cases cover decode
and causal chunked prefill with shards cut at and between page boundaries, a rank holding
no key of a request (or of any), rows that see no key on a rank, forced splits, sliding
windows over absolute positions (shards wholly before a query's window, cut by it, past
it) and sinks (entered once, through rank 0's partial).
"""

import dataclasses
import multiprocessing
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import context_parallel as cp
import splitkv

# (atol, rtol) against float64 and against the single-process call: twice the single
# call's own tolerance (tests/python/harness.py), for the partials' extra rounding.
_TOLERANCE = {torch.float32: (4e-5, 4e-5), torch.bfloat16: (2e-2, 1.6e-2)}
_LSE_TOLERANCE = (1e-4, 2e-5)


def _cases(world):
    even = lambda lens, page=16: cp.even_bounds(lens, world, page)
    lens = [1, 97, 300, 40]
    cases = [
        # decode, whole-page shards (request 0's single key on rank 0 only)
        cp.Case(lens, even(lens), seed=1),
        # decode, bf16, shards cut mid-page, with forced splits
        cp.Case(lens, even(lens, None), dtype=torch.bfloat16, num_splits=3, seed=2),
        # causal chunked prefill: a whole prompt, a chunk crossing shards, one query
        cp.Case([64, 100, 33], even([64, 100, 33], None), q_lens=[64, 20, 1], seed=3),
        cp.Case([64, 100, 33], even([64, 100, 33]), q_lens=[64, 37, 2], dtype=torch.bfloat16,
                seed=4),
        # not causal: positions do not matter
        cp.Case([50, 70], even([50, 70], None), q_lens=[5, 70], causal=False, seed=5),
        # every key of every request on the last rank: the others contribute -inf
        cp.Case(lens, [[0] * world + [n] for n in lens], q_lens=[1, 3, 2, 40], num_splits=2,
                seed=6),
    ]
    # uneven shards with empty ones in the middle, and rows that see no key on early ranks
    bounds = [[0] + [min(n, 16 * (r + 1) * r) for r in range(1, world)] + [n] for n in (9, 150)]
    cases.append(cp.Case([9, 150], bounds, q_lens=[9, 150], num_splits=2, seed=7))
    # Sliding windows over absolute positions: decode with windows that leave early shards
    # nothing (request 2: 300 keys, window 40), cut one, or reach over several.
    cases.append(cp.Case(lens, even(lens), window_left=40, seed=8))
    cases.append(cp.Case(lens, even(lens, None), window_left=150, dtype=torch.bfloat16,
                         num_splits=2, seed=9))
    # Causal chunked prefill with a window: rows inside, before and past each shard.
    prefill = [64, 100, 233]
    cases.append(cp.Case(prefill, even(prefill, None), q_lens=[64, 37, 120], window_left=30,
                         seed=10))
    cases.append(cp.Case(prefill, even(prefill), q_lens=[64, 100, 2], window_left=70,
                         dtype=torch.bfloat16, seed=11))
    # Sinks (enter once: through rank 0's partial), with and without a window; a row that
    # sees no key on rank 0 still gets the sink there.
    cases.append(cp.Case(lens, even(lens, None), window_left=40, sinks=True, seed=12))
    cases.append(cp.Case(prefill, even(prefill), q_lens=[64, 37, 120], sinks=True,
                         dtype=torch.bfloat16, seed=13))
    # every key on the last rank, with sinks and a window: rank 0's partial is sink only
    cases.append(cp.Case(lens, [[0] * world + [n] for n in lens], q_lens=[1, 3, 2, 40],
                         window_left=10, sinks=True, seed=14))
    # Odd shapes (found while probing issue 20): a request with no query rows, one with no
    # keys and two queries at positions -2 and -1, a chunk of 130 queries over 120 keys,
    # shards of unequal sizes (3, 50, rest), rank 0 holding none of the last request, a
    # window of 17 and sinks (rank 0's partial for that request is the sink alone).
    uneven = lambda n: [0] + [min(n, 3 + 50 * (r - 1)) for r in range(1, world)] + [n]
    cases.append(cp.Case([5, 0, 120, 33], [uneven(5), [0] * (world + 1), uneven(120),
                                           [0] * world + [33]],
                         q_lens=[0, 2, 130, 33], window_left=17, sinks=True, seed=15))
    return cases


def _on_device(case, device):
    """bfloat16 on CUDA (float32 is CPU-only there)."""
    if device == "cuda" and case.dtype == torch.float32:
        return cp.Case(**{**case.__dict__, "dtype": torch.bfloat16})
    return case


def _worker(rank, world, store_path, device_type):
    backend = "nccl" if device_type == "cuda" else "gloo"
    torch.set_num_threads(1)  # several ranks share the machine's cores
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    cp.init_group(rank, world, store_path, backend)
    try:
        workspace = splitkv.Workspace(32 << 20, device)
        for i, case in enumerate(_cases(world)):
            case = _on_device(case, device_type)
            _check_case(f"case {i}", case, rank, world, workspace, device)
        _check_batch_invariance(world, rank, workspace, device, device_type)
        if world == 3:
            # group=: ranks 0 and 2 share the keys, rank 1 stays out of the call.
            pair = dist.new_group([0, 2])
            if rank == 1:
                # new_group's value on a rank outside the group: refused, not a TypeError
                # about an int (found by a probe).
                case = _cases(2)[0]
                problem = cp.make_problem(case, device)
                kv, tables, lens, offsets, full = problem.paged(case, [0] * 4, case.full_lens,
                                                                device, seed=0)
                with pytest.raises(ValueError, match="group does not hold this rank"):
                    splitkv.distributed.paged_attention(problem.q, kv, tables, lens, offsets,
                                                        full, workspace, group=pair)
            if rank != 1:
                for i in (2, 5):
                    case = _on_device(_cases(2)[i], device_type)
                    _check_case(f"pair case {i}", case, rank // 2, 2, workspace, device, pair)
    finally:
        dist.destroy_process_group()


def _check_batch_invariance(world, rank, workspace, device, device_type):
    """batch_invariant=True: each request's merged rows are bitwise the same alone as in the
    batch (each rank's partial is batch-invariant, the gather moves bytes, the merge is per
    row in rank order), for decode and chunked prefill, windows and sinks included."""
    even = lambda lens: cp.even_bounds(lens, world, 16)
    lens = [3000, 40, 700, 1, 2100]
    cases = [cp.Case(lens, even(lens), batch_invariant=True, seed=11),
             cp.Case(lens, even(lens), q_lens=[5, 40, 1, 1, 17], batch_invariant=True,
                     window_left=300, sinks=True, seed=12)]
    for i, case in enumerate(cases):
        case = _on_device(case, device_type)
        problem = cp.make_problem(case, device)
        out, lse = cp.run_sharded(case, problem, rank, workspace, device)
        for b in range(len(lens)):
            sub_case, sub_problem, (lo, hi) = cp.sub_batch(case, problem, b)
            alone_out, alone_lse = cp.run_sharded(sub_case, sub_problem, rank, workspace, device)
            name = f"batch-invariant case {i}, request {b}"
            assert torch.equal(alone_out, out[lo:hi]), name
            assert torch.equal(alone_lse, lse[lo:hi]), name
        # The default mode computes the same function (within rounding).
        default = dataclasses.replace(case, batch_invariant=False)
        plain_out, _ = cp.run_sharded(default, problem, rank, workspace, device)
        torch.testing.assert_close(plain_out, out, atol=_TOLERANCE[case.dtype][0],
                                   rtol=_TOLERANCE[case.dtype][1])
    assert int(workspace.counter_region().count_nonzero()) == 0


def _check_case(name, case, rank, world, workspace, device, group=None):
    """rank: in `group` (default: the default group, of `world` ranks)."""
    problem = cp.make_problem(case, device)
    out, lse = cp.run_sharded(case, problem, rank, workspace, device, group)
    workspace.check_counter_region()
    assert int(workspace.counter_region().count_nonzero()) == 0, name
    atol, rtol = _TOLERANCE[case.dtype]
    if rank == 0:  # the other ranks hold bitwise the same result (checked below)
        ref_out, ref_lse = problem.reference(case)
        torch.testing.assert_close(out.cpu().double(), ref_out, atol=atol, rtol=rtol, msg=name)
        torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=_LSE_TOLERANCE[0],
                                   rtol=_LSE_TOLERANCE[1], msg=name)
    single_out, single_lse = cp.run_single(case, problem, workspace, device)
    torch.testing.assert_close(out, single_out, atol=atol, rtol=rtol, msg=name)
    torch.testing.assert_close(lse, single_lse, atol=_LSE_TOLERANCE[0], rtol=_LSE_TOLERANCE[1],
                               msg=name)
    one_rank_holds_all = all(bounds[-2] == 0 for bounds in case.bounds)
    # Bitwise the single call: a group of one, or every key on one rank without sinks (the
    # sink then rides on rank 0's partial and the merge weighs two partials).
    if world == 1 or (one_rank_holds_all and case.num_splits is not None and not case.sinks):
        assert torch.equal(out, single_out) and torch.equal(lse, single_lse), name
    again_out, again_lse = cp.run_sharded(case, problem, rank, workspace, device, group)
    assert torch.equal(out, again_out) and torch.equal(lse, again_lse), name
    assert cp.same_on_every_rank(out, lse, group=group), name
    assert int(workspace.counter_region().count_nonzero()) == 0, name


def _spawn(world, tmp_path, device_type):
    # splitkv's CPU pool: one thread per rank (inherited by the spawned ranks).
    os.environ["SPLITKV_NUM_THREADS"] = "1"
    # The CPU ranks fork from a server that imported torch once (one import, not one per
    # rank); CUDA ranks start fresh.
    if device_type == "cpu":
        multiprocessing.set_forkserver_preload(["torch", "torch.distributed"])
    mp.start_processes(_worker, args=(world, cp.store_path(tmp_path), device_type), nprocs=world,
                       join=True, start_method="forkserver" if device_type == "cpu" else "spawn")


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_ranks_match_single_process_and_float64(world, tmp_path):
    _spawn(world, tmp_path, "cpu")


def test_one_rank_group_is_the_local_call_bitwise(tmp_path):
    # In this process: a group of one (gloo), where the merge of one partial is the identity.
    cp.init_group(0, 1, cp.store_path(tmp_path), "gloo")
    try:
        workspace = splitkv.Workspace(32 << 20, "cpu")
        for i, case in enumerate(_cases(1)):
            _check_case(f"case {i}", case, 0, 1, workspace, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_nccl_ranks_match_single_gpu_and_float64(tmp_path):
    if not torch.cuda.is_available() or not splitkv.cuda_backend_available():
        pytest.skip("no CUDA device or a CPU-only build")
    if not dist.is_nccl_available():
        pytest.skip("torch without NCCL")
    # One rank per GPU, up to 3: on a single GPU, the NCCL path with a group of one.
    _spawn(min(3, torch.cuda.device_count()), tmp_path, "cuda")
