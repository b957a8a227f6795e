"""Paged prefill (paged_attention with cu_seqlens_q) on the Hopper wgmma + TMA kernel, against
the float64 reference.

On sm_90 the kernel serves a paged call's prefill tiles with one split, float16/bfloat16,
head_dim 64, 128 or 256, a group dividing the tile's query rows (128; at head_dim 64 192, or
else 128), pages of 8 slots or more, HND or NHD caches whose page maps the driver accepts
(prefill_sm90.h); elsewhere, and for the cases it leaves out (pages of 4 slots, forced
splits), the same calls run the mma.sync kernel, so these tests pass there too. Every call
writes into a NaN-poisoned out over a NaN-filled workspace tail, and the counter region is
checked zero after it. The caches hold NaN in every page tail, spare page and block-table
padding (harness.make_paged); further cases poison keys that no
query of a request sees (below a window, in the same page box as seen keys), place the
queries by kv_offsets / full_seq_lens, add sinks and a soft cap, replay a CUDA graph, and
compare bit for bit with the ragged call of the same keys (both run the same kernel's
blocks in the same order when the tile's keys start on a box boundary).
"""

import zlib

import pytest
import torch

import harness
import splitkv

pytestmark = pytest.mark.gpu

_BATCHES = harness.PREFILL_SM90_BATCHES  # (q_lens, seq_lens)

CASES = harness.pairwise({
    "batch": list(_BATCHES),
    "kv_layout": ["HND", "NHD"],
    "kv_form": ["5d", "pair", "strided"],
    "page_size": [8, 16, 64, 128],
    "causal": [True, False],
    "window_left": [-1, 0, 100],
    "logits_soft_cap": [0.0, 3.0],
    "group": [1, 4, 16],
    "dtype": [torch.float16, torch.bfloat16],
    "head_dim": [64, 128, 256],
}, seed=18)


def _problem(q_lens, seq_lens, *, page_size=16, kv_layout="HND", kv_form="5d", group=4,
             head_dim=128, dtype=torch.bfloat16, num_kv_heads=2, seed=0):
    return harness.make_paged(seq_lens, page_size=page_size, num_kv_heads=num_kv_heads,
                              group=group, head_dim=head_dim, dtype=dtype, device="cuda",
                              kv_layout=kv_layout, kv_form=kv_form, q_lens=q_lens, seed=seed)


def _check(problem, options, **run_options):
    """One call into NaN out over a NaN workspace tail; out, lse and counters checked."""
    workspace = harness.shared_workspace("cuda")
    harness.fill_garbage(workspace)
    return harness.run_and_check(problem, workspace, options, poison_out=True, **run_options)


@pytest.mark.parametrize("case", CASES, ids=harness.case_id)
def test_matches_reference(case):
    harness.require("cuda", case["dtype"], case["head_dim"])
    q_lens, seq_lens = _BATCHES[case["batch"]]
    problem = _problem(q_lens, seq_lens, page_size=case["page_size"], kv_layout=case["kv_layout"],
                       kv_form=case["kv_form"], group=case["group"], head_dim=case["head_dim"],
                       dtype=case["dtype"], seed=zlib.crc32(harness.case_id(case).encode()))
    options = {k: case[k] for k in ("causal", "window_left", "logits_soft_cap")}
    options["sm_scale"] = case["head_dim"] ** -0.5
    _check(problem, options, num_splits=1)


