"""Tests of the paged cache (writes land where the block table says) and the float64 reference."""

import math
import sys

import pytest
import torch

from tools.replay import reference
from tools.replay.page_allocator import PageAllocator
from tools.replay.paged_cache import PagedKvCache
from tools.replay.scheduler import Scheduler
from tools.replay.trace import TraceRequest


@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
def test_tokens_round_trip_through_pages(kv_layout):
    page_size, heads, d = 4, 2, 8
    requests = [TraceRequest(0, 0.0, 7, 4), TraceRequest(1, 0.0, 5, 2)]
    alloc = PageAllocator(16, seed=5)
    sched = Scheduler(requests, alloc, page_size, 4, 100, 0.02)
    cache = PagedKvCache(16, heads, page_size, d, torch.float32, torch.device("cpu"), kv_layout, 4,
                         sched.max_pages_per_seq)
    gen = torch.Generator().manual_seed(0)
    written = {0: ([], []), 1: ([], [])}
    padded_checked = False

    plan = sched.next_step()
    cache.add_pages(plan.new_pages)
    k = torch.randn(12, heads, d, generator=gen)
    v = torch.randn(12, heads, d, generator=gen)
    cache.write(*cache.prompt_slots(plan.prefill), k, v)
    written[0][0].append(k[:7]); written[0][1].append(v[:7])
    written[1][0].append(k[7:]); written[1][1].append(v[7:])
    sched.complete_step(plan)
    for _ in range(3):
        plan = sched.next_step()
        cache.add_pages(plan.new_pages)
        n = len(plan.decode)
        k = torch.randn(n, heads, d, generator=gen)
        v = torch.randn(n, heads, d, generator=gen)
        cache.write(*cache.next_token_slots(plan.decode), k, v)
        for i, seq in enumerate(plan.decode):
            written[seq.request.index][0].append(k[i:i + 1])
            written[seq.request.index][1].append(v[i:i + 1])
        seq0 = next(s for s in plan.decode if s.request.index == 0)
        if len(plan.decode) == 2:  # both decode once; then request 1 finishes and its pages are reused
            pad_k, pad_v = cache.gather_padded(plan.decode, [8, 6])
            assert pad_k.shape == (2, 8, heads, d)
            for b in range(2):
                n = (8, 6)[b]
                assert torch.equal(pad_k[b, :n], torch.cat(written[b][0]))
                assert torch.equal(pad_v[b, :n], torch.cat(written[b][1]))
            assert torch.isnan(pad_k[1, 6:]).all()
            padded_checked = True
        sched.complete_step(plan)

    assert padded_checked
    # Request 0: 7 prompt + 3 decode tokens in 3 scattered pages.
    assert len(seq0.pages) == 3 and seq0.pages != list(range(seq0.pages[0], seq0.pages[0] + 3))
    assert cache.block_table[seq0.slot, :3].tolist() == seq0.pages
    got_k, got_v = cache.gather(seq0.pages, 10)
    assert torch.equal(got_k, torch.cat(written[0][0])) and torch.equal(got_v, torch.cat(written[0][1]))
    assert cache.block_tables([seq0]).tolist() == [seq0.pages]
    # Slots never written still hold the NaN the pool starts with.
    tail_k, _ = cache.gather(seq0.pages, 12)
    assert torch.isnan(tail_k[10:]).all() and not torch.isnan(tail_k[:10]).any()


def _naive(q, k, v, sm_scale):
    """Loops over rows and heads: softmax of masked logits, in float64."""
    q_len, qo_heads, d = q.shape
    kv_len, kv_heads, _ = k.shape
    out = torch.zeros(q_len, qo_heads, d, dtype=torch.float64)
    lse = torch.zeros(q_len, qo_heads, dtype=torch.float64)
    for i in range(q_len):
        visible = kv_len - q_len + i + 1
        for h in range(qo_heads):
            kh = k[:visible, h // (qo_heads // kv_heads)].double()
            vh = v[:visible, h // (qo_heads // kv_heads)].double()
            logits = kh @ q[i, h].double() * sm_scale
            lse[i, h] = torch.logsumexp(logits, 0)
            out[i, h] = torch.softmax(logits, 0) @ vh
    return out, lse


@pytest.mark.parametrize("q_len, kv_len", [(1, 1), (1, 97), (13, 13), (9, 40)])
def test_reference_matches_naive(q_len, kv_len, monkeypatch):
    gen = torch.Generator().manual_seed(q_len * 100 + kv_len)
    q = torch.randn(q_len, 8, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(kv_len, 2, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(kv_len, 2, 16, generator=gen, dtype=torch.float64)
    want_out, want_lse = _naive(q, k, v, 0.25)
    monkeypatch.setattr(reference, "_MAX_SCORE_ELEMENTS", 8 * kv_len * 2)  # two rows per chunk
    out, lse = reference.attention_reference(q, k, v, 0.25)
    assert out.dtype == torch.float64 and out.shape == (q_len, 8, 16) and lse.shape == (q_len, 8)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_decode_reference_ignores_padding():
    gen = torch.Generator().manual_seed(7)
    kv_lens = [1, 5, 40]
    q = torch.randn(3, 6, 16, generator=gen).to(torch.bfloat16)
    k = torch.randn(3, 40, 3, 16, generator=gen).to(torch.bfloat16)
    v = torch.randn(3, 40, 3, 16, generator=gen).to(torch.bfloat16)
    for b, n in enumerate(kv_lens):
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    out, lse = reference.decode_reference(q, k, v, torch.tensor(kv_lens), 0.3)
    for b, n in enumerate(kv_lens):
        want_out, want_lse = _naive(q[b:b + 1], k[b, :n], v[b, :n], 0.3)
        torch.testing.assert_close(out[b:b + 1], want_out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[b:b + 1], want_lse, rtol=1e-12, atol=1e-12)


def test_reference_single_key_and_empty_rows():
    q = torch.randn(3, 2, 4, dtype=torch.float64)
    k = torch.randn(1, 1, 4, dtype=torch.float64)
    v = torch.randn(1, 1, 4, dtype=torch.float64)
    out, lse = reference.attention_reference(q, k, v, 0.5)
    # With q_len 3 > kv_len 1, rows 0 and 1 see no key: out 0, lse -inf; row 2 copies v.
    assert torch.equal(out[:2], torch.zeros(2, 2, 4)) and torch.isinf(lse[:2]).all() and (lse[:2] < 0).all()
    torch.testing.assert_close(out[2], v[0].expand(2, 4))
    torch.testing.assert_close(lse[2], 0.5 * (q[2] @ k[0, 0]), rtol=1e-12, atol=1e-12)
    assert not math.isnan(float(out.sum()))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
