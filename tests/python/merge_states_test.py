"""splitkv.merge_states: against float64 attention over the union of the key sets, the
documented arithmetic (fixed order, float32), bitwise where the docstring promises it
(one non-empty partial, repeats), and empty partials (-inf) contributing nothing."""

import pytest
import torch

import harness
import splitkv
import splitkv_reference
from harness import DEVICES

_NEG_INF = float("-inf")


def _partials(keys, values, q, cuts):
    """float64 (out, lse) of q over keys cuts[s] .. cuts[s + 1] - 1 for each s (no mask)."""
    outs, lses = [], []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        out, lse = splitkv_reference.attention(q, keys[lo:hi], values[lo:hi], causal=False)
        outs.append(out)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cuts", [[0, 97], [0, 30, 31, 97], [0, 0, 50, 50, 97], [0, 97, 97]])
def test_matches_float64_attention_over_the_union(device, dtype, cuts):
    harness.require(device, backend=False)
    g = torch.Generator().manual_seed(len(cuts) * 7 + cuts[1])
    q = torch.randn(5, 4, 32, generator=g, dtype=torch.float64)
    k = torch.randn(97, 2, 32, generator=g, dtype=torch.float64)
    v = torch.randn(97, 2, 32, generator=g, dtype=torch.float64)
    outs, lses = _partials(k, v, q, cuts)
    out, lse = splitkv.merge_states(outs.to(dtype).to(device), lses.float().to(device))
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == (5, 4, 32) and lse.shape == (5, 4) and out.is_contiguous()
    ref_out, ref_lse = splitkv_reference.attention(q, k, v, causal=False)
    atol = {torch.float64: 1e-6, torch.float32: 1e-6, torch.bfloat16: 1.6e-2,
            torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out.cpu().double(), ref_out, atol=atol, rtol=atol)
    torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_follows_the_documented_arithmetic(device):
    harness.require(device, backend=False)
    g = torch.Generator().manual_seed(3)
    outs = torch.randn(3, 6, 2, 8, generator=g).to(device)
    lses = (torch.randn(3, 6, 2, generator=g) * 5).to(device)
    lses[1, 0] = _NEG_INF
    out, lse = splitkv.merge_states(outs, lses)
    # The docstring's formula, written out with Python floats per row (float64): close to
    # the float32 result, not bitwise (float32 vs float64 steps).
    for row in range(6):
        for head in range(2):
            ls = [float(lses[s, row, head]) for s in range(3)]
            m = max(x for x in ls if x != _NEG_INF)
            w = [0.0 if x == _NEG_INF else torch.tensor(x - m, dtype=torch.float64).exp().item()
                 for x in ls]
            total = w[0] + w[1] + w[2]
            want = sum((w[s] / total) * outs[s, row, head].double().cpu() for s in range(3))
            torch.testing.assert_close(out[row, head].double().cpu(), want, atol=1e-6, rtol=1e-6)
            assert abs(float(lse[row, head]) - (m + torch.tensor(total).log().item())) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_nonempty_partial_is_returned_bitwise(device, dtype):
    harness.require(device, backend=False)
    g = torch.Generator().manual_seed(4)
    outs = torch.randn(4, 7, 3, 16, generator=g).to(dtype).to(device)
    lses = torch.full((4, 7, 3), _NEG_INF, device=device)
    owner = torch.randint(0, 4, (7, 3), generator=g).to(device)
    values = (torch.randn(7, 3, generator=g) * 30).to(device)
    lses.scatter_(0, owner[None], values[None])
    # Empty partials' outs are ignored whatever they hold.
    garbage = torch.full_like(outs, float("nan"))
    picked = owner[None, :, :, None].expand(1, 7, 3, 16)
    garbage.scatter_(0, picked, outs.gather(0, picked))
    out, lse = splitkv.merge_states(garbage, lses)
    assert torch.equal(out, outs.gather(0, picked)[0])
    assert torch.equal(lse, values)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_with_no_key_anywhere_give_zero_and_minus_inf(device):
    harness.require(device, backend=False)
    outs = torch.randn(3, 4, 2, 8).to(device)
    lses = torch.randn(3, 4, 2).to(device)
    lses[:, 1] = _NEG_INF
    outs[:, 1] = float("nan")  # never read for an empty partial
    out, lse = splitkv.merge_states(outs, lses)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert bool((lse[1] == _NEG_INF).all())
    assert not bool(out.isnan().any()) and not bool(lse.isnan().any())


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_and_order_fixed(device):
    harness.require(device, backend=False)
    g = torch.Generator().manual_seed(5)
    outs = torch.randn(8, 33, 4, 64, generator=g).to(torch.bfloat16).to(device)
    lses = (torch.randn(8, 33, 4, generator=g) * 3).to(device)
    first = splitkv.merge_states(outs, lses)
    for _ in range(3):
        again = splitkv.merge_states(outs.clone(), lses.clone())
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("device", DEVICES)
def test_merges_splitkv_partials_of_one_request(device):
    # Two paged_attention calls over halves of the keys merge to the call over all of them.
    harness.require(device, dtype=torch.float16)
    problem = harness.make_paged([200, 64], page_size=16, group=2, head_dim=64,
                                 dtype=torch.float16, device=device, seed=9)
    workspace = harness.shared_workspace(device)
    shifts = [6, 3]  # pages of each request in the first call
    half = torch.tensor([16 * s for s in shifts], dtype=torch.int32, device=device)
    first = splitkv.paged_attention(problem.q, problem.kv_cache, problem.block_tables, half,
                                     workspace, causal=False, return_lse=True)
    tables = torch.stack([row.roll(-s) for row, s in zip(problem.block_tables, shifts)])
    rest = problem.seq_lens - half
    second = splitkv.paged_attention(problem.q, problem.kv_cache, tables.contiguous(), rest,
                                     workspace, causal=False, return_lse=True)
    out, lse = splitkv.merge_states(torch.stack([first[0], second[0]]),
                                    torch.stack([first[1], second[1]]))
    expected, expected_lse = problem.reference(causal=False)
    harness.assert_close(out, expected, torch.float16)
    harness.assert_lse_close(lse, expected_lse)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_in_lses_propagates(device):
    harness.require(device, backend=False)
    outs = torch.randn(2, 3, 2, 8).to(device)
    lses = torch.randn(2, 3, 2).to(device)
    lses[1, 2, 0] = float("nan")
    out, lse = splitkv.merge_states(outs, lses)
    assert bool(out[2, 0].isnan().all()) and bool(lse[2, 0].isnan())
    assert not bool(out[:2].isnan().any()) and not bool(lse[:2].isnan().any())


