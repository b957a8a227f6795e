"""Scale on the GPU: single calls past 32-bit sizes, checked against a float64 reference.

- paged decode: a batch above 65,535 requests over a KV cache of more than 2**31 elements
  (more than 4 GiB of bfloat16; its pages in random order, so most requests' pages lie
  past element 2**31), planned and with forced splits, in HND and NHD;
- ragged prefill: a batch above 65,535 requests whose k and v hold more than 2**31
  elements each.

The reference (splitkv_reference.padded_attention) runs on the device in float64, a chunk
of requests at a time, gathering the keys with torch indexing (not the kernels'
addressing); a few requests are also checked against its one-request path on the CPU.
Ends with a table; exits nonzero on a failure.

    PYTHONPATH=.device:tests/python python3 tests/stress/scale_gpu.py
    python3 tests/stress/scale_gpu.py --device=cpu --batch=300 --min_cache_elements=0  # dry run
"""

import os
import sys
import time

from absl import app
from absl import flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "python"))  # harness
try:
    import splitkv
except ImportError:  # a source checkout: conftest finds the extension built by Bazel
    import conftest  # noqa: F401
    import splitkv

import torch  # noqa: E402

import harness  # noqa: E402
import splitkv_reference  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("device", "cuda", "Device: cuda (or cpu for a small dry run).")
flags.DEFINE_integer("batch", 70_000, "Requests per call (above 65,535: a grid's y/z limit).")
flags.DEFINE_integer("min_cache_elements", 2**31 + 2**28, "Least elements in the paged KV "
                     "cache (and in each of ragged k and v).")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_list("cases", ["paged", "ragged"], "Which cases to run.")

_DTYPE = torch.bfloat16


