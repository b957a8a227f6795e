"""Correctness beside the speed: a float64 reference on sampled output rows.

A full float64 reference of a large case costs more than the bench (a 16k causal prefill
would materialize a 16k x 16k score matrix per head), so a few requests and a few query
rows of each are checked; the same rows of every implementation's output are compared to
the reference and to SDPA's.
"""

import dataclasses
import math
import random

import torch

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


def attention_rows(q, k, v, positions, causal):
    """float64 attention of query rows q [n, num_qo_heads, d] over k, v [kv_len, num_kv_heads, d];
    row i sits at KV position positions[i] (it sees keys j <= positions[i] when causal)."""
    n, num_qo_heads, head_dim = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_qo_heads // num_kv_heads
    qd = q.double().view(n, num_kv_heads, group, head_dim)
    scores = torch.einsum("nhgd,lhd->nhgl", qd, k.double()) / math.sqrt(head_dim)
    if causal:
        pos = torch.tensor(positions, device=q.device).view(n, 1, 1, 1)
        keys = torch.arange(kv_len, device=q.device).view(1, 1, 1, kv_len)
        scores = scores.masked_fill(keys > pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("nhgl,lhd->nhgd", probs, v.double()).reshape(n, num_qo_heads, head_dim)


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


def decode_sample(copy, seed=0):
    """Rows of a decode output [batch, num_qo_heads, d] (one query per request, sees all keys)."""
    rng = random.Random(seed)
    batch = copy.q.shape[0]
    requests = _pick(batch, MAX_REQUESTS, rng)
    refs = [attention_rows(copy.q[b:b + 1], copy.k[b].transpose(0, 1), copy.v[b].transpose(0, 1),
                           [copy.k.shape[2] - 1], causal=False) for b in requests]
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
        refs.append(attention_rows(q, copy.k[begin:end], copy.v[begin:end], picked, causal))
        rows += [begin + i for i in picked]
    rows = torch.tensor(rows, dtype=torch.int64, device=copy.q.device)
    return Sample(rows, torch.cat(refs), copy.q.dtype)
