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
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_paged_fp8_prefill_many_blocks(device, head_dim, num_splits):
    """Chunked prefill over an fp8 cache: query chunks of 97-160 tokens (prefill tiles) over
    up to 700 keys, many key blocks with a short last one and page tails past seq_len (on
    CUDA split plans run the mma.sync kernel, which streams the bytes by cp.async and
    converts each block before its mma; on sm_90 one split runs the wgmma prefill over a
    16-bit copy in the workspace), causal with a window, per-head scales."""
    harness.require(device, torch.bfloat16, head_dim)
    problem = harness.make_paged([700, 161, 333], page_size=16, group=4, head_dim=head_dim,
                                 dtype=torch.bfloat16, q_lens=[160, 161, 97], device=device, seed=12)
    k_scale = _scales(True, 2, 1)
    v_scale = _scales(True, 2, 2)
    problem.kv_cache, problem.keys, problem.values = _quantised_paged(problem, k_scale, v_scale)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    harness.run_and_check(problem, workspace, dict(window_left=300), poison_out=True, num_splits=num_splits,
                          k_scale=k_scale.to(device), v_scale=v_scale.to(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("num_splits", [None, 4])
@pytest.mark.parametrize("soft_cap", [0.0, 2.0])
def test_paged_fp8_decode_saturating_soft_cap(device, head_dim, num_splits, soft_cap):
    """Decode steps over an fp8 cache with logits of a few units (sm_scale 3 / sqrt(head_dim))
    and a soft cap of 2 that most of them saturate, or none; sinks; group 8, so on sm_90 the
    fp8 decode tiles with keys as the mma's rows run, which keep logits in log2 units (the
    cap becomes 2 log2(e) there); 1100 keys give the 256-key head_dim 64 tiles a few blocks."""
    harness.require(device, torch.bfloat16, head_dim)
    problem = harness.make_paged([1, 300, 1100], page_size=16, group=8, head_dim=head_dim,
                                 dtype=torch.bfloat16, device=device, seed=21)
    k_scale = _scales(True, 2, 3)
    v_scale = _scales(False, 2, 4)
    problem.kv_cache, problem.keys, problem.values = _quantised_paged(problem, k_scale, v_scale)
    sinks = torch.linspace(-2.0, 3.0, problem.q.shape[1], device=device)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    options = dict(sm_scale=3.0 / head_dim ** 0.5, logits_soft_cap=soft_cap, sinks=sinks)
    harness.run_and_check(problem, workspace, options, poison_out=True, num_splits=num_splits,
                          k_scale=_device_scale(k_scale, device), v_scale=v_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_ragged_fp8_with_sinks(device, num_splits):
    harness.require(device, torch.bfloat16)
    problem = harness.make_ragged([5, 0, 70], [30, 4, 200], group=4, head_dim=128,
                                  dtype=torch.bfloat16, device=device, seed=6)
    k_scale = torch.tensor([0.2, 0.05])
    v_scale = 0.125
    k = (problem.k.cpu().float() / k_scale[None, :, None]).to(FP8).to(device)
    v = (problem.v.cpu().float() / v_scale).to(FP8).to(device)
    problem.k, problem.v = k, v
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -3.0, 4.0, 0.25], device=device)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    out, lse = problem.run(workspace, return_lse=True, num_splits=num_splits, sinks=sinks,
                           k_scale=k_scale.to(device), v_scale=v_scale)
    expected, expected_lse = splitkv_reference_ragged(
        problem, k.cpu().float() * k_scale[None, :, None], v.cpu().float() * v_scale, sinks)
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


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_fp8_unaligned_rows(device):
    """fp8 k, v whose rows start at odd byte offsets (no vector loads on CUDA)."""
    harness.require(device, torch.float16)
    problem = harness.make_ragged([3, 40], [20, 90], group=2, head_dim=64, dtype=torch.float16,
                                  device=device, seed=10)
    padded = torch.full((problem.k.shape[0], 2, 2, 65), float("nan")).to(FP8)
    padded[..., :64] = torch.stack([problem.k.cpu().float() / 0.5,
                                    problem.v.cpu().float() / 0.5], 1).to(FP8)
    padded = padded.to(device)
    k, v = padded[:, 0, :, :64], padded[:, 1, :, :64]
    assert k.stride(1) == 65 and v.stride(0) == 260
    workspace = harness.shared_workspace(device)
    out = splitkv.ragged_attention(problem.q, k, v, problem.cu_seqlens_q, problem.cu_seqlens_kv,
                                   workspace, k_scale=0.5, v_scale=0.5, num_splits=2)
    expected, _ = splitkv_reference.ragged_attention(
        problem.q.cpu(), k.cpu().float() * 0.5, v.cpu().float() * 0.5, problem.cu_seqlens_q,
        problem.cu_seqlens_kv)
    harness.assert_close(out, expected, torch.float16)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_paged_fp8_decode_long(device, dtype, head_dim, num_splits):
    """Decode over longer fp8 caches: many key blocks (on sm_90 the bulk decode kernel, which
    converts the staged bytes to float16 and runs a bfloat16 q as float16 scaled by a power of
    two per row; at head_dim 64 its rows are staged as 64 bytes), sinks, GQA 4, per-head k
    scales, q rows far from magnitude 1 both ways, HND and NHD, planned and forced splits."""
    harness.require(device, dtype, head_dim)
    for kv_layout, q_magnitude, seed in (("HND", 30.0, 11), ("NHD", 1e-3, 12)):
        problem = harness.make_paged([1000, 3, 517, 64], page_size=16, group=4,
                                     head_dim=head_dim, dtype=dtype, kv_layout=kv_layout,
                                     device=device, seed=seed)
        problem.q = (problem.q.float() * q_magnitude).to(dtype)
        k_scale = _scales(True, 2, seed)
        v_scale = 0.3
        problem.kv_cache, problem.keys, problem.values = _quantised_paged(problem, k_scale,
                                                                          v_scale)
        sinks = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -3.0, 4.0, 0.25], device=device)
        workspace = harness.shared_workspace(device)
        harness.fill_garbage(workspace)
        out, _ = harness.run_and_check(
            problem, workspace, dict(sinks=sinks), poison_out=True, num_splits=num_splits,
            k_scale=k_scale.to(device), v_scale=v_scale)
        assert out.dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_paged_fp8_decode_small_pages(device, head_dim, num_splits):
    """Pages of 4 slots: no page-box tensor maps (they need 8+), so on sm_90 fp8 decode tiles
    run the mma.sync kernel, which converts as it loads (the bulk decode kernel takes every
    fp8 decode at pages of 8 or more)."""
    harness.require(device, torch.bfloat16, head_dim)
    problem = harness.make_paged([600, 5, 130], page_size=4, group=4, head_dim=head_dim,
                                 dtype=torch.bfloat16, device=device, seed=31)
    k_scale = _scales(True, 2, 31)
    problem.kv_cache, problem.keys, problem.values = _quantised_paged(problem, k_scale, 0.4)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    out, _ = harness.run_and_check(problem, workspace, {}, poison_out=True, num_splits=num_splits,
                                   k_scale=k_scale.to(device), v_scale=0.4)
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group,q_lens", [(8, None), (2, [4, 1, 3, 4]), (1, [8, 2, 5, 1]), (4, [2, 1, 2, 2]),
                                          (16, None), (3, [3, 1, 2, 3]), (4, [4, 1, 3, 2])],
                         ids=["g8", "g2q4", "g1q8", "g4q2", "g16", "g3q3", "g4q4"])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_paged_fp8_tile_rows(device, group, q_lens, num_splits):
    """Decode tiles of 1 to 16 query rows (group x tokens: one token at group 8 or 16, a few
    speculative tokens at a small group) over an fp8 cache at head_dim 128, 256 and 64, where
    causal rows of one tile see different keys, planned and forced splits, against float64
    on the dequantised K/V. On sm_90 tiles of at most 8 rows at head_dim 128 in a split grid
    (forced, or planned: 9 splits here) run keys as the mma's rows, the rest the query rows
    (d128 tiles of at most 8 rows unsplit: test_paged_fp8_decode_long); at head_dim 64 tiles
    of at most 8 rows keys as rows on every grid (here 256-key blocks), 16-row tiles the
    query rows (test_paged_fp8_d64_decode_shapes)."""
    # head_dim 64 at pages of 64: page boxes of 64 rows, four a 256-key fp8 block
    # (test_paged_fp8_decode_long has its pages of 16).
    for head_dim, dtype, seed, page_size in ((128, torch.bfloat16, 21, 16), (256, torch.float16, 22, 16),
                                             (64, torch.bfloat16, 23, 64)):
        harness.require(device, dtype, head_dim)
        problem = harness.make_paged([700, 9, 300, 1200], page_size=page_size, group=group,
                                     head_dim=head_dim, dtype=dtype, q_lens=q_lens,
                                     device=device, seed=seed)
        k_scale = _scales(True, 2, seed)
        problem.kv_cache, problem.keys, problem.values = _quantised_paged(problem, k_scale, 0.6)
        workspace = harness.shared_workspace(device)
        harness.fill_garbage(workspace)
        out, _ = harness.run_and_check(problem, workspace, {}, poison_out=True, num_splits=num_splits,
                                       k_scale=k_scale.to(device), v_scale=0.6)
        assert out.dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_requests,group,num_splits", [(2, 4, 3), (2, 8, None), (58, 4, 3), (58, 8, 3),
                                                           (2, 16, 3), (58, 16, 4)],
                         ids=["wide_g4", "wide_g8", "four_an_sm_g4", "four_an_sm_g8", "query_rows_g16",
                              "query_rows_four_an_sm_g16"])
