"""Tests of the paged cache: writes land where the block table says; gathers read them back.

The float64 reference it feeds is tested in tests/python/reference_test.py."""

import sys

import pytest
import torch

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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
