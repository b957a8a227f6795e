"""The Hopper (sm_90a wgmma + TMA) ragged prefill against the float64 reference.

The kernel serves ragged calls with one split, float16/bfloat16, head_dim 64, 128 or 256, a
group size dividing its tile's query rows (128; at head_dim 64 192, or else 128) and
16-byte-aligned q/k/v; on other GPUs the same calls run the
mma.sync kernel, so these tests pass there too. Cases aim at the kernel's edges: lengths that
are not multiples of its 128-row / 128-key tiles (64-key at head_dim 256), queries aligned to the end of longer or shorter
KV, GQA packing, windows, soft cap, LSE, empty requests, NaN-poisoned out, strided k/v,
neighbouring requests full of NaN/Inf, a CUDA graph, and agreement with the mma.sync kernel
(SPLITKV_DISABLE_SM90=1).
"""

import zlib

import pytest
import torch

import harness
import splitkv
import splitkv_reference

pytestmark = pytest.mark.gpu

_BATCHES = harness.PREFILL_SM90_BATCHES  # (q_lens, kv_lens)

CASES = harness.pairwise({
    "batch": list(_BATCHES),
    "causal": [True, False],
    "window_left": [-1, 0, 100],
    "logits_soft_cap": [0.0, 3.0],
    "group": [1, 2, 4, 8, 16],
    "dtype": [torch.float16, torch.bfloat16],
    "head_dim": [64, 128, 256],
    "strided": [False, True],
    "out": [False, True],
}, seed=7)


def _require():
    harness.require("cuda", torch.float16, 128)


def _run_and_check(problem, options, poison_out):
    workspace = harness.shared_workspace("cuda")
    return harness.run_and_check(problem, workspace, options, poison_out, num_splits=1)


@pytest.mark.parametrize("case", CASES, ids=harness.case_id)
def test_matches_reference(case):
    _require()
    q_lens, kv_lens = _BATCHES[case["batch"]]
    problem = harness.make_ragged(q_lens, kv_lens, group=case["group"], head_dim=case["head_dim"],
                                  dtype=case["dtype"], device="cuda", strided=case["strided"],
                                  seed=zlib.crc32(harness.case_id(case).encode()))
    options = {k: case[k] for k in ("causal", "window_left", "logits_soft_cap")}
    options["sm_scale"] = case["head_dim"] ** -0.5
    _run_and_check(problem, options, case["out"])


@pytest.mark.parametrize("group", [32, 64, 128])
def test_wide_groups(group):
    """Tiles of 4, 2 and 1 tokens (the q box is group heads x 128 / group tokens)."""
    _require()
    problem = harness.make_ragged([33, 5], [70, 5], num_kv_heads=1, group=group, head_dim=128,
                                  dtype=torch.bfloat16, device="cuda", seed=group)
    _run_and_check(problem, dict(causal=True, sm_scale=0.09), poison_out=True)