def test_paged_fp8_d64_decode_shapes(device, num_requests, group, num_splits):
    """Head_dim 64 decode over an fp8 cache on each of its sm_90 shapes (tile_config.h
    kFp8D64KeyRowsCtasPerSm): tiles of at most 8 rows run keys as the mma's rows, 256-key
    blocks on grids of at most 2 CTAs an SM and 128-key blocks four an SM on larger grids
    (58 requests x 2 kv heads x 3 splits = 348 CTAs: past 2 an SM on a 132-SM H200); 16-row
    tiles the query rows, three CTAs an SM up to 3 an SM and four past it (x 4 splits: 464).
    Lengths cut partial blocks and boxes (the two-request cases several 256-key blocks a
    split; the planned case splits too), the window masks inside blocks, sinks,
    per-head k scales; NaN-poisoned out and scratch, float64 reference."""
    harness.require(device, torch.bfloat16, 64)
    if num_requests == 2:
        seq_lens = [2931, 1377]
    else:
        seq_lens = [1 + (97 * i + 13) % 1500 for i in range(num_requests)]
    problem = harness.make_paged(seq_lens, page_size=16, group=group, head_dim=64, dtype=torch.bfloat16,
                                 device=device, seed=41 + group)
    k_scale = _scales(True, 2, 41)
    problem.kv_cache, problem.keys, problem.values = _quantised_paged(problem, k_scale, 0.45)
    sinks = torch.linspace(-2.0, 3.0, 2 * group, device=device)
    workspace = harness.shared_workspace(device)
    harness.fill_garbage(workspace)
    harness.run_and_check(problem, workspace, dict(sinks=sinks, window_left=700), poison_out=True,
                          num_splits=num_splits, k_scale=k_scale.to(device), v_scale=0.45)


