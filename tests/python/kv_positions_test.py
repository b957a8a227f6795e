"""paged_attention's kv_offsets / full_seq_lens: a call's keys as one shard of longer requests
(context parallelism), its masks over absolute positions.

Every case runs against the float64 reference (splitkv_reference.attention with the rows'
positions given in the shard's local key coordinates: full_seq_lens - kv_offsets - q_len + i)
on fresh random inputs, into a NaN-poisoned out over a NaN-filled workspace tail, with the
counter region checked zero after each call. Cases: decode and causal chunked prefill, with
and without sliding windows, shards wholly before a query's window, cut by it, around it,
past the queries (rows before the shard's first key see none of it), rows past the shard's
last key, an empty shard, forced splits, sinks, batch_invariant, GQA, the custom op and the
per-call path (a cached layout must read each call's own offsets). On CUDA (gpu mark) the
same cases run on every kernel the paged path reaches: the sm_90 decode kernel (decode tiles
at head_dim 128, bf16: the wgmma-order tiles unsplit, the 2-stage split shape at forced
splits), the mma.sync kernel's decode and chunked-prefill tiles
(head_dim 64), fp8 K/V, and batch_invariant (on sm_90 the decode kernel's wgmma-order path
and the wgmma prefill).
"""

import dataclasses

import pytest
import torch

import harness
import splitkv
from harness import DEVICES
from splitkv import _calls


@dataclasses.dataclass
class Shards:
    """One call's shards: request b holds keys kv_offsets[b] .. + seq_lens[b] of full_lens[b]."""

    seq_lens: list
    kv_offsets: list
    full_lens: list
    q_lens: list = None  # None: decode


# Decode: a shard ending at the query; one far before it (a window excludes it wholly); one
# cut by a window; an empty shard; a shard starting at 0 of a long request.
_DECODE = Shards(seq_lens=[40, 16, 0, 33, 7, 70], kv_offsets=[0, 100, 5, 60, 0, 130],
                 full_lens=[200, 116, 5, 93, 300, 250])
# Causal chunked prefill: the ordinary case (offset 0, shard = request); queries starting
# inside the shard and running past it; a long chunk over a short shard; rows before the
# shard's first key (they see none of it), rows inside, rows past; q_len > seq_len.
_PREFILL = Shards(seq_lens=[64, 30, 50, 20, 16, 9], kv_offsets=[0, 40, 10, 100, 0, 3],
                  full_lens=[64, 100, 200, 130, 16, 40], q_lens=[64, 50, 150, 40, 3, 37])


def _problem(shards, device, dtype=torch.float32, group=2, head_dim=64, page_size=16, seed=0,
             num_kv_heads=2):
    problem = harness.make_paged(shards.seq_lens, page_size=page_size, num_kv_heads=num_kv_heads,
                                 group=group, head_dim=head_dim, dtype=dtype, device=device,
                                 q_lens=shards.q_lens, seed=seed)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)
    return problem, as_int(shards.kv_offsets), as_int(shards.full_lens)


def _run_checked(problem, offsets, fulls, workspace, **options):
    """The call into a NaN-poisoned out over a NaN workspace tail, checked against float64
    with each row at its local position in the shard (PagedProblem.reference); returns
    (out, lse)."""
    harness.fill_garbage(workspace)
    return harness.run_and_check(problem, workspace, dict(options, kv_offsets=offsets, full_seq_lens=fulls),
                                 poison_out=True)


_OPTIONS = [
    dict(),
    dict(window_left=0),
    dict(window_left=20),
    dict(window_left=100),
    dict(num_splits=3, window_left=33),
    dict(num_splits=5),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("options", _OPTIONS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()) or "plain")
