"""Correctness beside the speed: the float64 reference (splitkv_reference) on sampled
output rows.

A full float64 reference of a large case costs more than the bench (a 16k causal prefill
is 16k x 16k scores per head), so a few requests and a few query rows of each are checked;
the same rows of every implementation's output are compared to the reference and to SDPA's.
"""

import dataclasses
import random

import torch

import splitkv_reference

# atol, rtol on |out - ref| per dtype (as tools/replay/checks.py).
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.5e-2, 1.5e-2),
}
MAX_REQUESTS = 8
MAX_ROWS_PER_REQUEST = 32


def _pick(count, limit, rng):
    """Up to `limit` of range(count), always the first and the last."""
    if count <= limit:
        return list(range(count))
    middle = rng.sample(range(1, count - 1), limit - 2)
    return sorted([0, count - 1] + middle)


@dataclasses.dataclass
class Sample:
    rows: torch.Tensor  # indices into an output's first dim (total_q), int64
    ref: torch.Tensor  # [len(rows), num_qo_heads, head_dim] float64
    dtype: torch.dtype

    def take(self, out):
        return out.index_select(0, self.rows).double()

    def max_abs_diff(self, a, b):
        """max |a - b| over the sampled rows (a, b already taken); NaN counts as infinite."""
        return float((a - b).abs().nan_to_num(nan=float("inf")).max())

    def check(self, out):
        """(max abs error vs the reference, whether every element is within tolerance)."""
        got = self.take(out)
        atol, rtol = TOLERANCES[self.dtype]
        diff = (got - self.ref).abs().nan_to_num(nan=float("inf"))
        return float(diff.max()), bool((diff <= atol + rtol * self.ref.abs()).all())


def decode_sample(copy, seed=0, sinks=None):
    """Rows of a decode output [batch, num_qo_heads, d] (one query per request, sees all keys;
    sinks: [num_qo_heads] attention sinks, or None)."""
    rng = random.Random(seed)
    batch = copy.q.shape[0]
    requests = _pick(batch, MAX_REQUESTS, rng)
    refs = [splitkv_reference.attention(copy.q[b:b + 1], copy.k[b].transpose(0, 1),
                                        copy.v[b].transpose(0, 1), causal=False, sinks=sinks)[0]
            for b in requests]
    rows = torch.tensor(requests, dtype=torch.int64, device=copy.q.device)
    return Sample(rows, torch.cat(refs), copy.q.dtype)


def prefill_sample(copy, lengths, causal, seed=0):
    """Rows of a ragged prefill output [total, num_qo_heads, d] (q_len == kv_len)."""
    rng = random.Random(seed)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    requests = [b for b in _pick(len(lengths), 4, rng) if lengths[b] > 0]
    rows, refs = [], []
    for b in requests:
        begin, end = starts[b], starts[b + 1]
        picked = _pick(end - begin, MAX_ROWS_PER_REQUEST, rng)
        q = copy.q[begin:end][picked]
        refs.append(splitkv_reference.attention(q, copy.k[begin:end], copy.v[begin:end],
                                                causal=causal, positions=picked)[0])
        rows += [begin + i for i in picked]
    rows = torch.tensor(rows, dtype=torch.int64, device=copy.q.device)
    return Sample(rows, torch.cat(refs), copy.q.dtype)