@pytest.mark.parametrize("cached", [False, True], ids=["first", "cached"])
def test_scale_tensors_overlapping_out_or_workspace_are_refused(cached):
    # Per-head scales are read while out and the workspace are written: an out or workspace
    # sharing their bytes was accepted (the workspace's scratch then overwrote the scales).
    # Refused on the full path and on a cached layout's, the scales untouched.
    from splitkv import _calls
    problem = harness.make_paged([40, 16, 33], page_size=16, num_kv_heads=2, group=2,
                                 head_dim=64, dtype=torch.bfloat16, seed=21)
    fp8 = problem.kv_cache.to(torch.float8_e4m3fn)
    workspace = splitkv.Workspace(32 << 20, "cpu")
    v_scale = torch.full((2,), 0.25)
    out = torch.empty_like(problem.q)
    k_scale = out.view(-1).view(torch.float32)[:2]
    k_scale.fill_(0.5)
    inside = workspace.tensor[splitkv.COUNTER_REGION_BYTES:][:8].view(torch.float32)
    if cached:  # the same layouts once with scales of their own
        _calls._layouts.clear()
        splitkv.paged_attention(problem.q, fp8, problem.block_tables, problem.seq_lens, workspace,
                                out=torch.empty_like(out), k_scale=k_scale.clone(),
                                v_scale=v_scale, num_splits=4)
        splitkv.paged_attention(problem.q, fp8, problem.block_tables, problem.seq_lens,
                                workspace.tensor, k_scale=0.5, v_scale=v_scale, num_splits=4)
    inside.fill_(0.25)  # after the warm-up calls, whose scratch covers these bytes
    with pytest.raises(ValueError, match="paged_attention: out overlaps k_scale"):
        splitkv.paged_attention(problem.q, fp8, problem.block_tables, problem.seq_lens, workspace,
                                out=out, k_scale=k_scale, v_scale=v_scale, num_splits=4)
    with pytest.raises(ValueError, match="paged_attention: workspace overlaps v_scale"):
        splitkv.paged_attention(problem.q, fp8, problem.block_tables, problem.seq_lens,
                                workspace.tensor, k_scale=0.5, v_scale=inside, num_splits=4)
    assert torch.equal(k_scale, torch.full((2,), 0.5))
    assert torch.equal(inside, torch.full((2,), 0.25))
    harness.assert_counter_region_zero(workspace)


