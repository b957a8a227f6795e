"""paged_attention against the float64 reference.

The grid is pairwise: every pair of values of any two factors appears in some case, so a
bug tied to one combination of two settings shows up without the full product.
"""

import zlib

import pytest
import torch

import harness
import splitkv
from harness import DEVICES

# seq_len shapes relative to page_size: one token, exactly a page, one past it, long.
_SEQ_LENS = {
    "one": lambda page: [1, 3, page + 2],
    "page": lambda page: [page, 2 * page, 5],
    "page+1": lambda page: [page + 1, 2 * page + 1, 1],
    "long": lambda page: [1000, page + 1, 7],
}

# Query tokens per request: decode (no cu_seqlens_q), speculative (a few), chunked
# prefill (more than one query tile per request).
_Q_LENS = {
    "decode": None,
    "spec": lambda seq_lens: [min(4, n) for n in seq_lens],
    "chunk": lambda seq_lens: [min(70, n) for n in seq_lens],
}

CASES = harness.pairwise({
    "page_size": [1, 16, 64],
    "seq": list(_SEQ_LENS),
    "group": [1, 4, 8],
    "head_dim": [64, 128, 256],
    "layout": ["HND", "NHD"],
    "form": ["5d", "pair", "strided"],
    "dtype": [torch.float32, torch.float16, torch.bfloat16],
    "queries": list(_Q_LENS),
    "num_splits": [1, 3, None],
    "out": [False, True],
    "lse": [False, True],
})


def _problem(case, device):
    seq_lens = _SEQ_LENS[case["seq"]](case["page_size"])
    q_lens = _Q_LENS[case["queries"]]
    return harness.make_paged(
        seq_lens, page_size=case["page_size"], group=case["group"], head_dim=case["head_dim"],
        dtype=case["dtype"], device=device, kv_layout=case["layout"], kv_form=case["form"],
        q_lens=None if q_lens is None else q_lens(seq_lens),
        seed=zlib.crc32(harness.case_id(case).encode()))


def test_grid_covers_every_pair():
    # The grid must stay small (CPU time) yet contain every value of every factor.
    assert len(CASES) <= 30
    for name in CASES[0]:
        assert len({repr(case[name]) for case in CASES}) >= 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=harness.case_id)
