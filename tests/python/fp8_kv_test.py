"""An fp8 (float8_e4m3fn) KV cache with bfloat16/float16 q: true value = stored x scale,
against float64 attention on the dequantised K/V with the bfloat16 tolerances."""

import pytest
import torch

import harness
import splitkv
import splitkv_reference
from harness import DEVICES

FP8 = torch.float8_e4m3fn


def _scales(per_head, num_kv_heads, seed):
    """A Python float, or float32 [num_kv_heads] (CPU; moved by the caller)."""
    if not per_head:
        return 0.37 + 0.01 * seed
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(num_kv_heads, generator=generator) * 0.5 + 0.05


def _per_head(scale, like_heads_axis, ndim):
    """scale as a tensor broadcasting along the heads axis of an ndim tensor."""
    if not isinstance(scale, torch.Tensor):
        return torch.tensor(scale, dtype=torch.float32)
    shape = [1] * ndim
    shape[like_heads_axis] = -1
    return scale.view(shape)


def _quantised_paged(problem, k_scale, v_scale):
    """The problem's cache as fp8 (stored = value / scale), and its per-request keys and
    values replaced by what the fp8 bytes mean (stored x scale), for the reference."""
    heads_axis = 2 if problem.kv_layout == "HND" else 3  # of the 5-D cache
    cache = problem.kv_cache.cpu().float()
    k = (cache[:, 0:1] / _per_head(k_scale, heads_axis, 5)).to(FP8)
    v = (cache[:, 1:2] / _per_head(v_scale, heads_axis, 5)).to(FP8)
    fp8_cache = torch.cat([k, v], 1).to(problem.q.device)
    keys = [(x.float() / _per_head(k_scale, 1, 3)).to(FP8).float() * _per_head(k_scale, 1, 3)
            for x in problem.keys]
    values = [(x.float() / _per_head(v_scale, 1, 3)).to(FP8).float() * _per_head(v_scale, 1, 3)
              for x in problem.values]
    return fp8_cache, keys, values


def _device_scale(scale, device):
    return scale.to(device) if isinstance(scale, torch.Tensor) else scale


CASES = harness.pairwise({
    "dtype": [torch.bfloat16, torch.float16],
    "head_dim": [64, 128, 256],
    "group": [1, 4],
    "num_splits": [1, 3],
    "kv_layout": ["HND", "NHD"],
    "per_head": [False, True],
    "q_lens": [None, [2, 1, 4]],
}, seed=3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=harness.case_id)
def test_paged_fp8_matches_reference(device, case):
    harness.require(device, case["dtype"], case["head_dim"])
    if device == "cuda":
        pytest.skip("fp8 KV runs on the CPU backend only (CUDA refuses it: see errors)")
    problem = harness.make_paged([40, 0, 130], page_size=16, group=case["group"],
                                 head_dim=case["head_dim"], dtype=case["dtype"],
                                 kv_layout=case["kv_layout"], q_lens=case["q_lens"],
                                 device=device, seed=5)
    k_scale = _scales(case["per_head"], 2, 1)
    v_scale = _scales(case["per_head"], 2, 2)
    problem.kv_cache, problem.keys, problem.values = _quantised_paged(problem, k_scale, v_scale)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    out, _ = harness.run_and_check(
        problem, workspace, dict(window_left=50, logits_soft_cap=30.0), poison_out=True,
        num_splits=case["num_splits"], k_scale=_device_scale(k_scale, device),
        v_scale=_device_scale(v_scale, device))
    assert out.dtype == case["dtype"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_ragged_fp8_with_sinks(device, num_splits):
    harness.require(device, torch.bfloat16)
    if device == "cuda":
        pytest.skip("fp8 KV runs on the CPU backend only")
    problem = harness.make_ragged([5, 0, 70], [30, 4, 200], group=4, head_dim=128,
                                  dtype=torch.bfloat16, device=device, seed=6)
    k_scale = torch.tensor([0.2, 0.05])
    v_scale = 0.125
    k = (problem.k.float() / k_scale[None, :, None]).to(FP8)
    v = (problem.v.float() / v_scale).to(FP8)
    problem.k, problem.v = k, v
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -3.0, 4.0, 0.25], device=device)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    out, lse = problem.run(workspace, return_lse=True, num_splits=num_splits, sinks=sinks,
                           k_scale=k_scale.to(device), v_scale=v_scale)
    expected, expected_lse = splitkv_reference_ragged(problem, k.float() * k_scale[None, :, None],
                                                      v.float() * v_scale, sinks)
    assert out.dtype == torch.bfloat16
    harness.assert_close(out, expected, torch.bfloat16)
    harness.assert_lse_close(lse, expected_lse)
    harness.assert_counter_region_zero(workspace)


def splitkv_reference_ragged(problem, k, v, sinks):
    return splitkv_reference.ragged_attention(problem.q.cpu(), k.cpu(), v.cpu(),
                                              problem.cu_seqlens_q, problem.cu_seqlens_kv,
                                              sinks=sinks.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_pair_and_ops(device):
    """A (k, v) pair of fp8 tensors, through the eager function and splitkv.ops: same bits."""
    harness.require(device, torch.float16)
    if device == "cuda":
        pytest.skip("fp8 KV runs on the CPU backend only")
    problem = harness.make_paged([90, 7], page_size=8, group=2, head_dim=64,
                                 dtype=torch.float16, kv_form="pair", device=device, seed=8)
    k = (problem.kv_cache[0].float() / 0.5).to(FP8)
    v = (problem.kv_cache[1].float() / 0.25).to(FP8)
    workspace = harness.shared_workspace(device)
    args = (problem.q, (k, v), problem.block_tables, problem.seq_lens, workspace)
    eager = splitkv.paged_attention(*args, k_scale=0.5, v_scale=0.25, num_splits=2)
    op = splitkv.ops.paged_attention(*args, k_scale=0.5, v_scale=0.25, num_splits=2)
    harness.assert_bitwise_equal(eager, op)
    problem.keys = [(x.float() / 0.5).to(FP8).float() * 0.5 for x in problem.keys]
    problem.values = [(x.float() / 0.25).to(FP8).float() * 0.25 for x in problem.values]
    expected, _ = problem.reference()
    harness.assert_close(eager, expected, torch.float16)
    assert splitkv.plan_paged_attention(*args, k_scale=0.5, v_scale=0.25).num_splits >= 1


@pytest.mark.gpu
def test_cuda_refuses_fp8():
    """Until CUDA has an fp8 path it refuses one, naming it (no crash, counters zero)."""
    harness.require("cuda", torch.bfloat16)
    problem = harness.make_paged([20], page_size=16, dtype=torch.bfloat16, device="cuda")
    workspace = harness.shared_workspace("cuda")
    with pytest.raises(ValueError, match="float8_e4m3fn KV cache is not supported on cuda"):
        splitkv.paged_attention(problem.q, problem.kv_cache.to(FP8), problem.block_tables,
                                problem.seq_lens, workspace, k_scale=1.0, v_scale=1.0)
    harness.assert_counter_region_zero(workspace)
