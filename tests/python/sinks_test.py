"""Attention sinks (DESIGN.md Semantics): one extra logit per qo head in every row's softmax,
entered once per row whatever the split count, against the float64 reference."""

import pytest
import torch

import harness
import splitkv
from harness import DEVICES


def _sinks(num_qo_heads, device, seed=0):
    """Sinks around the logits' range (the random logits are O(1)), one far above and one far
    below when there are enough heads."""
    generator = torch.Generator().manual_seed(seed)
    sinks = torch.randn(num_qo_heads, generator=generator) * 2
    if num_qo_heads >= 4:
        sinks[1], sinks[2] = 60.0, -60.0
    return sinks.to(device)


PAGED_CASES = harness.pairwise({
    "dtype": [torch.float32, torch.float16, torch.bfloat16],
    "head_dim": [64, 128, 256],
    "group": [1, 4],
    "num_splits": [1, 3, 16],
    "window_left": [-1, 5],
    "logits_soft_cap": [0.0, 20.0],
    "q_lens": [None, [1, 3, 2, 5]],
}, seed=17)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", PAGED_CASES, ids=harness.case_id)
def test_paged_matches_reference(device, case):
    harness.require(device, case["dtype"], case["head_dim"])
    # kv 0 and a q_len past the kv_len (rows with no key), a long one that many splits cut.
    problem = harness.make_paged([37, 0, 3, 150], page_size=16, group=case["group"],
                                 head_dim=case["head_dim"], dtype=case["dtype"], device=device,
                                 q_lens=case["q_lens"], seed=3)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    options = dict(sinks=_sinks(problem.q.shape[1], device), window_left=case["window_left"],
                   logits_soft_cap=case["logits_soft_cap"])
    harness.run_and_check(problem, workspace, options, poison_out=True,
                          num_splits=case["num_splits"])