def test_matches_reference(device, case):
    harness.require(device, case["dtype"], case["head_dim"])
    problem = _problem(case, device)
    workspace = harness.shared_workspace(device)
    options = {"num_splits": case["num_splits"], "return_lse": case["lse"]}

    plan = problem.plan(workspace, **options)
    if case["num_splits"] is not None:
        assert plan.num_splits == case["num_splits"]
    harness.assert_plan_keeps_counter_region(plan)

    out = None
    if case["out"]:
        out = torch.full_like(problem.q, float("nan"))  # every element must be written
        options["out"] = out
    result = problem.run(workspace, **options)
    got, lse = result if case["lse"] else (result, None)
    if out is not None:
        assert got is out
    assert got.shape == problem.q.shape and got.dtype == problem.dtype

    expected, expected_lse = problem.reference()
    harness.assert_close(got, expected, problem.dtype)
    if lse is not None:
        assert lse.shape == problem.q.shape[:2]
        harness.assert_lse_close(lse, expected_lse)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_and_soft_cap(device, dtype):
    harness.require(device, dtype)
    problem = harness.make_paged([300, 17, 64], page_size=16, group=4, head_dim=128,
                                 dtype=dtype, device=device, q_lens=[5, 17, 1], seed=3)
    workspace = harness.shared_workspace(device)
    for options in ({"window_left": 40}, {"window_left": 0}, {"logits_soft_cap": 1.5},
                    {"window_left": 20, "logits_soft_cap": 2.0, "sm_scale": 0.3}):
        for num_splits in (1, 4):
            out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True, **options)
            expected, expected_lse = problem.reference(**options)
            harness.assert_close(out, expected, dtype)
            harness.assert_lse_close(lse, expected_lse)
            harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_that_see_no_key(device):
    # Request 0 has no KV at all; request 1 has more queries than keys (causal: the first
    # two see nothing); request 2 is a normal decode.
    harness.require(device)
    problem = harness.make_paged([0, 3, 40], page_size=16, group=2, head_dim=64,
                                 dtype=torch.float16, device=device, q_lens=[2, 5, 1], seed=5)
    workspace = harness.shared_workspace(device)
    for num_splits in (1, 3):
        out = torch.full_like(problem.q, float("nan"))
        out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True, out=out)
        expected, expected_lse = problem.reference()
        empty_rows = [0, 1, 2, 3]
        assert torch.equal(out[empty_rows].cpu(), torch.zeros_like(out[empty_rows]).cpu())
        assert torch.isneginf(lse[empty_rows]).all()
        harness.assert_close(out, expected, torch.float16)
        harness.assert_lse_close(lse, expected_lse)
        harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_non_causal_speculative_queries(device):
    harness.require(device)
    problem = harness.make_paged([50, 9], page_size=16, group=4, head_dim=64,
                                 dtype=torch.bfloat16, device=device, q_lens=[3, 4], seed=7)
    workspace = harness.shared_workspace(device)
    out = problem.run(workspace, causal=False, num_splits=2)
    expected, _ = problem.reference(causal=False)
    harness.assert_close(out, expected, torch.bfloat16)
    causal_out = problem.run(workspace, causal=True, num_splits=2)
    # The masks differ for all but the last query of each request.
    assert not torch.allclose(out[0].float(), causal_out[0].float(), atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    harness.require(device)
    problem = harness.make_paged([], page_size=16, dtype=torch.float16, device=device)
    out, lse = problem.run(harness.shared_workspace(device), return_lse=True)
    assert out.shape == (0, 2, 64) and lse.shape == (0, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_planner_splits_a_long_sequence(device):
    # One long request leaves most workers idle: the planner splits it, and the merged
    # result matches the reference and (closely) the unsplit one.
    harness.require(device)
    problem = harness.make_paged([4096], page_size=64, group=8, head_dim=128,
                                 dtype=torch.bfloat16, device=device, seed=11)
    workspace = harness.shared_workspace(device)
    plan = problem.plan(workspace)
    assert plan.num_splits > 1
    out = problem.run(workspace)
    expected, _ = problem.reference()
    harness.assert_close(out, expected, torch.bfloat16)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("head_dim, q_len", [(8, 1), (64, 1), (16, 16)],
                         ids=["d8 decode", "d64 decode", "d16 chunk of 16"])
def test_millions_of_keys_in_one_split_keep_float32_sums(head_dim, q_len):
    """2**22 keys of equal logits in one split (every block_tables entry is page 0, whose
    rows are equal): every weight is 1, so out is exactly v. The block sums (64 keys) and the
    running sums they add to are integers below float32's limits here. The CPU backend added
    p v key by key into the running sum, which past 2**24 drops the late keys' share (d8 gave
    4.8 for 5 and 7.43 for 7); the decode (direct), generic and row-lane kernels each add a
    block's sum once now."""
    page_size, num_keys = 256, 2**22
    k_row = torch.arange(1, head_dim + 1, dtype=torch.float32) / head_dim
    v_row = torch.arange(1, head_dim + 1, dtype=torch.float32)
    kv_cache = torch.stack([k_row.expand(1, page_size, head_dim), v_row.expand(1, page_size, head_dim)])
    kv_cache = kv_cache.unsqueeze(0).contiguous()  # [1 page, 2, 1 head, page_size, head_dim] (HND)
    block_tables = torch.zeros(1, num_keys // page_size, dtype=torch.int32)
    seq_lens = torch.tensor([num_keys], dtype=torch.int32)
    q = torch.full((q_len, 1, head_dim), 0.5)
    cu_seqlens_q = torch.tensor([0, q_len], dtype=torch.int32) if q_len > 1 else None
    out = torch.full_like(q, float("nan"))
    splitkv.paged_attention(q, kv_cache, block_tables, seq_lens, harness.shared_workspace("cpu"),
                            cu_seqlens_q=cu_seqlens_q, causal=False, num_splits=1, out=out)
    assert torch.equal(out, v_row.expand(q_len, 1, head_dim)), out[:, 0, :8]
