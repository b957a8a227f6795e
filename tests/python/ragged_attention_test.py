"""ragged_attention against the float64 reference (pairwise grid plus edge cases)."""

import math
import zlib

import pytest
import torch

import harness
import splitkv
from harness import DEVICES

# (q_lens, kv_lens) per batch shape. "prefill": q_len == kv_len; "suffix": q_len < kv_len
# (chunked prefill after cached tokens); "empty": zero-length requests inside the batch
# (q_len 0 with keys, keys 0 with queries, both 0).
_BATCHES = {
    "prefill": ([37, 130, 5], [37, 130, 5]),
    "suffix": ([20, 1, 90], [300, 64, 95]),
    "empty": ([12, 0, 0, 9, 3], [40, 25, 0, 9, 0]),
}

CASES = harness.pairwise({
    "batch": list(_BATCHES),
    "causal": [True, False],
    "window_left": [-1, 0, 24],
    "logits_soft_cap": [0.0, 1.5],
    "group": [1, 4, 8],
    "head_dim": [64, 128, 256],
    "dtype": [torch.float32, torch.float16, torch.bfloat16],
    "num_splits": [1, 3, None],
    "strided": [False, True],
    "out": [False, True],
}, seed=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=harness.case_id)
def test_matches_reference(device, case):
    harness.require(device, case["dtype"], case["head_dim"])
    q_lens, kv_lens = _BATCHES[case["batch"]]
    problem = harness.make_ragged(q_lens, kv_lens, group=case["group"], head_dim=case["head_dim"],
                                  dtype=case["dtype"], device=device, strided=case["strided"],
                                  seed=zlib.crc32(harness.case_id(case).encode()))
    workspace = harness.shared_workspace(device)
    options = {k: case[k] for k in ("causal", "window_left", "logits_soft_cap")}

    plan = problem.plan(workspace, num_splits=case["num_splits"], **options)
    if case["num_splits"] is not None:
        assert plan.num_splits == case["num_splits"]
    harness.assert_plan_keeps_counter_region(plan)

    harness.run_and_check(problem, workspace, options, case["out"], num_splits=case["num_splits"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_zero_length_requests(device, num_splits):
    # A request with queries but no keys: output 0, LSE -inf. One with keys but no
    # queries, and one with neither, write nothing and must not disturb their neighbours.
    harness.require(device)
    problem = harness.make_ragged([3, 0, 4, 0, 2], [0, 50, 300, 0, 1], group=2, head_dim=64,
                                  dtype=torch.float16, device=device, seed=2)
    workspace = harness.shared_workspace(device)
    out = torch.full_like(problem.q, float("nan"))
    out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True, out=out)
    expected, expected_lse = problem.reference()
    assert torch.equal(out[:3].cpu(), torch.zeros_like(out[:3]).cpu())
    assert torch.isneginf(lse[:3]).all()
    harness.assert_close(out, expected, torch.float16)
    harness.assert_lse_close(lse, expected_lse)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_more_queries_than_keys_causal(device):
    # Causal with q_len > kv_len: the first q_len - kv_len queries see no key.
    harness.require(device)
    problem = harness.make_ragged([10], [4], group=1, head_dim=128, dtype=torch.bfloat16,
                                  device=device, seed=4)
    out, lse = problem.run(harness.shared_workspace(device), return_lse=True, num_splits=2)
    expected, expected_lse = problem.reference()
    assert torch.equal(out[:6].cpu(), torch.zeros_like(out[:6]).cpu())
    assert torch.isneginf(lse[:6]).all() and torch.isfinite(lse[6:]).all()
    harness.assert_close(out, expected, torch.bfloat16)
    harness.assert_lse_close(lse, expected_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_long_prefill_split_and_unsplit_agree(device):
    # Several query tiles per request and the planner's own split count.
    harness.require(device)
    problem = harness.make_ragged([200, 700], [200, 900], group=4, head_dim=64,
                                  dtype=torch.float16, device=device, seed=6)
    workspace = harness.shared_workspace(device)
    expected, expected_lse = problem.reference()
    for num_splits in (None, 1, 5):
        out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True)
        harness.assert_close(out, expected, torch.float16)
        harness.assert_lse_close(lse, expected_lse)
        harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_sm_scale_is_used(device):
    harness.require(device)
    problem = harness.make_ragged([6, 9], [30, 9], group=2, head_dim=64, dtype=torch.float16,
                                  device=device, seed=8)
    workspace = harness.shared_workspace(device)
    out, lse = problem.run(workspace, sm_scale=0.05, return_lse=True)
    expected, expected_lse = problem.reference(sm_scale=0.05)
    harness.assert_close(out, expected, torch.float16)
    harness.assert_lse_close(lse, expected_lse)
    default_out = problem.run(workspace)
    default_expected, _ = problem.reference()  # 1 / sqrt(64)
    harness.assert_close(default_out, default_expected, torch.float16)
    assert not torch.allclose(out.float(), default_out.float(), atol=1e-2)


@pytest.mark.parametrize("head_dim", [1, 40, 100])
def test_cpu_head_dims_beyond_the_gpu_set(head_dim):
    # The CPU backend takes any head_dim up to 1024 (vector tails included).
    problem = harness.make_ragged([7, 3], [50, 3], group=4, head_dim=head_dim,
                                  dtype=torch.float32, seed=head_dim)
    workspace = harness.shared_workspace("cpu")
    for num_splits in (1, 2):
        out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True)
        expected, expected_lse = problem.reference()
        harness.assert_close(out, expected, torch.float32)
        harness.assert_lse_close(lse, expected_lse)


def test_cpu_huge_sm_scale_with_soft_cap_stays_finite():
    # sm_scale multiplies the dot product, not q: 1e36 x q would overflow float32, while
    # the capped logits (at most 10) and the result are finite.
    q = torch.full((1, 1, 2), 1e3)
    k = torch.tensor([[[1.0, -1.0]], [[1.0, 0.0]]])
    v = torch.tensor([[[1.0, 1.0]], [[3.0, 3.0]]])
    cu_q = torch.tensor([0, 1], dtype=torch.int32)
    cu_kv = torch.tensor([0, 2], dtype=torch.int32)
    workspace = harness.shared_workspace("cpu")
    out, lse = splitkv.ragged_attention(q, k, v, cu_q, cu_kv, workspace, sm_scale=1e36,
                                        logits_soft_cap=10.0, return_lse=True)
    # q.k is 0 and 1e3: logits 0 and 1e39, capped to 0 and 10 (tanh saturates).
    weight = math.exp(10.0) / (1.0 + math.exp(10.0))
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out, torch.full((1, 1, 2), 1.0 + 2.0 * weight))
    torch.testing.assert_close(lse, torch.tensor([[math.log1p(math.exp(10.0))]]))