RAGGED_CASES = harness.pairwise({
    "dtype": [torch.float32, torch.float16, torch.bfloat16],
    "head_dim": [64, 128, 256],
    "group": [1, 8],
    "num_splits": [1, 2, 7],
    "causal": [True, False],
    "window_left": [-1, 17],
}, seed=5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", RAGGED_CASES, ids=harness.case_id)
def test_ragged_matches_reference(device, case):
    harness.require(device, case["dtype"], case["head_dim"])
    # An empty request, a q_len past its kv_len (its first rows see no key under causal),
    # and a prefill long enough to take the wgmma kernel on sm_90.
    problem = harness.make_ragged([9, 0, 6, 130], [40, 0, 3, 130], group=case["group"],
                                  head_dim=case["head_dim"], dtype=case["dtype"], device=device,
                                  seed=4)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    options = dict(sinks=_sinks(problem.q.shape[1], device, seed=1), causal=case["causal"],
                   window_left=case["window_left"])
    harness.run_and_check(problem, workspace, options, poison_out=True,
                          num_splits=case["num_splits"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 2, 5, 16, 64])
def test_sink_enters_once_whatever_the_splits(device, num_splits):
    """Forced split counts from 1 to more splits than key blocks (empty splits): the sink
    would count num_splits times if a partial took it."""
    harness.require(device, torch.bfloat16)
    problem = harness.make_paged([700, 5, 64], page_size=16, group=4, head_dim=128,
                                 dtype=torch.bfloat16, device=device, seed=num_splits)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    sinks = torch.full((problem.q.shape[1],), 3.0, device=device)
    _, lse = harness.run_and_check(problem, workspace, dict(sinks=sinks), num_splits=num_splits)
    assert problem.plan(workspace, num_splits=num_splits, sinks=sinks).num_splits == num_splits
    # The 5-key request has more splits than keys: its LSE still includes one sink.
    _, plain_lse = problem.reference()
    expected = torch.logaddexp(plain_lse, torch.tensor(3.0, dtype=torch.float64))
    harness.assert_lse_close(lse, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_rows_with_no_key(device, num_splits):
    """kv_len 0 and causal rows before the KV: out exactly 0, lse exactly the sink."""
    harness.require(device, torch.float16)
    problem = harness.make_ragged([3, 2, 4], [0, 6, 2], group=2, head_dim=64,
                                  dtype=torch.float16, device=device, seed=7)
    sinks = _sinks(problem.q.shape[1], device)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    out, lse = problem.run(workspace, sinks=sinks, return_lse=True, num_splits=num_splits,
                           out=torch.full_like(problem.q, float("nan")))
    # Rows 0-2 (kv 0) and rows 5-6 (q_len 4 > kv_len 2: the first two see no key).
    empty = [0, 1, 2, 5, 6]
    assert torch.equal(out[empty].cpu(), torch.zeros_like(out[empty].cpu()))
    assert torch.equal(lse[empty].cpu(), sinks.cpu().expand(len(empty), -1))
    expected, expected_lse = problem.reference(sinks=sinks)
    harness.assert_close(out, expected, torch.float16)
    harness.assert_lse_close(lse, expected_lse)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [dict(num_splits=1), dict(num_splits=4), dict(batch_invariant=True)],
                         ids=["one_split", "four_splits", "batch_invariant"])
def test_rows_with_no_key_and_sinks_of_minus_inf(device, mode):
    """A sink of -inf is no sink, in every mode: rows that see no key (kv_len 0, causal rows
    before the KV) get out exactly 0 and lse exactly -inf, not NaN, and every row is bitwise
    the call without sinks (batch-invariant mode once gave NaN there on the CPU)."""
    harness.require(device, torch.float16)
    problem = harness.make_ragged([3, 2, 4], [0, 6, 2], group=2, head_dim=64,
                                  dtype=torch.float16, device=device, seed=8)
    none = torch.full((problem.q.shape[1],), float("-inf"), device=device)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    plain, plain_lse = problem.run(workspace, return_lse=True, **mode)
    out, lse = problem.run(workspace, sinks=none, return_lse=True, out=torch.full_like(problem.q, float("nan")),
                           **mode)
    empty = [0, 1, 2, 5, 6]
    assert torch.equal(out[empty].cpu(), torch.zeros_like(out[empty].cpu()))
    assert torch.equal(lse[empty].cpu(), torch.full_like(lse[empty].cpu(), float("-inf")))
    harness.assert_bitwise_equal(out, plain)
    harness.assert_bitwise_equal(lse, plain_lse)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_extreme_sinks(device, num_splits):
    """A sink far above every logit takes all the weight (out 0, lse the sink); far below,
    none; -inf is bitwise no sink at all. No overflow, no NaN."""
    harness.require(device, torch.bfloat16)
    problem = harness.make_paged([300, 17], page_size=16, group=2, head_dim=64,
                                 dtype=torch.bfloat16, device=device, seed=9)
    workspace = harness.shared_workspace(device)
    heads = problem.q.shape[1]
    plain, plain_lse = problem.run(workspace, return_lse=True, num_splits=num_splits)

    high = torch.full((heads,), 3.0e38, device=device)
    out, lse = problem.run(workspace, return_lse=True, num_splits=num_splits, sinks=high)
    assert torch.equal(out.cpu(), torch.zeros_like(out.cpu()))
    assert torch.equal(lse.cpu(), high.cpu().expand_as(lse.cpu()))

    low = torch.full((heads,), -3.0e38, device=device)
    out, lse = problem.run(workspace, return_lse=True, num_splits=num_splits, sinks=low)
    harness.assert_bitwise_equal(out, plain)
    harness.assert_bitwise_equal(lse, plain_lse)

    none = torch.full((heads,), float("-inf"), device=device)
    out, lse = problem.run(workspace, return_lse=True, num_splits=num_splits, sinks=none)
    harness.assert_bitwise_equal(out, plain)
    harness.assert_bitwise_equal(lse, plain_lse)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_ops_and_plans_take_sinks(device):
    """splitkv.ops (the torch.library ops) give the eager functions' bits with sinks."""
    harness.require(device, torch.float16)
    workspace = harness.shared_workspace(device)
    paged = harness.make_paged([70, 9], page_size=8, group=2, head_dim=64,
                               dtype=torch.float16, device=device, q_lens=[3, 1], seed=11)
    sinks = _sinks(paged.q.shape[1], device)
    args = (paged.q, paged.kv_cache, paged.block_tables, paged.seq_lens, workspace)
    kwargs = paged.kwargs(sinks=sinks, num_splits=2, return_lse=True)
    eager = splitkv.paged_attention(*args, **kwargs)
    op = splitkv.ops.paged_attention(*args, **kwargs)
    for a, b in zip(eager, op):
        harness.assert_bitwise_equal(a, b)
    assert splitkv.plan_paged_attention(*args, **kwargs).num_splits == 2

    ragged = harness.make_ragged([4, 2], [30, 2], group=2, head_dim=64, dtype=torch.float16,
                                 device=device, seed=12)
    args = (ragged.q, ragged.k, ragged.v, ragged.cu_seqlens_q, ragged.cu_seqlens_kv, workspace)
    eager = splitkv.ragged_attention(*args, sinks=sinks, return_lse=True, num_splits=3)
    op = splitkv.ops.ragged_attention(*args, sinks=sinks, return_lse=True, num_splits=3)
    for a, b in zip(eager, op):
        harness.assert_bitwise_equal(a, b)
    expected, expected_lse = ragged.reference(sinks=sinks)
    harness.assert_close(op[0], expected, torch.float16)
    harness.assert_lse_close(op[1], expected_lse)
    assert splitkv.plan_ragged_attention(*args, sinks=sinks, num_splits=3).num_splits == 3
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [2, 4])
def test_rows_in_one_split_match_the_one_split_call(device, num_splits):
    """Causal prefill: query row 0 sees key 0 alone, so with splits its other splits are
    empty; the merge's sink factor then gives the one-split call's bits."""
    harness.require(device, torch.bfloat16, 128)
    problem = harness.make_ragged([256], [256], group=4, head_dim=128, dtype=torch.bfloat16,
                                  device=device, seed=5)
    sinks = _sinks(problem.q.shape[1], device)
    workspace = harness.shared_workspace(device)
    out = problem.run(workspace, num_splits=num_splits, sinks=sinks)
    single = problem.run(workspace, num_splits=1, sinks=sinks)
    harness.assert_bitwise_equal(out[:1], single[:1])
    expected, _ = problem.reference(sinks=sinks)
    harness.assert_close(out, expected, torch.bfloat16)
