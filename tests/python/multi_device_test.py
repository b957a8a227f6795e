"""Calls on a GPU that is not the current device, in one process.

The C++ launch makes the tensors' device current for the launch and restores the caller's
(ScopedDevice, cc/splitkv/stream_order.h), and launches on that device's current stream. These
tests need two GPUs (mark gpu; skipped with fewer): every call on cuda:1 made while cuda:0 is
current must give the bits of the same call made while cuda:1 is current, match float64, leave
the current device as it was, and leave the counter region zero; tensors split over the two
GPUs are refused naming the argument.
"""

import pytest
import torch

import harness
import splitkv

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _two_gpus():
    harness.require("cuda")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    previous = torch.cuda.current_device()
    yield
    torch.cuda.set_device(previous)


def _on(device_index, fn):
    """fn() with cuda:device_index current; checks fn leaves it current."""
    torch.cuda.set_device(device_index)
    result = fn()
    assert torch.cuda.current_device() == device_index
    torch.cuda.synchronize(1)
    return result


def _paged_problem():
    # 3000 keys at batch 2: the planner splits, so the in-launch merge runs on cuda:1 too.
    return harness.make_paged([3000, 70], page_size=16, num_kv_heads=2, group=4, head_dim=128,
                              dtype=torch.bfloat16, device="cuda:1", q_lens=[1, 5], seed=11)


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_paged_on_the_other_gpu(batch_invariant):
    problem = _paged_problem()
    workspace = splitkv.Workspace(64 << 20, device="cuda:1")
    options = dict(causal=True, return_lse=True, batch_invariant=batch_invariant)
    off = _on(0, lambda: problem.run(workspace, **options))
    on = _on(1, lambda: problem.run(workspace, **options))
    for x in off:
        assert x.device == torch.device("cuda:1")
    harness.assert_bitwise_equal(off[0], on[0])
    harness.assert_bitwise_equal(off[1], on[1])
    expected, expected_lse = problem.reference(causal=True)
    harness.assert_close(off[0], expected, problem.dtype)
    harness.assert_lse_close(off[1], expected_lse)
    harness.assert_counter_region_zero(workspace)


def test_ragged_and_runner_on_the_other_gpu():
    problem = harness.make_ragged([300, 1, 77], [300, 900, 77], num_kv_heads=2, group=2,
                                  head_dim=128, dtype=torch.bfloat16, device="cuda:1", seed=12)
    workspace = splitkv.Workspace(64 << 20, device="cuda:1")
    off = _on(0, lambda: problem.run(workspace, causal=True))
    on = _on(1, lambda: problem.run(workspace, causal=True))
    harness.assert_bitwise_equal(off, on)
    expected, _ = problem.reference(causal=True)
    harness.assert_close(off, expected, problem.dtype)
    runner = splitkv.RaggedAttentionRunner(workspace, problem.cu_seqlens_q, problem.cu_seqlens_kv,
                                           causal=True)
    out = torch.full_like(problem.q, float("nan"))
    _on(0, lambda: runner.run(problem.q, problem.k, problem.v, out=out))
    harness.assert_bitwise_equal(out, off)
    harness.assert_counter_region_zero(workspace)


def test_graph_captured_on_the_other_gpu():
    problem = _paged_problem()
    workspace = splitkv.Workspace(64 << 20, device="cuda:1")
    expected = _on(1, lambda: problem.run(workspace, causal=True))
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream(device="cuda:1")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(1), torch.cuda.stream(stream):
        problem.run(workspace, causal=True)  # warm-up on the capture stream
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            out = problem.run(workspace, causal=True)
    torch.cuda.set_device(0)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize(1)
    harness.assert_bitwise_equal(out, expected)
    harness.assert_counter_region_zero(workspace)


def test_merge_states_on_the_other_gpu():
    generator = torch.Generator().manual_seed(13)
    outs = torch.randn(3, 7, 4, 64, generator=generator).to("cuda:1", torch.bfloat16)
    lses = torch.randn(3, 7, 4, generator=generator).to("cuda:1")
    off = _on(0, lambda: splitkv.merge_states(outs, lses))
    on = _on(1, lambda: splitkv.merge_states(outs, lses))
    harness.assert_bitwise_equal(off[0], on[0])
    harness.assert_bitwise_equal(off[1], on[1])


@pytest.mark.parametrize("name", ["kv_cache", "block_tables", "seq_lens", "out", "workspace"])
def test_tensors_split_over_two_gpus_are_refused(name):
    problem = _paged_problem()
    workspace = splitkv.Workspace(64 << 20, device="cuda:1")
    args = dict(q=problem.q, kv_cache=problem.kv_cache, block_tables=problem.block_tables,
                seq_lens=problem.seq_lens, workspace=workspace, cu_seqlens_q=problem.cu_seqlens_q)
    if name == "out":
        args["out"] = torch.empty_like(problem.q, device="cuda:0")
    elif name == "workspace":
        args["workspace"] = splitkv.Workspace(64 << 20, device="cuda:0")
    else:
        args[name] = args[name].to("cuda:0")
    torch.cuda.set_device(0)
    with pytest.raises(ValueError, match=rf"\b{name}\b.*cuda:0"):
        splitkv.paged_attention(**args)
    harness.assert_counter_region_zero(workspace)
    harness.assert_counter_region_zero(args["workspace"])
