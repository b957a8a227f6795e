"""Time spent inside the attention calls, by call kind.

On the CPU the calls are synchronous, so a wall clock around each is exact. On a GPU
each call is bracketed by CUDA events and the elapsed times are read in batches, so
timing adds no sync per step.
"""

import collections
import time

import torch


class AttentionTimer:
    def __init__(self, device, sync_every=512):
        self._cuda = device.type == "cuda"
        self._sync_every = sync_every
        self._pending = []  # (kind, start event, end event)
        self._totals = collections.defaultdict(float)
        self._start = None

    def start(self) -> None:
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self, kind) -> None:
        if self._cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((kind, self._start, end))
            if len(self._pending) >= self._sync_every:
                self.flush()
        else:
            self._totals[kind] += time.perf_counter() - self._start

    def flush(self) -> None:
        if not self._pending:
            return
        self._pending[-1][2].synchronize()
        for kind, start, end in self._pending:
            self._totals[kind] += start.elapsed_time(end) / 1e3
        self._pending = []

    def seconds(self, kind) -> float:
        self.flush()
        return self._totals[kind]
