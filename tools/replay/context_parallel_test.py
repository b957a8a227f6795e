"""--context_parallel: the short replay of replay_test on 2 and 3 gloo ranks spawned by the
test (a FileStore in the test's temporary directory), every check passing on every rank
(also with gpt-oss-20b's windowed and full layers with sinks, and with an fp8 pool); with
--batch_invariant, sampled requests re-run alone through the sharded calls bitwise equal on
every rank; an injected output fault caught on every rank; and the binary under torchrun
(127.0.0.1)."""

import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tools.replay import checks
from tools.replay.context_parallel import gather_outcomes
from tools.replay.presets import PRESETS
from tools.replay.runner import ReplayConfig, run_replay
from tools.replay.trace import TraceRequest

# As replay_test: page-boundary lengths, overlapping decodes, a long prompt, an idle gap.
_SPECS = [(0.0, 1, 5), (0.0, 16, 3), (0.01, 17, 40), (0.05, 1100, 12), (0.3, 33, 20), (9.0, 97, 6)]
_REQUESTS = [TraceRequest(i, *spec) for i, spec in enumerate(_SPECS)]
# gpt-oss-20b's 64 qo heads make the float64 checks 16x dearer: as replay_test, a 300-token
# prompt in place of the 1100 one (still past the 128-token window, and cut by the shards).
_GPT_OSS_REQUESTS = [TraceRequest(i, a, 300 if p == 1100 else p, g) for i, (a, p, g) in enumerate(_SPECS)]
# --batch_invariant: a 3000-token prompt arriving with the 1100 one (the list is in arrival
# order), decoding in batches of up to 4, whose ~1500 keys a rank the default mode splits by
# how many requests share the step.
_INVARIANT_REQUESTS = [TraceRequest(i, *spec)
                       for i, spec in enumerate(_SPECS[:4] + [(0.05, 3000, 10)] + _SPECS[4:])]


def _rank(rank, world, store_path, fault, dtype, queue, model, kv_dtype, batch_invariant):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    try:
        requests = (_GPT_OSS_REQUESTS if model == "gpt-oss-20b" else
                    _INVARIANT_REQUESTS if batch_invariant else _REQUESTS)
        config = ReplayConfig(requests=requests, shape=PRESETS[model], kv_dtype=kv_dtype,
                              device=torch.device("cpu"), dtype=dtype, num_pages=512,
                              max_batch_size=4, check_every=1, workspace_bytes=32 << 20,
                              progress=False, inject_fault=fault, context_parallel=world, rank=rank,
                              batch_invariant=batch_invariant)
        result = run_replay(config)
        outcomes = gather_outcomes(result, None)
        invariance = [None] * world  # (compared, differed) of each rank, with --batch_invariant
        if batch_invariant:
            dist.all_gather_object(invariance, (dict(result.invariance.compared), result.invariance.differed))
        if rank == 0:
            queue.put((result.steps, result.finished, len(result.layers) * result.prefill_calls,
                       len(result.layers) * result.decode_calls, result.check_stats.calls, outcomes,
                       invariance))
    finally:
        dist.destroy_process_group()


def _replay(world, tmp_path, fault="none", dtype=torch.bfloat16, model="llama3-8b-tp8",
            kv_dtype=None, batch_invariant=False):
    # Ranks fork from a server that imported torch once; splitkv's pool: a thread per rank.
    os.environ["SPLITKV_NUM_THREADS"] = "1"
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed"])
    queue = mp.get_context("forkserver").SimpleQueue()
    mp.start_processes(_rank, args=(world, os.path.join(str(tmp_path), "store"), fault, dtype, queue,
                                    model, kv_dtype, batch_invariant),
                       nprocs=world, join=True, start_method="forkserver")
    return queue.get()


@pytest.mark.parametrize("world,dtype,model,kv_dtype", [
    (2, torch.bfloat16, "llama3-8b-tp8", None),
    (3, torch.float32, "llama3-8b-tp8", None),
    # two layers a step: a 128-token sliding window and full attention, both with sinks
    (2, torch.bfloat16, "gpt-oss-20b", None),
    # an fp8 e4m3 pool with per-kv-head scales
    (2, torch.bfloat16, "llama3-8b-tp8", torch.float8_e4m3fn),
], ids=["2-bf16", "3-f32", "2-gpt-oss", "2-fp8"])
def test_every_rank_passes_every_check(world, tmp_path, dtype, model, kv_dtype):
    steps, finished, prefill_calls, decode_calls, calls, outcomes, _ = _replay(
        world, tmp_path, dtype=dtype, model=model, kv_dtype=kv_dtype)
    assert finished == 6 and steps > 40
    assert calls == {"prefill": prefill_calls, "decode": decode_calls}
    atol, _ = checks.OUTPUT_TOLERANCES[dtype]
    assert len(outcomes) == world
    for rank, o in enumerate(outcomes):
        assert o["ok"], (rank, o)
        assert o["counter_steps_checked"] == steps and o["counter_failure"] is None
        # Every call checked on every rank, against real values: small but not zero errors.
        assert o["requests_checked"] == outcomes[0]["requests_checked"] > 80
        assert 0.0 < o["max_out_error"] < 2 * atol and o["max_lse_error"] < checks.LSE_ATOL
    # Every rank merged the same result: the same errors to the last bit.
    assert len({(o["max_out_error"], o["max_lse_error"]) for o in outcomes}) == 1


def test_batch_invariant_reruns_alone_bitwise_on_every_rank(tmp_path):
    """--batch_invariant with --context_parallel=2: every checked prefill's requests and the
    sampled decode requests re-run alone through the sharded calls, out and lse bitwise equal
    on both ranks. A 3000-token prompt decodes beside others, so the default mode (one pool
    thread a rank: 4 workers) cuts its ~1500 keys a rank into fewer splits in the batch than
    alone (checked: without batch_invariant the re-runs differ)."""
    steps, finished, prefill_calls, decode_calls, calls, outcomes, invariance = _replay(
        2, tmp_path, batch_invariant=True)
    assert finished == len(_INVARIANT_REQUESTS)
    for rank, o in enumerate(outcomes):
        assert o["ok"], (rank, o)
    for compared, differed in invariance:
        assert differed == 0
        assert compared["prefill"] == len(_INVARIANT_REQUESTS)  # every request
        assert compared["decode"] >= decode_calls  # at least one request of every checked call
    assert invariance[0] == invariance[1]


def test_output_fault_fails_every_rank(tmp_path):
    *_, outcomes, _ = _replay(2, tmp_path, fault="output")
    for o in outcomes:
        assert not o["ok"] and len(o["failures"]) == 1 and o["counter_failure"] is None
        assert o["failures"][0].startswith("prefill step 0 request 0 (q_len 1, kv_len 1)")


def _binary():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay")


def test_binary_under_torchrun(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         _binary(), "--context_parallel=2", "--max_requests=4", "--noprogress"],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.count("splitkv replay summary") == 1  # rank 0 only
    assert "context parallel     2 ranks (gloo)" in run.stdout
    assert "rank 1               PASS" in run.stdout
    assert "result               PASS on every rank" in run.stdout


def test_binary_refuses_without_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    run = subprocess.run([_binary(), "--context_parallel=2", "--max_requests=4", "--noprogress"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 2
    assert ("replay: --context_parallel=2 invalid: expected a launch by torchrun "
            "--nproc_per_node=2 (WORLD_SIZE 2), got WORLD_SIZE unset") in run.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
