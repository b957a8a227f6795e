"""splitkv_reference (the float64 reference of every test and tool) against a plain loop over
query rows and heads, on both its paths (one request, chunked rows; padded batches), and its
contract on masked and non-finite K/V."""

import math

import pytest
import torch

import harness
import splitkv_reference
from harness import DEVICES

NAN, INF = float("nan"), float("inf")


def _naive(q, k, v, *, causal=True, sm_scale=None, window_left=-1, logits_soft_cap=0.0,
           positions=None):
    """DESIGN.md's semantics spelled out one (row, head) at a time."""
    q, k, v = (x.cpu().to(torch.float64) for x in (q, k, v))
    q_len, num_qo_heads, head_dim = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_qo_heads // num_kv_heads
    scale = head_dim ** -0.5 if sm_scale is None else sm_scale
    if positions is None:
        positions = range(kv_len - q_len, kv_len)
    out = torch.zeros(q_len, num_qo_heads, head_dim, dtype=torch.float64)
    lse = torch.full((q_len, num_qo_heads), -INF, dtype=torch.float64)
    for i, position in enumerate(positions):
        seen = [j for j in range(kv_len) if (not causal or j <= position)
                and (window_left < 0 or j >= position - window_left)]
        if not seen:
            continue
        for h in range(num_qo_heads):
            logits = k[seen, h // group] @ q[i, h] * scale
            if logits_soft_cap > 0:
                logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
            lse[i, h] = torch.logsumexp(logits, 0)
            out[i, h] = torch.softmax(logits, 0) @ v[seen, h // group]
    return out, lse


def _randn(generator, *shape, device="cpu", dtype=torch.float32):
    return torch.randn(shape, generator=generator).to(dtype).to(device)


def _assert_same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g.cpu(), w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_len, kv_len", [(1, 1), (1, 97), (13, 13), (9, 40), (40, 9), (0, 5),
                                           (3, 0)])
@pytest.mark.parametrize("options", [
    {}, {"causal": False}, {"window_left": 0}, {"window_left": 5, "logits_soft_cap": 3.0},
    {"causal": False, "window_left": 2, "sm_scale": 0.3}], ids=harness.case_id)
def test_attention_matches_naive(device, q_len, kv_len, options, monkeypatch):
    harness.require(device, backend=False)
    generator = torch.Generator().manual_seed(q_len * 100 + kv_len)
    q = _randn(generator, q_len, 8, 16, device=device, dtype=torch.bfloat16)
    k = _randn(generator, kv_len, 2, 16, device=device, dtype=torch.bfloat16)
    v = _randn(generator, kv_len, 2, 16, device=device, dtype=torch.bfloat16)
    want = _naive(q, k, v, **options)
    out, lse = splitkv_reference.attention(q, k, v, **options)
    assert out.device == q.device and out.shape == (q_len, 8, 16) and lse.shape == (q_len, 8)
    _assert_same((out, lse), want)
    # Two rows per chunk: the chunked path gives the same numbers.
    monkeypatch.setattr(splitkv_reference, "_MAX_SCORE_ELEMENTS", 8 * max(1, kv_len) * 2)
    _assert_same(splitkv_reference.attention(q, k, v, **options), want)


def test_empty_rows_get_zero_and_minus_infinity():
    # q_len 3 > kv_len 1 under causal: rows 0 and 1 see no key; row 2 copies v.
    q = torch.randn(3, 2, 4, dtype=torch.float64)
    k = torch.randn(1, 1, 4, dtype=torch.float64)
    v = torch.randn(1, 1, 4, dtype=torch.float64)
    out, lse = splitkv_reference.attention(q, k, v, sm_scale=0.5)
    assert torch.equal(out[:2], torch.zeros(2, 2, 4)) and bool(torch.isneginf(lse[:2]).all())
    torch.testing.assert_close(out[2], v[0].expand(2, 4))
    torch.testing.assert_close(lse[2], 0.5 * (q[2] @ k[0, 0]), rtol=1e-12, atol=1e-12)
    assert not math.isnan(float(out.sum()))


def test_positions_give_the_rows_of_the_whole_request():
    generator = torch.Generator().manual_seed(3)
    q, k, v = (_randn(generator, 50, n, 16) for n in (8, 2, 2))
    full = splitkv_reference.attention(q, k, v, window_left=20)
    picked = [0, 3, 17, 49]
    rows = splitkv_reference.attention(q[picked], k, v, window_left=20, positions=picked)
    _assert_same(rows, (full[0][picked], full[1][picked]))


def test_ragged_is_attention_per_request():
    generator = torch.Generator().manual_seed(4)
    q_lens, kv_lens = [3, 0, 5, 2], [0, 4, 50, 2]
    q = _randn(generator, sum(q_lens), 4, 8)
    k, v = (_randn(generator, sum(kv_lens), 2, 8) for _ in range(2))
    out, lse = splitkv_reference.ragged_attention(
        q, k, v, harness.cu_seqlens(q_lens, "cpu"), harness.cu_seqlens(kv_lens, "cpu"),
        logits_soft_cap=2.0)
    q_begin = kv_begin = 0
    for q_len, kv_len in zip(q_lens, kv_lens):
        want = _naive(q[q_begin:q_begin + q_len], k[kv_begin:kv_begin + kv_len],
                      v[kv_begin:kv_begin + kv_len], logits_soft_cap=2.0)
        _assert_same((out[q_begin:q_begin + q_len], lse[q_begin:q_begin + q_len]), want)
        q_begin, kv_begin = q_begin + q_len, kv_begin + kv_len
    empty = harness.cu_seqlens([], "cpu")
    out, lse = splitkv_reference.ragged_attention(q[:0], k[:0], v[:0], empty, empty)
    assert out.shape == (0, 4, 8) and lse.shape == (0, 4) and out.dtype == torch.float64


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [{}, {"causal": False}, {"window_left": 2,
                                                             "logits_soft_cap": 2.0}],
                         ids=harness.case_id)