def _formula(outs, lses):
    """The docstring's arithmetic in float64 torch ops (lse rounded to float32): the core's
    float32 result is close."""
    return splitkv.merge._merge_torch(outs.double(), lses.double())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [5, 64, 72, 300])
def test_every_column_of_odd_and_wide_head_dims(device, dtype, head_dim):
    # head_dim 5 / odd strides: one element a load; 64, 72: 16-byte vectors; 300: a lane's
    # columns wrap past 32 vectors. Every element is compared, so one left unwritten fails.
    harness.require(device, backend=False)
    g = torch.Generator().manual_seed(head_dim)
    outs = torch.randn(3, 7, 3, head_dim, generator=g).to(dtype).to(device)
    lses = (torch.randn(3, 7, 3, generator=g) * 4).to(device)
    lses[0, 2] = _NEG_INF
    out, lse = splitkv.merge_states(outs, lses)
    assert not bool(out.isnan().any()) and not bool(lse.isnan().any())
    want_out, want_lse = _formula(outs, lses)
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(out.double(), want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), want_lse.double(), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_views_give_the_bits_of_contiguous_copies(device):
    harness.require(device, backend=False)
    g = torch.Generator().manual_seed(11)
    base = torch.randn(5, 4, 9, 64, generator=g).to(torch.bfloat16).to(device)
    outs = base.permute(1, 0, 2, 3)[:, :, 1:8]   # [4, 5, 7, 64]: no dim contiguous but head_dim
    lse_base = (torch.randn(7, 5, 4, generator=g) * 3).to(device)
    lses = lse_base.permute(2, 1, 0)              # [4, 5, 7], every stride unusual
    out, lse = splitkv.merge_states(outs, lses)
    want = splitkv.merge_states(outs.contiguous(), lses.contiguous())
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    # head_dim not contiguous: merged from a contiguous copy, same bits.
    wide = torch.randn(4, 5, 7, 128, generator=g).to(torch.bfloat16).to(device)[..., ::2]
    out, lse = splitkv.merge_states(wide, lses)
    want = splitkv.merge_states(wide.contiguous(), lses)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


@pytest.mark.gpu
def test_cuda_graph_replay_gives_the_eager_bits():
    harness.require("cuda")
    g = torch.Generator().manual_seed(13)
    outs = torch.randn(4, 16, 8, 128, generator=g).to(torch.bfloat16).cuda()
    lses = (torch.randn(4, 16, 8, generator=g) * 3).cuda()
    eager = splitkv.merge_states(outs, lses)
    graph, captured = harness.capture_graph(lambda: splitkv.merge_states(outs, lses))
    captured[0].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])


@pytest.mark.parametrize("device", DEVICES)
def test_float64_is_merged_in_float64(device):
    # The weights, their total and the lse from the float32 lses widened to float64: the
    # docstring's formula in float64 to float64's rounding (float32 weights were off by
    # ~1e-7 relative).
    harness.require(device, backend=False)
    g = torch.Generator().manual_seed(21)
    outs = torch.randn(3, 7, 2, 16, generator=g, dtype=torch.float64).to(device)
    lses = (torch.randn(3, 7, 2, generator=g) * 5).to(device)
    lses[2, 3] = _NEG_INF
    out, lse = splitkv.merge_states(outs, lses)
    wide = lses.double()
    m = wide.amax(0)
    weights = torch.exp(wide - m)
    total = weights.sum(0)
    expected = (weights.unsqueeze(-1) * outs).sum(0) / total.unsqueeze(-1)
    assert out.dtype == torch.float64 and lse.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=1e-14, rtol=1e-14)
    assert torch.equal(lse, (m + torch.log(total)).float())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_no_autograd_graph_for_any_dtype(dtype):
    outs = torch.randn(2, 3, 2, 8, dtype=dtype, requires_grad=True)
    out, lse = splitkv.merge_states(outs, torch.randn(2, 3, 2))
    assert not out.requires_grad and out.grad_fn is None and not lse.requires_grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape, message", [
    ((2, 4, 0, 8), "outs.shape[2] out of range: expected >= 1 (num_qo_heads), got 0"),
    ((2, 4, 2, 0), "outs.shape[3] out of range: expected >= 1 (head_dim), got 0"),
])
def test_zero_heads_or_head_dim_are_refused_for_every_dtype(dtype, shape, message):
    with pytest.raises(ValueError) as caught:
        splitkv.merge_states(torch.randn(shape, dtype=dtype), torch.randn(shape[:3]))
    assert str(caught.value) == "merge_states: " + message
