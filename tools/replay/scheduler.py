"""Continuous batching over a trace: which requests prefill and which decode at each step.

Time is simulated. The clock starts at the first request's arrival and each step advances
it by `step_seconds`; a request joins the waiting queue at the first step whose clock has
reached its arrival time. When nothing is running or waiting, the clock jumps to the next
arrival instead of running empty steps.

A step has up to two attention calls: one ragged prefill over the requests admitted at that
step (their whole prompt, causal), and one paged decode of one token for every request
already running. The prefill yields a request's first generated token, so a request with
G generated tokens runs G - 1 decode steps after its prefill step, its KV growing from
its prompt length to prompt + G - 1 tokens; then it finishes and its pages go back to the
pool.

Admission is first come, first served from the waiting queue, while the batch holds fewer
than `max_batch_size` requests, the step's prefill tokens stay within `max_prefill_tokens`
(the first request of a step is admitted whatever its length; there is no chunked
prefill), and the pool can reserve every page the request will ever need. A request that
does not fit blocks the ones behind it.
"""

import collections
import dataclasses

from tools.replay.page_allocator import PageAllocator


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


@dataclasses.dataclass
class Sequence:
    """A request while it is in the batch.

    slot : its row in the host block table, fixed while it runs.
    num_decodes : decode steps it runs after its prefill (generated tokens - 1, after the cap).
    kv_len : tokens in the KV cache, after the last completed step.
    pages : its pages, in logical order (its row of block_tables).
    """

    request: object
    slot: int
    num_decodes: int
    admitted_step: int
    kv_len: int = 0
    decodes_done: int = 0
    pages: list = dataclasses.field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return self.request.context_tokens + self.num_decodes


@dataclasses.dataclass
class StepPlan:
    """What one step runs.

    prefill : sequences whose prompt is prefilled now (kv_len 0 before the step).
    decode : sequences that decode one token now; its KV position is seq.kv_len.
    new_pages : (slot, logical page index, page) drawn for this step, for the block table.
    """

    step: int
    clock_s: float
    prefill: list
    decode: list
    new_pages: list