@pytest.mark.parametrize("group", [1, 3, 4, 6, 12, 48, 64, 96, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_head_dim_64_tiles(group, causal):
    """head_dim 64 runs 192-row tiles (three consumer warpgroups): groups dividing 192 (3, 6,
    12, 48, 96 do not divide 128) get tiles of 192 / group tokens; group 128 the 128-row tile.
    Lengths straddle the tiles' token counts."""
    _require()
    q_lens = [200, 1, 64 + group % 7, 97]
    problem = harness.make_ragged(q_lens, [q + 31 for q in q_lens], num_kv_heads=1, group=group, head_dim=64,
                                  dtype=torch.bfloat16, device="cuda", seed=group)
    _run_and_check(problem, dict(causal=causal, sm_scale=0.11), poison_out=True)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("pad", [0, 4, 8])
def test_out_row_views(head_dim, pad):
    """out as a view of wider rows: pad 0 and 8 keep rows 16-byte aligned (the epilogue stages
    a warp's rows in shared memory and stores 16 bytes a lane), pad 4 does not (2-byte stores).
    Every element of the view is written; the padding between rows is not touched."""
    _require()
    q_lens = [130, 1, 67]
    problem = harness.make_ragged(q_lens, [q + 9 for q in q_lens], num_kv_heads=2, group=4, head_dim=head_dim,
                                  dtype=torch.bfloat16, device="cuda", seed=head_dim + pad)
    tokens, heads, _ = problem.q.shape
    store = torch.full((tokens, heads, head_dim + pad), float("nan"), dtype=problem.dtype, device="cuda")
    out = store[..., :head_dim]
    options = dict(causal=True, sm_scale=head_dim ** -0.5)
    workspace = harness.shared_workspace("cuda")
    got, lse = problem.run(workspace, num_splits=1, return_lse=True, out=out, **options)
    assert got is out
    expected, expected_lse = problem.reference(**options)
    harness.assert_close(got, expected, problem.dtype)
    harness.assert_lse_close(lse, expected_lse)
    assert torch.isnan(store[..., head_dim:]).all()
    harness.assert_counter_region_zero(workspace)


def test_negative_scale_and_large_logits():
    """The max is taken after scaling (a negative sm_scale flips it); large logits stay finite."""
    _require()
    problem = harness.make_ragged([150], [150], group=4, head_dim=128, dtype=torch.float16,
                                  device="cuda", seed=3)
    problem.q.mul_(4.0)
    _run_and_check(problem, dict(causal=True, sm_scale=-0.3), poison_out=False)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_matches_mma_sync_kernel(monkeypatch, head_dim):
    """Both kernels agree to rounding on a long causal GQA prefill."""
    _require()
    problem = harness.make_ragged([700, 1300], [700, 1500], num_kv_heads=2, group=4,
                                  head_dim=head_dim, dtype=torch.bfloat16, device="cuda", seed=11)
    workspace = harness.shared_workspace("cuda")
    options = dict(causal=True, sm_scale=head_dim ** -0.5, num_splits=1, return_lse=True)
    fast, fast_lse = problem.run(workspace, **options)
    monkeypatch.setenv("SPLITKV_DISABLE_SM90", "1")
    slow, slow_lse = problem.run(workspace, **options)
    monkeypatch.delenv("SPLITKV_DISABLE_SM90")
    torch.testing.assert_close(fast.float(), slow.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(fast_lse, slow_lse, atol=1e-4, rtol=1e-5)


# Requests around the checked one hold NaN/Inf in q, k and v: TMA boxes read rows past a
# request's end (its last 128-key block, its last query tile), which must stay masked and
# must not reach its output even as 0 * NaN. (clean q_len, kv_len, options, keys of the
# clean request that none of its queries sees, poisoned too).
_ISOLATION = {
    "causal": (37, 37, dict(causal=True), 0),
    "noncausal": (37, 37, dict(causal=False), 0),
    # Window 50 at positions 260..299: keys below 210 are never visible.
    "window": (40, 300, dict(causal=True, window_left=50), 210),
    "cap_short_kv": (90, 70, dict(causal=True, logits_soft_cap=2.0), 0),
}


def _poison(x):
    """NaN, +Inf and -Inf rows in turn."""
    x[0::3] = float("nan")
    x[1::3] = float("inf")
    x[2::3] = float("-inf")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("case", list(_ISOLATION))
def test_other_requests_nonfinite_do_not_leak(case, group, head_dim, dtype):
    _require()
    q_len, kv_len, options, unseen = _ISOLATION[case]
    # Poisoned, clean, poisoned: the clean request's blocks overrun into the next one.
    problem = harness.make_ragged([50, q_len, 20], [130, kv_len, 200], group=group,
                                  head_dim=head_dim, dtype=dtype, device="cuda", seed=group)
    for x, cu in ((problem.q, [0, 50, 50 + q_len, 70 + q_len]),
                  (problem.k, [0, 130, 130 + kv_len, 330 + kv_len]),
                  (problem.v, [0, 130, 130 + kv_len, 330 + kv_len])):
        _poison(x[cu[0]:cu[1]])
        _poison(x[cu[2]:cu[3]])
    _poison(problem.k[130:130 + unseen])
    _poison(problem.v[130:130 + unseen])
    options = dict(options, sm_scale=head_dim ** -0.5)
    workspace = harness.shared_workspace("cuda")
    out = torch.full_like(problem.q, float("nan"))
    got, lse = problem.run(workspace, num_splits=1, return_lse=True, out=out, **options)
    expected, expected_lse = problem.reference(**options)
    rows = slice(50, 50 + q_len)
    harness.assert_close(got[rows], expected[rows], dtype)
    harness.assert_lse_close(lse[rows], expected_lse[rows])
    harness.assert_counter_region_zero(workspace)


def test_cuda_graph_replays():
    _require()
    torch.manual_seed(5)
    group, num_kv_heads, dtype = 4, 2, torch.float16
    q_lens, kv_lens = [150, 90], [150, 300]
    problem = harness.make_ragged(q_lens, kv_lens, num_kv_heads=num_kv_heads, group=group,
                                  head_dim=128, dtype=dtype, device="cuda", seed=5)
    workspace = splitkv.Workspace(16 << 20, "cuda")
    out = torch.empty_like(problem.q)
    options = dict(num_splits=1, max_q_len=max(q_lens), sm_scale=0.1, return_lse=True, out=out)
    graph, (_, lse) = harness.capture_graph(lambda: problem.run(workspace, **options))
    for _ in range(3):
        for x in (problem.q, problem.k, problem.v):
            x.copy_(torch.randn(x.shape, device="cuda").to(dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected, expected_lse = splitkv_reference.ragged_attention(
            problem.q.cpu(), problem.k.cpu(), problem.v.cpu(), problem.cu_seqlens_q,
            problem.cu_seqlens_kv, sm_scale=0.1)
        harness.assert_close(out, expected, dtype)
        harness.assert_lse_close(lse, expected_lse)