def test_decode_shards_match_float64(device, dtype, options):
    harness.require(device, dtype)
    problem, offsets, fulls = _problem(_DECODE, device, dtype, seed=1)
    out, lse = _run_checked(problem, offsets, fulls, harness.shared_workspace(device),
                            **options)
    # Request 4's query sits 293 keys past its shard: any window leaves it nothing.
    if options.get("window_left", -1) in (0, 20, 33, 100):
        assert torch.all(out[4] == 0) and torch.all(lse[4] == float("-inf"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("options", _OPTIONS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()) or "plain")
def test_prefill_shards_match_float64(device, dtype, causal, options):
    harness.require(device, dtype)
    problem, offsets, fulls = _problem(_PREFILL, device, dtype, seed=2)
    out, lse = _run_checked(problem, offsets, fulls, harness.shared_workspace(device),
                            causal=causal, **options)
    if causal:
        # Request 3's first 10 rows (positions 90..99) lie before its shard (100..119).
        rows = slice(sum(_PREFILL.q_lens[:3]), sum(_PREFILL.q_lens[:3]) + 10)
        assert torch.all(out[rows] == 0) and torch.all(lse[rows] == float("-inf"))


@pytest.mark.parametrize("device", DEVICES)
def test_without_a_shift_bitwise_the_plain_call(device):
    # kv_offsets 0 and full_seq_lens = seq_lens place the queries where the plain call does.
    harness.require(device, torch.bfloat16)
    shards = Shards(seq_lens=[64, 30, 50], kv_offsets=[0, 0, 0], full_lens=[64, 30, 50],
                    q_lens=[64, 5, 1])
    problem, offsets, fulls = _problem(shards, device, torch.bfloat16, seed=3)
    workspace = harness.shared_workspace(device)
    for options in (dict(), dict(window_left=9, num_splits=2)):
        plain = problem.run(workspace, return_lse=True, **options)
        shifted = problem.run(workspace, return_lse=True, kv_offsets=offsets, full_seq_lens=fulls,
                              **options)
        assert torch.equal(plain[0], shifted[0]) and torch.equal(plain[1], shifted[1])


@pytest.mark.parametrize("device", DEVICES)
def test_sinks_and_soft_cap(device):
    harness.require(device, torch.bfloat16)
    problem, offsets, fulls = _problem(_PREFILL, device, torch.bfloat16, seed=4)
    sinks = torch.randn(problem.q.shape[1], generator=torch.Generator().manual_seed(5)).to(device)
    out, lse = _run_checked(problem, offsets, fulls, harness.shared_workspace(device),
                            window_left=30, sinks=sinks, logits_soft_cap=20.0, num_splits=2)
    # A row that sees no key of its shard: out 0, lse the sink.
    rows = sum(_PREFILL.q_lens[:3])
    torch.testing.assert_close(lse[rows].cpu(), sinks.cpu(), atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_invariant(device):
    # The invariant mode over shards: its splits are cut at the shard's local positions; the
    # result matches float64, and a request's bits do not depend on its batch.
    harness.require(device, torch.bfloat16)
    shards = Shards(seq_lens=[1500, 300, 2100], kv_offsets=[0, 700, 2000],
                    full_lens=[3000, 1000, 4100], q_lens=[1, 20, 3])
    problem, offsets, fulls = _problem(shards, device, torch.bfloat16, seed=6)
    workspace = harness.shared_workspace(device)
    out, lse = _run_checked(problem, offsets, fulls, workspace, window_left=1600,
                            batch_invariant=True)
    # Request 2 alone: the same bits.
    got = splitkv.paged_attention(problem.q[21:], problem.kv_cache, problem.block_tables[2:],
                                  problem.seq_lens[2:],
                                  workspace, cu_seqlens_q=harness.cu_seqlens([3], device),
                                  return_lse=True, window_left=1600, batch_invariant=True,
                                  kv_offsets=offsets[2:], full_seq_lens=fulls[2:])
    assert torch.equal(got[0], out[21:]) and torch.equal(got[1], lse[21:])


@pytest.mark.parametrize("device", DEVICES)
def test_custom_op_and_plan(device):
    harness.require(device, torch.bfloat16)
    problem, offsets, fulls = _problem(_PREFILL, device, torch.bfloat16, seed=7)
    workspace = harness.shared_workspace(device)
    eager = problem.run(workspace, return_lse=True, window_left=25, kv_offsets=offsets,
                        full_seq_lens=fulls)
    op = splitkv.ops.paged_attention(problem.q, problem.kv_cache, problem.block_tables,
                                     problem.seq_lens, workspace, cu_seqlens_q=problem.cu_seqlens_q,
                                     return_lse=True, window_left=25, kv_offsets=offsets,
                                     full_seq_lens=fulls)
    assert torch.equal(eager[0], op[0]) and torch.equal(eager[1], op[1])
    plan = problem.plan(workspace, kv_offsets=offsets, full_seq_lens=fulls)
    assert plan.num_splits >= 1
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_cached_calls_read_each_calls_offsets(device, monkeypatch):
    # Same layout, other kv_offsets / full_seq_lens tensors: after the first call every
    # call takes the per-call path and must read its own tensors (a call that reused the
    # first call's addresses would give the first call's rows, which differ here).
    harness.require(device, torch.bfloat16)
    counts = {"full": 0}
    original = _calls.paged_params

    def counted(*args, **kwargs):
        counts["full"] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(_calls, "paged_params", counted)
    _calls._layouts.clear()
    problem, _, _ = _problem(_DECODE, device, torch.bfloat16, seed=8)
    workspace = harness.shared_workspace(device)
    variants = [
        Shards(_DECODE.seq_lens, _DECODE.kv_offsets, _DECODE.full_lens),
        Shards(_DECODE.seq_lens, [0, 0, 0, 0, 0, 0], [40, 16, 0, 33, 7, 70]),
        Shards(_DECODE.seq_lens, [10, 50, 0, 3, 1, 0], [80, 90, 1, 60, 9, 300]),
    ]
    results = []
    for shards in variants:
        offsets = torch.tensor(shards.kv_offsets, dtype=torch.int32, device=device)
        fulls = torch.tensor(shards.full_lens, dtype=torch.int32, device=device)
        results.append(_run_checked(problem, offsets, fulls, workspace, window_left=30))
    assert counts["full"] == 1
    assert not torch.equal(results[0][1], results[1][1])
    assert not torch.equal(results[1][1], results[2][1])
    # A cached layout without offsets is another layout: the plain call is not shifted.
    plain = problem.run(workspace, return_lse=True, window_left=30)
    assert torch.equal(plain[0], results[1][0]) and torch.equal(plain[1], results[1][1])


# ---- CUDA: every kernel the paged path reaches ----


@pytest.mark.gpu
@pytest.mark.parametrize("kv_form", ["5d", "pair"])
def test_cuda_bulk_decode_kernel_head_dim_128(kv_form):
    # sm_90: decode tiles at head_dim 128, bf16, 16-byte aligned pages of 16 slots run the bulk
    # decode kernel (tensor-map copies for the 5-D cache); elsewhere the mma.sync kernel.
    harness.require("cuda", torch.bfloat16, 128)
    shards = Shards(seq_lens=[700, 160, 0, 3000, 90], kv_offsets=[0, 1000, 40, 500, 4000],
                    full_lens=[5000, 1160, 40, 3600, 4090])
    problem = harness.make_paged(shards.seq_lens, page_size=16, num_kv_heads=4, group=4,
                                 head_dim=128, dtype=torch.bfloat16, device="cuda", kv_form=kv_form,
                                 seed=9)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")
    workspace = harness.shared_workspace("cuda")
    for options in (dict(), dict(window_left=127), dict(window_left=1000), dict(num_splits=7),
                    dict(window_left=2600, num_splits=4)):
        _run_checked(problem, as_int(shards.kv_offsets), as_int(shards.full_lens),
                     workspace, **options)


@pytest.mark.gpu
def test_cuda_fp8_decode_and_prefill():
    harness.require("cuda", torch.bfloat16, 128)
    for shards, head_dim in ((Shards([700, 0, 300], [0, 9, 100], [900, 9, 400]), 128),
                             (_PREFILL, 64)):
        problem = harness.make_paged(shards.seq_lens, page_size=16, group=2, head_dim=head_dim,
                                     dtype=torch.bfloat16, device="cuda", q_lens=shards.q_lens,
                                     seed=10)
        k_scale, v_scale = 0.5, 0.25
        fp8 = (problem.kv_cache / torch.tensor([k_scale, v_scale], device="cuda").view(1, 2, 1, 1, 1)
               ).to(torch.float8_e4m3fn)
        dequant = fp8.to(torch.float32) * torch.tensor([k_scale, v_scale], device="cuda").view(
            1, 2, 1, 1, 1)
        # The reference reads the dequantised keys and values.
        pages = problem.block_tables.cpu()
        for b, n in enumerate(shards.seq_lens):
            slots = torch.arange(n)
            rows = dequant.cpu()[pages[b, slots // 16].long(), :, :, slots % 16]  # [n, 2, heads, d]
            problem.keys[b], problem.values[b] = rows[:, 0], rows[:, 1]
        problem.kv_cache = fp8
        as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")
        _run_checked(problem, as_int(shards.kv_offsets), as_int(shards.full_lens),
                     harness.shared_workspace("cuda"), window_left=150, k_scale=k_scale,
                     v_scale=v_scale)


# ---- found by probing (issue 20's breaker): odd shards and an out over the index tensors ----


def _independent_float64(problem, shards, causal=True, window_left=-1):
    """float64 attention straight from the documented semantics, without splitkv_reference:
    query i of request b at absolute position full_lens[b] - q_len + i, key t at
    kv_offsets[b] + t; returns (out, lse) with 0 and -inf for rows that see no key."""
    q = problem.q.cpu().double()
    total_q, num_qo_heads, head_dim = q.shape
    group = num_qo_heads // problem.keys[0].shape[1] if problem.keys else 1
    out = torch.zeros(total_q, num_qo_heads, head_dim, dtype=torch.float64)
    lse = torch.full((total_q, num_qo_heads), float("-inf"), dtype=torch.float64)
    row = 0
    for b, q_len in enumerate(problem.q_lens):
        k, v = problem.keys[b].double(), problem.values[b].double()
        key_pos = shards.kv_offsets[b] + torch.arange(k.shape[0], dtype=torch.int64)
        for i in range(q_len):
            pos = shards.full_lens[b] - q_len + i
            seen = torch.ones(k.shape[0], dtype=torch.bool)
            if causal:
                seen &= key_pos <= pos
            if window_left >= 0:
                seen &= key_pos >= pos - window_left
            if seen.any():
                for h in range(num_qo_heads):
                    logits = k[seen, h // group] @ q[row, h] / head_dim ** 0.5
                    lse[row, h] = torch.logsumexp(logits, 0)
                    out[row, h] = torch.softmax(logits, 0) @ v[seen, h // group]
            row += 1
    return out, lse


_INT32_MAX = 2**31 - 1
# Requests of 2^31 - 1 keys: shards at the start, at the very end, just before the end and in
# the middle; positions near int32's limit (pos + 1 and pos - window_left must not wrap).
_HUGE = Shards(seq_lens=[40, 33, 20, 5], kv_offsets=[0, _INT32_MAX - 33, _INT32_MAX - 100, 2**30],
               full_lens=[_INT32_MAX] * 4, q_lens=[3, 5, 1, 4])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("window_left", [-1, 0, 60, _INT32_MAX - 1, _INT32_MAX])
def test_positions_near_int32_max(device, causal, window_left):
    harness.require(device, torch.bfloat16)
    problem, offsets, fulls = _problem(_HUGE, device, torch.bfloat16, seed=11)
    out, lse = _run_checked(problem, offsets, fulls, harness.shared_workspace(device),
                            causal=causal, window_left=window_left)
    expected, expected_lse = _independent_float64(problem, _HUGE, causal, window_left)
    harness.assert_close(out, expected, torch.bfloat16)
    harness.assert_lse_close(lse, expected_lse)
    # Request 0's shard (positions 0..39) lies far before its queries: only a window of at
    # least 2^31 - 41 keys (or none) reaches it.
    reaches = window_left < 0 or window_left >= _INT32_MAX - 40
    assert bool(torch.isfinite(lse[:3]).all()) == reaches


# Empty query segments (q_len 0) beside rows that see nothing, empty shards, q_len above
# the shard's keys and above full_seq_lens (queries at negative positions).
_ODD = Shards(seq_lens=[0, 7, 33, 0, 16, 100], kv_offsets=[4, 0, 200, 0, 9, 1],
              full_lens=[4, 7, 233, 0, 40, 101], q_lens=[3, 0, 50, 2, 0, 120])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
@pytest.mark.parametrize("options", [dict(), dict(window_left=1, num_splits=7),
                                     dict(window_left=0, causal=False),
                                     dict(window_left=40, logits_soft_cap=5.0)],
                         ids=["plain", "w1-split7", "w0-full", "w40-cap"])
def test_odd_shards_and_empty_segments(device, kv_layout, options):
    harness.require(device, torch.float16, 128)
    problem = harness.make_paged(_ODD.seq_lens, page_size=16, num_kv_heads=1, group=8,
                                 head_dim=128, dtype=torch.float16, device=device,
                                 kv_layout=kv_layout, q_lens=_ODD.q_lens, seed=12)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)
    out, lse = _run_checked(problem, as_int(_ODD.kv_offsets), as_int(_ODD.full_lens),
                            harness.shared_workspace(device), **options)
    if "logits_soft_cap" not in options:
        expected, expected_lse = _independent_float64(problem, _ODD, options.get("causal", True),
                                                      options.get("window_left", -1))
        harness.assert_close(out, expected, torch.float16)
        harness.assert_lse_close(lse, expected_lse)
    # Request 0: no keys; request 3: no keys and queries at positions -2, -1.
    assert torch.all(out[:3] == 0) and torch.all(lse[:3] == float("-inf"))


@pytest.mark.parametrize("cached", [False, True], ids=["first", "cached"])
@pytest.mark.parametrize("index", ["kv_offsets", "full_seq_lens", "seq_lens"])
def test_out_over_an_index_tensor_is_refused(index, cached):
    # The kernels read the index tensors while other tasks write out: an out sharing their
    # bytes was accepted (and an out over seq_lens crashed the process, reading pages past
    # the cache). Refused on the full path and on the cached layout's, counters left zero.
    problem, offsets, fulls = _problem(_DECODE, "cpu", torch.float32, seed=13)
    workspace = harness.shared_workspace("cpu")
    out = torch.empty_like(problem.q)
    inside = out.view(-1).view(torch.int32)[:len(_DECODE.seq_lens)]
    tensors = dict(seq_lens=problem.seq_lens, kv_offsets=offsets, full_seq_lens=fulls)
    inside.copy_(tensors[index])
    before = inside.clone()
    tensors[index] = inside
    if cached:  # the same layout once with an out of its own
        _calls._layouts.clear()
        splitkv.paged_attention(problem.q, problem.kv_cache, problem.block_tables,
                                tensors["seq_lens"], workspace, out=torch.empty_like(out),
                                kv_offsets=tensors["kv_offsets"],
                                full_seq_lens=tensors["full_seq_lens"])
    with pytest.raises(ValueError, match=f"paged_attention: out overlaps {index}: expected a "
                                         f"tensor sharing no byte with {index}"):
        splitkv.paged_attention(problem.q, problem.kv_cache, problem.block_tables,
                                tensors["seq_lens"], workspace, out=out,
                                kv_offsets=tensors["kv_offsets"],
                                full_seq_lens=tensors["full_seq_lens"])
    assert torch.equal(inside, before)
    harness.assert_counter_region_zero(workspace)