class Scheduler:
    """Continuous batching of `requests` (TraceRequest, in arrival order).

    Parameters
    ----------
    requests : list of TraceRequest
    allocator : PageAllocator
    page_size : int
        Tokens per page.
    max_batch_size : int
        Most requests in the batch (prefilling plus decoding) at one step.
    max_prefill_tokens : int
        Most prompt tokens prefilled in one step, except that one request is always admitted.
    step_seconds : float
        Simulated time one step takes.
    max_generated_tokens : int, default 0
        Cap on the generated tokens replayed per request; 0 replays the trace's counts.

    Raises
    ------
    ValueError
        A bad option, or a request that needs more pages than the pool has.
    """

    def __init__(self, requests, allocator: PageAllocator, page_size: int, max_batch_size: int,
                 max_prefill_tokens: int, step_seconds: float, max_generated_tokens: int = 0):
        for name, value, low in (("page_size", page_size, 1), ("max_batch_size", max_batch_size, 1),
                                 ("max_prefill_tokens", max_prefill_tokens, 1),
                                 ("max_generated_tokens", max_generated_tokens, 0)):
            if value < low:
                raise ValueError(f"Scheduler: {name} invalid: expected >= {low}, got {value}")
        if not step_seconds > 0:
            raise ValueError(f"Scheduler: step_seconds invalid: expected > 0, got {step_seconds}")
        self.allocator = allocator
        self.page_size = page_size
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.step_seconds = step_seconds
        self.max_generated_tokens = max_generated_tokens
        self._arrivals = collections.deque(requests)
        self._waiting = collections.deque()
        self._running = []  # in admission order
        # Block-table rows: more than the requests are never used (and a huge max_batch_size
        # must not make a huge list).
        self.num_slots = max(1, min(max_batch_size, len(requests)))
        self._free_slots = list(range(self.num_slots - 1, -1, -1))  # pop() gives the lowest
        self.step = 0
        self.clock_s = requests[0].arrival_s if requests else 0.0
        self.max_pages_per_seq = 0
        for request in requests:
            need = pages_for(request.context_tokens + self.num_decodes(request), page_size)
            if need > allocator.num_pages:
                raise ValueError(
                    f"Scheduler: num_pages too small for request {request.index}: expected >= {need} "
                    f"pages ({request.context_tokens} prompt + {self.num_decodes(request)} decode tokens, "
                    f"page_size {page_size}), got {allocator.num_pages}; raise --num_pages"
                )
            self.max_pages_per_seq = max(self.max_pages_per_seq, need)
        # Statistics for the summary.
        self.peak_batch_size = 0
        self.peak_waiting = 0
        self.finished = 0
        self.total_queue_s = 0.0

    def num_decodes(self, request) -> int:
        generated = request.generated_tokens
        if self.max_generated_tokens:
            generated = min(generated, self.max_generated_tokens)
        return generated - 1

    def done(self) -> bool:
        return not (self._arrivals or self._waiting or self._running)

    @property
    def running(self) -> list:
        return list(self._running)

    def next_step(self) -> StepPlan:
        """Admits arrivals and plans the step; complete_step() must follow."""
        if self.done():
            raise ValueError("Scheduler.next_step: no step left: expected done() to be False")
        if not self._waiting and not self._running and self._arrivals[0].arrival_s > self.clock_s:
            self.clock_s = self._arrivals[0].arrival_s  # idle: skip to the next arrival
        while self._arrivals and self._arrivals[0].arrival_s <= self.clock_s:
            self._waiting.append(self._arrivals.popleft())
        self.peak_waiting = max(self.peak_waiting, len(self._waiting))

        new_pages = []
        decode = [seq for seq in self._running if seq.decodes_done < seq.num_decodes]
        for seq in decode:  # the new token's slot; a page boundary needs a fresh page
            if seq.kv_len == len(seq.pages) * self.page_size:
                self._draw_page(seq, new_pages)

        prefill = []
        prefill_tokens = 0
        while self._waiting and len(self._running) < self.max_batch_size:
            request = self._waiting[0]
            if prefill and prefill_tokens + request.context_tokens > self.max_prefill_tokens:
                break
            num_decodes = self.num_decodes(request)
            need = pages_for(request.context_tokens + num_decodes, self.page_size)
            if not self.allocator.can_reserve(need):
                break
            self._waiting.popleft()
            seq = Sequence(request=request, slot=self._free_slots.pop(), num_decodes=num_decodes,
                           admitted_step=self.step)
            self.allocator.reserve(request.index, need)
            for _ in range(pages_for(request.context_tokens, self.page_size)):
                self._draw_page(seq, new_pages)
            self._running.append(seq)
            prefill.append(seq)
            prefill_tokens += request.context_tokens
            self.total_queue_s += self.clock_s - request.arrival_s
        self.peak_batch_size = max(self.peak_batch_size, len(self._running))
        return StepPlan(step=self.step, clock_s=self.clock_s, prefill=prefill, decode=decode,
                        new_pages=new_pages)

    def complete_step(self, plan: StepPlan) -> list:
        """Records the step's tokens, frees finished requests; returns them."""
        for seq in plan.prefill:
            seq.kv_len = seq.request.context_tokens
        for seq in plan.decode:
            seq.kv_len += 1
            seq.decodes_done += 1
        finished = [seq for seq in self._running if seq.decodes_done == seq.num_decodes]
        if finished:
            self._running = [seq for seq in self._running if seq.decodes_done < seq.num_decodes]
            for seq in finished:
                self.allocator.release(seq.request.index)
                self._free_slots.append(seq.slot)
            self._free_slots.sort(reverse=True)
            self.finished += len(finished)
        self.step += 1
        self.clock_s += self.step_seconds
        return finished

    def _draw_page(self, seq: Sequence, new_pages: list) -> None:
        page = self.allocator.allocate(seq.request.index)
        new_pages.append((seq.slot, len(seq.pages), page))
        seq.pages.append(page)