def test_padded_ignores_padding(device, options, monkeypatch):
    harness.require(device, backend=False)
    generator = torch.Generator().manual_seed(7)
    q_lens, kv_lens = [3, 1, 7, 0, 2], [10, 1, 7, 4, 0]
    q = _randn(generator, 5, 7, 6, 16, device=device)
    k, v = (_randn(generator, 5, 10, 3, 16, device=device) for _ in range(2))
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens)):
        q[b, q_len:] = NAN
        k[b, kv_len:] = NAN
        v[b, kv_len:] = INF
    monkeypatch.setattr(splitkv_reference, "_MAX_SCORE_ELEMENTS", 7 * 6 * 10 * 2)  # 2 requests
    out, lse = splitkv_reference.padded_attention(q, k, v, torch.tensor(q_lens),
                                                  torch.tensor(kv_lens), **options)
    assert out.device == q.device and out.shape == q.shape and lse.shape == (5, 7, 6)
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens)):
        want = _naive(q[b, :q_len], k[b, :kv_len], v[b, :kv_len], **options)
        _assert_same((out[b, :q_len], lse[b, :q_len]), want)
        assert bool((out[b, q_len:] == 0).all()) and bool(torch.isneginf(lse[b, q_len:]).all())


@pytest.mark.parametrize("device", DEVICES)
def test_decode_ignores_padding(device):
    harness.require(device, backend=False)
    generator = torch.Generator().manual_seed(8)
    kv_lens = [1, 5, 40, 0]
    q = _randn(generator, 4, 6, 16, device=device, dtype=torch.bfloat16)
    k, v = (_randn(generator, 4, 40, 3, 16, device=device, dtype=torch.bfloat16)
            for _ in range(2))
    for b, n in enumerate(kv_lens):
        k[b, n:] = NAN
        v[b, n:] = NAN
    out, lse = splitkv_reference.decode_attention(q, k, v, torch.tensor(kv_lens), sm_scale=0.3)
    assert out.shape == (4, 6, 16) and lse.shape == (4, 6)
    for b, n in enumerate(kv_lens):
        want = _naive(q[b:b + 1], k[b, :n], v[b, :n], sm_scale=0.3)
        _assert_same((out[b:b + 1], lse[b:b + 1]), want)


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["k", "v"])
def test_masked_keys_never_reach_a_result(where, value):
    # Row i sits at position i + 10: key 30 lies past the causal limit of rows 0..19 and
    # before the window (8) of rows 29..39. A non-finite K or V there changes only the rows
    # that see it.
    generator = torch.Generator().manual_seed(9)
    q, k, v = _randn(generator, 40, 4, 8), _randn(generator, 50, 2, 8), _randn(generator, 50, 2, 8)
    clean = splitkv_reference.attention(q, k, v, window_left=8)
    {"k": k, "v": v}[where][30, 1, 3] = value
    out, lse = splitkv_reference.attention(q, k, v, window_left=8)
    sees = torch.zeros(40, dtype=torch.bool)
    sees[20:29] = True  # rows at positions 30..38
    _assert_same((out[~sees], lse[~sees]), (clean[0][~sees], clean[1][~sees]))
    if where == "k" and value != value:  # a NaN logit: LSE NaN, weights 0
        assert bool(lse[sees][:, 2:].isnan().all()) and bool(torch.isfinite(lse[sees][:, :2]).all())
    elif where == "v":  # non-finite in exactly element 3 of kv head 1's qo heads
        bad = ~torch.isfinite(out[sees])
        assert bool(bad[:, 2:, 3].all()) and int(bad.sum()) == int(sees.sum()) * 2
        assert torch.equal(lse, clean[1])


def test_inputs_stay_untouched():
    v = torch.randn(5, 1, 4, dtype=torch.float64)
    v[2, 0, 1] = NAN
    before = v.clone()
    splitkv_reference.attention(torch.randn(2, 1, 4, dtype=torch.float64),
                                torch.randn(5, 1, 4, dtype=torch.float64), v)
    sentinel = 12345.0
    assert torch.equal(v.nan_to_num(nan=sentinel), before.nan_to_num(nan=sentinel))


def test_head_counts_must_divide():
    with pytest.raises(ValueError, match=r"attention: num_qo_heads must be a multiple of "
                       r"num_kv_heads: expected num_qo_heads % num_kv_heads == 0, got 6 and 4"):
        splitkv_reference.attention(torch.randn(1, 6, 8), torch.randn(2, 4, 8),
                                    torch.randn(2, 4, 8))