def _chunk(longest_kv, num_kv_heads, head_dim):
    """Requests per reference step: about 2**27 float64 key elements at a time."""
    return max(1, 2**27 // (max(1, longest_kv) * num_kv_heads * head_dim))


class Errors:
    """Running max of |out - ref| and |lse - ref| over the valid rows, and the mismatches."""

    def __init__(self, dtype):
        self.atol, self.rtol = harness.OUT_TOLERANCE[dtype]
        self.out = self.lse = 0.0
        self.bad = 0

    def add(self, out, lse, ref_out, ref_lse, valid):
        out, ref_out = out[valid].to(torch.float64), ref_out[valid]
        lse, ref_lse = lse[valid].to(torch.float64), ref_lse[valid]
        diff = (out - ref_out).abs()
        self.out = max(self.out, float(diff.max()))
        self.bad += int((~(diff <= self.atol + self.rtol * ref_out.abs())).sum())
        lse_atol, lse_rtol = harness.LSE_TOLERANCE
        lse_diff = torch.where(lse == ref_lse, torch.zeros_like(lse), (lse - ref_lse).abs())
        self.lse = max(self.lse, float(lse_diff.max()))
        self.bad += int((~(lse_diff <= lse_atol + lse_rtol * ref_lse.abs())).sum())


def _paged_problem(device, generator):
    batch, num_kv_heads, group, head_dim, page_size = FLAGS.batch, 2, 4, 128, 16
    seq_lens = torch.randint(1, 161, (batch,), generator=generator)
    pages_per_seq = (seq_lens + page_size - 1) // page_size
    page_elements = 2 * num_kv_heads * page_size * head_dim
    needed = int(pages_per_seq.sum()) + 1
    num_pages = max(needed, -(-FLAGS.min_cache_elements // page_elements))
    max_pages = int(pages_per_seq.max()) + 1
    order = torch.randperm(num_pages, generator=generator)
    spare = int(order[-1])  # never holds a key: NaN, pointed at by the padding column
    block_tables = torch.full((batch, max_pages), spare, dtype=torch.int32)
    columns = torch.arange(max_pages)[None, :]
    used = columns < pages_per_seq[:, None]
    block_tables[used] = order[:int(used.sum())].to(torch.int32)
    cache = torch.full((num_pages, 2, num_kv_heads, page_size, head_dim), float("nan"),
                       dtype=_DTYPE, device=device)
    total = int(seq_lens.sum())
    request = torch.repeat_interleave(torch.arange(batch), seq_lens)
    position = torch.arange(total) - (torch.cumsum(seq_lens, 0) - seq_lens)[request]
    page = block_tables.to(torch.int64)[request, position // page_size].to(device)
    slot = (position % page_size).to(device)
    for kind in (0, 1):  # k, then v: [total, heads, head_dim] random values
        values = torch.randn((total, num_kv_heads, head_dim), device=device).to(_DTYPE)
        cache[page, kind, :, slot] = values
        del values
    q = torch.randn((batch, num_kv_heads * group, head_dim), device=device).to(_DTYPE)
    return q, cache, block_tables.to(device), seq_lens.to(torch.int32).to(device)


def _paged_keys(cache, block_tables, lengths, page_size, kind):
    """[n, max(lengths), heads, head_dim] keys (kind 0) or values (1) of n requests, gathered
    by position from an HND cache."""
    longest = int(lengths.max())
    position = torch.arange(longest, device=cache.device)
    pages = block_tables.to(torch.int64)[:, position // page_size]  # [n, L]
    return cache[pages, kind, :, position % page_size]  # [n, L, heads, head_dim]


def _check_paged(out, lse, q, cache, block_tables, seq_lens, errors):
    page_size = cache.shape[3]
    step = _chunk(int(seq_lens.max()), cache.shape[2], cache.shape[4])
    for first in range(0, q.shape[0], step):
        part = slice(first, first + step)
        lens = seq_lens[part].to(torch.int64)
        keys = _paged_keys(cache, block_tables[part], lens, page_size, 0)
        values = _paged_keys(cache, block_tables[part], lens, page_size, 1)
        ref_out, ref_lse = splitkv_reference.padded_attention(
            q[part, None], keys, values, torch.ones_like(lens), lens, causal=True)
        valid = torch.ones(ref_out.shape[:2], dtype=torch.bool, device=q.device)
        errors.add(out[part, None], lse[part, None], ref_out, ref_lse, valid)
        if first == 0:  # the batched path against the one-request path, on the CPU
            for b in (0, 1, 7):
                n = int(lens[b])
                expected, expected_lse = splitkv_reference.attention(
                    q[b:b + 1].cpu(), keys[b, :n].cpu(), values[b, :n].cpu())
                torch.testing.assert_close(ref_out[b, :1].cpu(), expected)
                torch.testing.assert_close(ref_lse[b, :1].cpu(), expected_lse)


def _ragged_problem(device, generator):
    batch, num_kv_heads, group, head_dim = FLAGS.batch, 8, 4, 128
    q_lens = torch.randint(1, 9, (batch,), generator=generator)
    kv_lens = q_lens + torch.randint(0, 121, (batch,), generator=generator)
    # k and v past 2**31 elements each: lengthen every request's cached prefix alike.
    deficit = -(-FLAGS.min_cache_elements // (num_kv_heads * head_dim)) - int(kv_lens.sum())
    kv_lens += max(0, -(-deficit // batch))
    total_q, total_kv = int(q_lens.sum()), int(kv_lens.sum())
    q = torch.randn((total_q, num_kv_heads * group, head_dim), device=device).to(_DTYPE)
    k = torch.randn((total_kv, num_kv_heads, head_dim), device=device).to(_DTYPE)
    v = torch.randn((total_kv, num_kv_heads, head_dim), device=device).to(_DTYPE)
    return (q, k, v, harness.cu_seqlens(q_lens.tolist(), device),
            harness.cu_seqlens(kv_lens.tolist(), device), int(q_lens.max()))


def _padded_rows(x, cu, lens, longest):
    """[n, longest, ...] rows cu[b] .. cu[b] + lens[b] of x (clamped past the end)."""
    index = cu[:, None] + torch.arange(longest, device=x.device)[None, :]
    return x[index.clamp(max=x.shape[0] - 1)]


def _check_ragged(out, lse, q, k, v, cu_q, cu_kv, errors):
    batch = cu_q.numel() - 1
    cu_q64, cu_kv64 = cu_q.to(torch.int64), cu_kv.to(torch.int64)
    q_lens, kv_lens = cu_q64.diff(), cu_kv64.diff()
    step = _chunk(int(kv_lens.max()), k.shape[1], k.shape[2])
    for first in range(0, batch, step):
        part = slice(first, min(batch, first + step))
        ql, kl = q_lens[part], kv_lens[part]
        lq, lk = int(ql.max()), int(kl.max())
        ref_out, ref_lse = splitkv_reference.padded_attention(
            _padded_rows(q, cu_q64[part], ql, lq), _padded_rows(k, cu_kv64[part], kl, lk),
            _padded_rows(v, cu_kv64[part], kl, lk), ql, kl, causal=True)
        valid = torch.arange(lq, device=q.device)[None, :] < ql[:, None]
        errors.add(_padded_rows(out, cu_q64[part], ql, lq), _padded_rows(lse, cu_q64[part], ql, lq),
                   ref_out, ref_lse, valid)


def _timed(call, device):
    call()  # warm up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, 1e3 * (time.perf_counter() - start)


def _gib(nbytes):
    return f"{nbytes / 2**30:.2f} GiB"


def main(argv):
    del argv
    device = torch.device(FLAGS.device)
    generator = torch.Generator().manual_seed(FLAGS.seed)  # shapes and page order
    torch.manual_seed(FLAGS.seed)  # values, drawn on the device
    rows, failed = [], 0

    def record(case, batch, kv_bytes, kv_elements, plan, ms, errors, workspace):
        nonlocal failed
        try:
            workspace.check_counter_region()
            counters = "zero"
        except ValueError as error:
            counters = f"NOT ZERO ({error})"
        ok = errors.bad == 0 and counters == "zero"
        failed += not ok
        rows.append((case, f"{batch:,}", _gib(kv_bytes), f"{kv_elements:,}", str(plan.num_splits),
                     f"{ms:.2f}", f"{errors.out:.2e}", f"{errors.lse:.2e}", counters,
                     "ok" if ok else f"FAIL ({errors.bad} values off)"))
        print(" | ".join(rows[-1]), flush=True)

    if "paged" in FLAGS.cases:
        q, cache, block_tables, seq_lens = _paged_problem(device, generator)
        kv_bytes = cache.numel() * cache.element_size()
        workspace = splitkv.Workspace(splitkv.required_workspace_bytes(*q.shape, 3), device)
        for kv_layout, num_splits in (("HND", None), ("HND", 3), ("NHD", 2)):
            kv = cache if kv_layout == "HND" else cache.transpose(2, 3)  # an NHD view
            plan = splitkv.plan_paged_attention(q, kv, block_tables, seq_lens, workspace,
                                                kv_layout=kv_layout, num_splits=num_splits)
            (out, lse), ms = _timed(lambda: splitkv.paged_attention(
                q, kv, block_tables, seq_lens, workspace, kv_layout=kv_layout,
                num_splits=num_splits, return_lse=True), device)
            errors = Errors(_DTYPE)
            _check_paged(out, lse, q, cache, block_tables, seq_lens, errors)
            record(f"paged decode {kv_layout} num_splits={num_splits}", q.shape[0], kv_bytes,
                   cache.numel(), plan, ms, errors, workspace)
        del q, cache, block_tables, seq_lens, out, lse, workspace

    if "ragged" in FLAGS.cases:
        q, k, v, cu_q, cu_kv, max_q_len = _ragged_problem(device, generator)
        kv_bytes = 2 * k.numel() * k.element_size()
        workspace = splitkv.Workspace(splitkv.required_workspace_bytes(*q.shape, 2), device)
        for num_splits in (None, 2):
            plan = splitkv.plan_ragged_attention(q, k, v, cu_q, cu_kv, workspace,
                                                 num_splits=num_splits, max_q_len=max_q_len)
            (out, lse), ms = _timed(lambda: splitkv.ragged_attention(
                q, k, v, cu_q, cu_kv, workspace, num_splits=num_splits, max_q_len=max_q_len,
                return_lse=True), device)
            errors = Errors(_DTYPE)
            _check_ragged(out, lse, q, k, v, cu_q, cu_kv, errors)
            record(f"ragged prefill num_splits={num_splits}", cu_q.numel() - 1, kv_bytes,
                   k.numel(), plan, ms, errors, workspace)

    header = ("case", "batch", "KV bytes", "KV elements (one tensor)", "splits", "ms",
              "max|out-ref|", "max|lse-ref|", "counters", "result")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("\nsplitkv scale summary (" + str(device) + ")")
    for line in [header, tuple("-" * w for w in widths)] + rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |")
    print("OK" if failed == 0 else f"FAIL: {failed} cases")
    return 1 if failed else 0


if __name__ == "__main__":
    app.run(main)