def _staged_rows(workspace, offset, rows, num_kv_heads, head_dim, dtype):
    """rows x [num_kv_heads, head_dim] of dtype in the workspace at byte offset."""
    nbytes = rows * num_kv_heads * head_dim * 2
    return workspace.tensor[offset:offset + nbytes].view(dtype).view(rows, num_kv_heads, head_dim)


# The staged copy (workspace_layout.h StagedKvLayout): k past the counter region, then v,
# each 256-byte aligned (the tests' sizes are multiples of 256), 2 kv heads.
def _assert_ragged_copy(workspace, stored_k, stored_v, head_dim, dtype):
    """The copy holds the fp8 k and v ([total_kv, 2, head_dim]) as dtype, exactly."""
    offset = splitkv.COUNTER_REGION_BYTES
    for name, stored in (("k", stored_k), ("v", stored_v)):
        staged = _staged_rows(workspace, offset, stored.shape[0], 2, head_dim, dtype)
        assert torch.equal(staged.cpu(), stored.to(dtype)), f"the staged copy of {name}"
        offset += staged.numel() * 2


def _assert_paged_copy(workspace, problem, k_scale, v_scale, head_dim, dtype):
    """The copy holds each request's stored keys and values (problem.keys / values over
    the scales, as fp8, then dtype) in HND pages of 16 slots, request b's page j at
    b * max_pages_per_seq + j, exactly."""
    offset = splitkv.COUNTER_REGION_BYTES
    batch_size, max_pages = problem.block_tables.shape
    for name, rows, scale in (("k", problem.keys, k_scale), ("v", problem.values, v_scale)):
        pages = _staged_rows(workspace, offset, batch_size * max_pages * 2 * 16, 1, head_dim, dtype)
        offset += pages.numel() * 2
        pages = pages.view(batch_size * max_pages, 2, 16, head_dim).cpu()
        for b, x in enumerate(rows):
            stored = (x.float() / _per_head(scale, 1, 3)).to(FP8).to(dtype)  # [kv_len, heads, d]
            for j in range(0, x.shape[0], 16):
                slots = min(16, x.shape[0] - j)
                got = pages[b * max_pages + j // 16, :, :slots].transpose(0, 1)
                assert torch.equal(got, stored[j:j + slots]), f"the staged copy of {name}: request {b}, page {j // 16}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["ragged", "paged HND", "paged NHD"])
@pytest.mark.parametrize("room", [True, False], ids=["copy", "no_copy"])
def test_fp8_prefill_workspace_with_and_without_room_for_a_copy(device, head_dim, dtype, kind, room):
    """fp8 prefill whose workspace holds fp8_prefill_workspace_bytes (on sm_90 the call copies
    its K/V as 16-bit values into the workspace and runs the wgmma kernel over the copy) or
    only the counter region (the fp8 kernel reads the cache): causal with a window, a soft
    cap, sinks and per-head scales at group 4, against float64. Where the copy was made, it
    holds the stored values exactly; the counter region stays zero either way."""
    harness.require(device, dtype, head_dim)
    k_scale, v_scale = _scales(True, 2, 3), _scales(True, 2, 4)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -3.0, 4.0, 0.25], device=device)
    options = dict(window_left=200, logits_soft_cap=20.0, sinks=sinks, sm_scale=head_dim ** -0.5,
                   k_scale=k_scale.to(device), v_scale=v_scale.to(device))
    if kind == "ragged":
        problem = harness.make_ragged([150, 0, 129, 7], [150, 40, 300, 7], group=4, head_dim=head_dim,
                                      dtype=dtype, device=device, seed=21)
        k = (problem.k.cpu().float() / k_scale[None, :, None]).to(FP8)
        v = (problem.v.cpu().float() / v_scale[None, :, None]).to(FP8)
        problem.k, problem.v = k.to(device), v.to(device)
        nbytes = splitkv.fp8_prefill_workspace_bytes(2, head_dim, total_kv=k.shape[0])
        expected, expected_lse = splitkv_reference.ragged_attention(
            problem.q.cpu(), k.float() * k_scale[None, :, None], v.float() * v_scale[None, :, None],
            problem.cu_seqlens_q, problem.cu_seqlens_kv, **harness._reference_options(options))
    else:
        problem = harness.make_paged([300, 161, 7], page_size=16, group=4, head_dim=head_dim, dtype=dtype,
                                     kv_layout=kind.split()[1], q_lens=[150, 161, 7], device=device, seed=22)
        problem.kv_cache, problem.keys, problem.values = _quantised_paged(problem, k_scale, v_scale)
        nbytes = splitkv.fp8_prefill_workspace_bytes(2, head_dim, batch_size=3,
                                                     max_pages_per_seq=problem.block_tables.shape[1],
                                                     page_size=16)
        expected, expected_lse = problem.reference(**options)
    workspace = splitkv.Workspace(nbytes if room else splitkv.COUNTER_REGION_BYTES, device)
    harness.fill_garbage(workspace)
    out = torch.full_like(problem.q, float("nan"))
    out, lse = problem.run(workspace, out=out, return_lse=True, **options)
    harness.assert_close(out, expected, dtype)
    harness.assert_lse_close(lse, expected_lse)
    harness.assert_counter_region_zero(workspace)
    if not (room and device == "cuda" and torch.cuda.get_device_capability() == (9, 0)):
        return
    if kind == "ragged":
        _assert_ragged_copy(workspace, k, v, head_dim, dtype)
    else:
        _assert_paged_copy(workspace, problem, k_scale, v_scale, head_dim, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kind", ["ragged", "paged"])
def test_fp8_prefill_copy_of_rows_8_byte_aligned(device, head_dim, kind):
    """fp8 K/V whose row strides are multiples of 8 bytes but not 16 (each row padded by 8
    bytes, NaN in the padding): on sm_90 the call still takes the 16-bit copy (its 8-byte
    loads need only 8-byte strides) and the copy is packed. Against float64, the copy holds
    the stored values, and the counter region stays zero."""
    harness.require(device, torch.bfloat16, head_dim)
    if kind == "ragged":
        problem = harness.make_ragged([130, 0, 77], [130, 50, 201], group=4, head_dim=head_dim,
                                      dtype=torch.bfloat16, device=device, seed=26)
        rows = problem.k.shape[0]
        stored = [(x.cpu().float() / 0.5).to(FP8) for x in (problem.k, problem.v)]
        padded = [torch.full((rows, 2 * head_dim + 8), float("nan")).to(FP8) for _ in range(2)]
        for row_major, x in zip(padded, stored):
            row_major[:, :2 * head_dim] = x.reshape(rows, 2 * head_dim)
        problem.k, problem.v = (x.to(device)[:, :2 * head_dim].view(rows, 2, head_dim) for x in padded)
        assert problem.k.stride(0) == problem.v.stride(0) == 2 * head_dim + 8
        nbytes = splitkv.fp8_prefill_workspace_bytes(2, head_dim, total_kv=rows)
        expected, expected_lse = splitkv_reference.ragged_attention(
            problem.q.cpu(), stored[0].float() * 0.5, stored[1].float() * 0.5, problem.cu_seqlens_q,
            problem.cu_seqlens_kv)
    else:
        problem = harness.make_paged([200, 33, 90], page_size=16, group=4, head_dim=head_dim,
                                     dtype=torch.bfloat16, q_lens=[200, 1, 45], device=device, seed=27)
        fp8_cache, problem.keys, problem.values = _quantised_paged(problem, 0.5, 0.5)
        padded = torch.full((*fp8_cache.shape[:-1], head_dim + 8), float("nan")).to(FP8)
        padded[..., :head_dim] = fp8_cache.cpu()
        padded = padded.to(device)
        problem.kv_cache = (padded[:, 0, ..., :head_dim], padded[:, 1, ..., :head_dim])  # HND pair
        assert problem.kv_cache[0].stride(2) == head_dim + 8
        nbytes = splitkv.fp8_prefill_workspace_bytes(2, head_dim, batch_size=3,
                                                     max_pages_per_seq=problem.block_tables.shape[1],
                                                     page_size=16)
        expected, expected_lse = problem.reference()
    workspace = splitkv.Workspace(nbytes, device)
    harness.fill_garbage(workspace)
    out = torch.full_like(problem.q, float("nan"))
    out, lse = problem.run(workspace, out=out, return_lse=True, k_scale=0.5, v_scale=0.5, num_splits=1)
    harness.assert_close(out, expected, torch.bfloat16)
    harness.assert_lse_close(lse, expected_lse)
    harness.assert_counter_region_zero(workspace)
    if not (device == "cuda" and torch.cuda.get_device_capability() == (9, 0)):
        return
    if kind == "ragged":
        _assert_ragged_copy(workspace, *stored, head_dim, torch.bfloat16)
    else:
        _assert_paged_copy(workspace, problem, 0.5, 0.5, head_dim, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_prefill_split_plan_makes_no_copy(device):
    """A forced split plan keeps fp8 prefill on the fp8 kernel even with room for the copy:
    correct, and the workspace past the split partials is left as it was (NaN)."""
    harness.require(device, torch.bfloat16, 128)
    problem = harness.make_ragged([150, 60], [400, 60], group=4, head_dim=128, dtype=torch.bfloat16,
                                  device=device, seed=23)
    k = (problem.k.cpu().float() / 0.25).to(FP8)
    v = (problem.v.cpu().float() / 0.5).to(FP8)
    problem.k, problem.v = k.to(device), v.to(device)
    nbytes = splitkv.fp8_prefill_workspace_bytes(2, 128, total_kv=k.shape[0])
    partials = splitkv.required_workspace_bytes(problem.q.shape[0], 8, 128, 3)
    workspace = splitkv.Workspace(max(nbytes, partials) + (1 << 20), device)
    harness.fill_garbage(workspace)
    out = problem.run(workspace, k_scale=0.25, v_scale=0.5, num_splits=3)
    expected, _ = splitkv_reference.ragged_attention(problem.q.cpu(), k.float() * 0.25, v.float() * 0.5,
                                                     problem.cu_seqlens_q, problem.cu_seqlens_kv)
    harness.assert_close(out, expected, torch.bfloat16)
    harness.assert_counter_region_zero(workspace)
    assert workspace.tensor[partials:].view(torch.float32).isnan().all(), "no copy past the partials"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ragged", "paged"])
def test_fp8_prefill_copy_under_graph_replay(kind):
    """fp8 prefill with room for the 16-bit copy, captured in a CUDA graph: each replay over
    new K/V values (written into the same tensors) gives the eager call's bits."""
    harness.require("cuda", torch.bfloat16, 128)
    if kind == "ragged":
        problem = harness.make_ragged([200, 33], [260, 33], group=4, head_dim=128, dtype=torch.bfloat16,
                                      device="cuda", seed=24)
        problem.k, problem.v = (problem.k / 0.5).to(FP8), (problem.v / 0.5).to(FP8)
        sources = [problem.k, problem.v]
        nbytes = splitkv.fp8_prefill_workspace_bytes(2, 128, total_kv=problem.k.shape[0])
    else:
        problem = harness.make_paged([260, 33], page_size=16, group=4, head_dim=128, dtype=torch.bfloat16,
                                     q_lens=[200, 33], device="cuda", seed=24)
        problem.kv_cache = (problem.kv_cache.float() / 0.5).to(FP8)
        sources = [problem.kv_cache]
        nbytes = splitkv.fp8_prefill_workspace_bytes(2, 128, batch_size=2,
                                                     max_pages_per_seq=problem.block_tables.shape[1], page_size=16)
    workspace = splitkv.Workspace(nbytes, "cuda")
    out = torch.empty_like(problem.q)
    options = dict(k_scale=0.5, v_scale=0.5, num_splits=1, out=out, window_left=100, max_q_len=200)
    graph, _ = harness.capture_graph(lambda: problem.run(workspace, **options))
    generator = torch.Generator().manual_seed(25)
    for _ in range(2):
        for x in sources:  # new stored values, NaN tails of the cache kept as they are
            fresh = (torch.randn(x.shape, generator=generator) * 2).to(FP8).to("cuda")
            x.copy_(torch.where(x.float().isnan(), x.float(), fresh.float()).to(FP8))
        graph.replay()
        replayed = out.clone()
        eager = problem.run(workspace, **{**options, "out": None})
        harness.assert_bitwise_equal(replayed, eager)
    harness.assert_counter_region_zero(workspace)
