"""Tests of the continuous-batching scheduler: arrival-to-step mapping, admission, pages."""

import os
import sys

import pytest

from tools.replay.page_allocator import PageAllocator
from tools.replay.scheduler import Scheduler
from tools.replay.trace import TraceRequest, load_trace

AZURE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "data", "azure_llm_inference_2023", "conv.csv")


def _requests(*specs):
    return [TraceRequest(i, arrival, context, generated) for i, (arrival, context, generated) in enumerate(specs)]


def _scheduler(requests, num_pages=1000, page_size=4, max_batch_size=8, max_prefill_tokens=1000,
               step_seconds=0.02, max_generated_tokens=0):
    alloc = PageAllocator(num_pages, seed=0)
    return alloc, Scheduler(requests, alloc, page_size, max_batch_size, max_prefill_tokens,
                            step_seconds, max_generated_tokens)


def _run(scheduler):
    """[(step, clock, [prefilled request ids], [(decoded id, kv position)])] for every step."""
    log = []
    while not scheduler.done():
        plan = scheduler.next_step()
        log.append((plan.step, round(plan.clock_s, 6), [s.request.index for s in plan.prefill],
                    [(s.request.index, s.kv_len) for s in plan.decode]))
        scheduler.complete_step(plan)
    return log


def test_arrivals_map_to_steps_and_decodes_follow_prefill():
    # Request 1 arrives at 0.05 s: steps run at 0, 0.02, 0.04, 0.06 -> admitted at step 3.
    _, sched = _scheduler(_requests((0.0, 5, 3), (0.05, 2, 2)))
    assert _run(sched) == [
        (0, 0.0, [0], []),
        (1, 0.02, [], [(0, 5)]),
        (2, 0.04, [], [(0, 6)]),  # 3 generated tokens: the prefill's and 2 decodes
        (3, 0.06, [1], []),
        (4, 0.08, [], [(1, 2)]),
    ]
    assert sched.finished == 2


def test_idle_clock_jumps_to_next_arrival():
    _, sched = _scheduler(_requests((0.0, 4, 2), (100.0, 4, 1)))
    assert _run(sched) == [(0, 0.0, [0], []), (1, 0.02, [], [(0, 4)]), (2, 100.0, [1], [])]
    assert sched.clock_s == pytest.approx(100.02)


def test_max_batch_size_and_prefill_budget():
    reqs = _requests((0.0, 30, 3), (0.0, 30, 3), (0.0, 30, 3), (0.0, 5, 3))
    _, sched = _scheduler(reqs, max_batch_size=2, max_prefill_tokens=40)
    # Budget 40 takes one 30-token prompt per step; the batch holds two requests at most, and a
    # request that does not fit blocks the (small) one behind it.
    assert [entry[2] for entry in _run(sched)] == [[0], [1], [], [2], [3], [], []]
    assert sched.peak_batch_size == 2
    assert sched.peak_waiting == 4
    # Prompts within the budget share a step.
    _, sched = _scheduler(_requests((0.0, 30, 1), (0.0, 5, 1), (0.0, 30, 1)), max_prefill_tokens=40)
    assert [entry[2] for entry in _run(sched)] == [[0, 1], [2]]
    # A prompt above the budget is still admitted when it comes first.
    _, sched = _scheduler(_requests((0.0, 50, 1), (0.0, 1, 1)), max_prefill_tokens=10)
    assert [entry[2] for entry in _run(sched)] == [[0], [1]]


def test_pages_reserved_drawn_on_boundaries_and_freed():
    alloc, sched = _scheduler(_requests((0.0, 7, 4)), page_size=4)
    plan = sched.next_step()  # prompt 7 tokens -> 2 pages now; 7 + 3 decodes = 10 tokens -> 3 reserved
    assert [(slot, idx) for slot, idx, _ in plan.new_pages] == [(0, 0), (0, 1)]
    assert alloc.available == alloc.num_pages - 3
    sched.complete_step(plan)
    plan = sched.next_step()  # token at position 7 fits page 1
    assert plan.new_pages == []
    sched.complete_step(plan)
    plan = sched.next_step()  # position 8 needs page 2
    seq = plan.decode[0]
    assert [(slot, idx) for slot, idx, _ in plan.new_pages] == [(0, 2)] and len(seq.pages) == 3
    sched.complete_step(plan)
    plan = sched.next_step()
    assert plan.new_pages == [] and plan.decode[0].kv_len == 9
    finished = sched.complete_step(plan)
    assert [s.request.index for s in finished] == [0] and finished[0].kv_len == 10
    assert sched.done() and alloc.pages_in_use == 0 and alloc.available == alloc.num_pages


def test_pool_limits_admission():
    # Each request needs ceil((8 + 1) / 4) = 3 pages; a pool of 5 runs one at a time.
    alloc, sched = _scheduler(_requests((0.0, 8, 2), (0.0, 8, 2)), num_pages=5, page_size=4)
    assert [entry[2] for entry in _run(sched)] == [[0], [], [1], []]
    assert alloc.peak_pages_in_use == 3
    with pytest.raises(ValueError, match=r"num_pages too small for request 0: expected >= 3 pages "
                                         r"\(8 prompt \+ 1 decode tokens, page_size 4\), got 2"):
        _scheduler(_requests((0.0, 8, 2)), num_pages=2, page_size=4)


def test_generated_token_cap():
    _, sched = _scheduler(_requests((0.0, 4, 50)), max_generated_tokens=3)
    log = _run(sched)
    assert len(log) == 3 and [d for entry in log for d in entry[3]] == [(0, 4), (0, 5)]


def test_slots_reused_and_distinct():
    reqs = _requests((0.0, 4, 3), (0.0, 4, 1), (0.01, 4, 2))
    _, sched = _scheduler(reqs)
    plan = sched.next_step()
    assert [s.slot for s in plan.prefill] == [0, 1]
    sched.complete_step(plan)  # request 1 (1 generated token) finishes, slot 1 frees
    plan = sched.next_step()
    assert [s.slot for s in plan.prefill] == [1] and [s.slot for s in plan.decode] == [0]


def test_first_200_azure_requests():
    requests = load_trace(AZURE, max_requests=200)
    alloc, sched = _scheduler(requests, num_pages=8192, page_size=16, max_batch_size=128,
                              max_prefill_tokens=16384)
    prefill_tokens = decode_tokens = steps = 0
    while not sched.done():
        plan = sched.next_step()
        prefill_tokens += sum(s.request.context_tokens for s in plan.prefill)
        decode_tokens += len(plan.decode)
        pages = [p for s in sched.running for p in s.pages]
        assert len(pages) == len(set(pages))  # no page held twice
        sched.complete_step(plan)
        steps += 1
    assert sched.finished == 200
    assert prefill_tokens == sum(r.context_tokens for r in requests) == 180695
    assert decode_tokens == sum(r.generated_tokens - 1 for r in requests) == 46850
    assert steps == sched.step == 3302
    assert alloc.pages_in_use == 0 and alloc.available == 8192


def test_bad_options():
    with pytest.raises(ValueError, match="Scheduler: max_batch_size invalid: expected >= 1, got 0"):
        _scheduler(_requests((0.0, 4, 1)), max_batch_size=0)
    with pytest.raises(ValueError, match="Scheduler: step_seconds invalid: expected > 0, got 0"):
        _scheduler(_requests((0.0, 4, 1)), step_seconds=0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