def _cache_rows(problem, request, keys):
    """Views of the 5-D cache's K and V rows of `keys` of `request` (each [heads, head_dim])."""
    page_size = problem.kv_cache.shape[3 if problem.kv_layout == "HND" else 2]
    rows = []
    for t in keys:
        page = int(problem.block_tables[request, t // page_size])
        slot = t % page_size
        for kv in (0, 1):
            if problem.kv_layout == "HND":
                rows.append(problem.kv_cache[page, kv, :, slot])
            else:
                rows.append(problem.kv_cache[page, kv, slot])
    return rows


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
@pytest.mark.parametrize("page_size", [16, 64])
def test_unseen_keys_nonfinite_do_not_leak(page_size, kv_layout, head_dim):
    # Window 50 at positions 260..299 of request 1: keys below 210 are never visible; 200..209
    # share a page box with seen keys (blocks start on a box boundary), and hold NaN / Inf.
    harness.require("cuda", torch.bfloat16, head_dim)
    problem = _problem([30, 40], [90, 300], page_size=page_size, kv_layout=kv_layout,
                       head_dim=head_dim, seed=page_size + head_dim)
    options = dict(causal=True, window_left=50, sm_scale=head_dim ** -0.5)
    # The reference reads problem.keys / values (CPU copies), which the poison leaves as they were.
    for i, row in enumerate(_cache_rows(problem, 1, range(0, 210))):
        row.fill_((float("nan"), float("inf"), float("-inf"))[i % 3])
    _check(problem, options, num_splits=1)


# Shards of longer requests (kv_positions_test's prefill cases): queries starting inside the
# shard and running past it, rows before the shard's first key, q_len > seq_len.
_SHARDS = dict(seq_lens=[64, 30, 50, 20, 16, 9, 700], kv_offsets=[0, 40, 10, 100, 0, 3, 300],
               full_lens=[64, 100, 200, 130, 16, 40, 1200], q_lens=[64, 50, 150, 40, 3, 37, 300])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
@pytest.mark.parametrize("options", [dict(), dict(causal=False), dict(window_left=20),
                                     dict(window_left=130, logits_soft_cap=5.0)],
                         ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()) or "plain")
def test_kv_offsets(options, kv_layout, head_dim):
    harness.require("cuda", torch.bfloat16, head_dim)
    problem = _problem(_SHARDS["q_lens"], _SHARDS["seq_lens"], kv_layout=kv_layout,
                       head_dim=head_dim, seed=head_dim)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")
    options = dict(options, sm_scale=head_dim ** -0.5)
    got, lse = _check(problem, dict(options, kv_offsets=as_int(_SHARDS["kv_offsets"]),
                                    full_seq_lens=as_int(_SHARDS["full_lens"])), num_splits=1)
    if options.get("causal", True):
        # Request 3's first 10 rows (positions 90..99) lie before its shard (100..119).
        rows = slice(sum(_SHARDS["q_lens"][:3]), sum(_SHARDS["q_lens"][:3]) + 10)
        assert torch.all(got[rows] == 0) and torch.all(lse[rows] == float("-inf"))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_sinks(head_dim):
    harness.require("cuda", torch.float16, head_dim)
    problem = _problem([100, 7, 300], [100, 200, 300], group=8, head_dim=head_dim,
                       dtype=torch.float16, kv_layout="NHD", seed=3)
    sinks = torch.randn(problem.q.shape[1], generator=torch.Generator().manual_seed(4)).cuda()
    for options in (dict(sinks=sinks), dict(sinks=sinks, window_left=0, logits_soft_cap=10.0)):
        _check(problem, dict(options, sm_scale=head_dim ** -0.5), num_splits=1)


@pytest.mark.parametrize("group", [3, 12, 64, 128])
@pytest.mark.parametrize("page_size", [16, 64])
def test_head_dim_64_tiles(group, page_size):
    """head_dim 64's 192-row tiles over the cache: groups dividing 192 but not 128 (3, 12), a
    tile of 3 tokens (64), and group 128 on the 128-row tile; chunks straddle the tiles."""
    harness.require("cuda", torch.bfloat16, 64)
    problem = _problem([130, 1, 70], [300, 64, 70], page_size=page_size, group=group, head_dim=64,
                       num_kv_heads=1, seed=group + page_size)
    _check(problem, dict(causal=True, sm_scale=0.125), num_splits=1)


@pytest.mark.parametrize("options", [dict(page_size=4), dict(num_splits=3)],
                         ids=["page4", "splits3"])
def test_cases_left_to_mma_sync(options):
    # Pages under 8 slots and split plans keep the mma.sync kernel: still exact.
    harness.require("cuda", torch.bfloat16, 128)
    options = dict(options)
    page_size = options.pop("page_size", 16)
    problem = _problem([90, 300], [200, 300], page_size=page_size, seed=page_size)
    _check(problem, dict(causal=True, window_left=70, sm_scale=0.08), **options)


def _ragged_of(problem):
    """The ragged call over the same queries and keys."""
    k = torch.cat(problem.keys).cuda()
    v = torch.cat(problem.values).cuda()
    cu_kv = harness.cu_seqlens([x.shape[0] for x in problem.keys], "cuda")
    return harness.RaggedProblem(q=problem.q, k=k, v=v, cu_seqlens_q=problem.cu_seqlens_q,
                                 cu_seqlens_kv=cu_kv)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
def test_bitwise_the_ragged_call(kv_layout, head_dim):
    # Causal without a window: every tile's keys start at 0, a box boundary, so the paged
    # kernel reads the same blocks as the ragged one and sums in the same order.
    harness.require("cuda", torch.bfloat16, head_dim)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the paged and ragged calls share the wgmma kernel on sm_90 only")
    problem = _problem([300, 77, 513], [300, 200, 600], kv_layout=kv_layout, head_dim=head_dim,
                       seed=head_dim)
    workspace = harness.shared_workspace("cuda")
    options = dict(causal=True, num_splits=1, return_lse=True, sm_scale=head_dim ** -0.5)
    paged = problem.run(workspace, **options)
    ragged = _ragged_of(problem).run(workspace, **options)
    assert torch.equal(paged[0], ragged[0]) and torch.equal(paged[1], ragged[1])


def test_matches_mma_sync_kernel(monkeypatch):
    """Both kernels agree to rounding on a long causal GQA chunked prefill."""
    harness.require("cuda", torch.bfloat16, 128)
    problem = _problem([700, 1300], [900, 1500], group=4, seed=11)
    workspace = harness.shared_workspace("cuda")
    options = dict(causal=True, sm_scale=128 ** -0.5, num_splits=1, return_lse=True)
    fast, fast_lse = problem.run(workspace, **options)
    monkeypatch.setenv("SPLITKV_DISABLE_SM90", "1")
    slow, slow_lse = problem.run(workspace, **options)
    monkeypatch.delenv("SPLITKV_DISABLE_SM90")
    torch.testing.assert_close(fast.float(), slow.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(fast_lse, slow_lse, atol=1e-4, rtol=1e-5)


def test_cuda_graph_replays():
    harness.require("cuda", torch.float16, 128)
    dtype = torch.float16
    problem = _problem([150, 90], [150, 300], dtype=dtype, kv_layout="NHD", seed=5)
    workspace = splitkv.Workspace(16 << 20, "cuda")
    out = torch.empty_like(problem.q)
    options = dict(num_splits=1, max_q_len=150, sm_scale=0.1, return_lse=True, out=out)
    graph, (_, lse) = harness.capture_graph(lambda: problem.run(workspace, **options))
    generator = torch.Generator().manual_seed(6)
    for _ in range(3):
        problem.q.copy_(torch.randn(problem.q.shape, generator=generator).to(dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected, expected_lse = problem.reference(sm_scale=0.1)
        harness.assert_close(out, expected, dtype)
        harness.assert_lse_close(lse, expected_lse)
    harness.assert_counter_region_zero(workspace)
