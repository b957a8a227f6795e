"""Sizes and offsets in 64 bits, on the CPU.

Plans of calls past 2**31 elements without allocating them: q, k, v and the paged cache are
stride-0 views of one row, so the launchers see the real shapes (and the planner the real
token counts) while memory holds a few hundred bytes. Then real launches whose KV, queries
and outputs sit past element 2**31 of their tensors: the tensors are reserved address space
(torch.empty), and only the few pages a call touches are ever written, so memory use stays
small; where the system refuses the reservation, those tests skip.

The GPU counterpart (a call over more than 2**31 bytes of KV cache with a batch above
65,535 requests) is tests/stress/scale_gpu.py.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))  # harness (tests/python)

import harness  # noqa: E402
import splitkv  # noqa: E402  (importable: Bazel's runfiles, or this directory's conftest)
import splitkv_reference  # noqa: E402  (likewise)

MIB8 = splitkv.COUNTER_REGION_BYTES
INT32_MAX = 2**31 - 1
DTYPE = torch.float16


def _align(n):
    return (n + 255) // 256 * 256


def _need(total_q, num_qo_heads, head_dim, num_splits):
    """The workspace bytes of a split call, by DESIGN.md's layout, in Python integers."""
    partials = num_splits * total_q * num_qo_heads
    return _align(_align(MIB8 + partials * 8) + partials * head_dim * 4)


def _one_row(shape, dtype=DTYPE):
    """A tensor of `shape` backed by one row of memory (stride 0 but in the last dimension)."""
    return torch.zeros(shape[-1], dtype=dtype).expand(shape)


def _reserve(numel, dtype=DTYPE):
    """numel elements of untouched address space; skips the test if the system refuses."""
    try:
        return torch.empty(numel, dtype=dtype)
    except RuntimeError as error:
        pytest.skip(f"cannot reserve {numel * torch.finfo(dtype).bits // 8 / 2**30:.1f} GiB "
                    f"of address space: {error}")


def test_ragged_plan_past_2_31_tokens_and_elements():
    total_q = total_kv = INT32_MAX  # the most int32 cu_seqlens can index
    num_qo_heads, num_kv_heads, head_dim = 64, 16, 128
    q = _one_row((total_q, num_qo_heads, head_dim))
    k = v = _one_row((total_kv, num_kv_heads, head_dim))
    cu_q = torch.tensor([0, 1000, total_q], dtype=torch.int32)
    cu_kv = torch.tensor([0, 5, total_kv], dtype=torch.int32)
    workspace = splitkv.Workspace(16 << 20)

    plan = splitkv.plan_ragged_attention(q, k, v, cu_q, cu_kv, workspace)
    assert plan.num_splits == 1 and plan.layout.required_bytes == MIB8
    # 2 requests x 16 kv heads x ceil((2**31 - 1001) / 16 query tokens per tile) ~ 2**32.
    q_tile_tokens = 64 // (num_qo_heads // num_kv_heads)
    assert plan.num_tiles == 2 * num_kv_heads * -(-(total_q - 1000) // q_tile_tokens)
    assert plan.num_tiles > 2**31

    need = _need(total_q, num_qo_heads, head_dim, 2)
    assert need > 2**40 and need == splitkv.required_workspace_bytes(total_q, num_qo_heads,
                                                                     head_dim, 2)
    with pytest.raises(ValueError, match=rf"ragged_attention: workspace too small: need {need} "
                       rf"bytes for num_splits=2, got {16 << 20}"):
        splitkv.plan_ragged_attention(q, k, v, cu_q, cu_kv, workspace, num_splits=2)


def test_paged_plan_past_2_31_pages_and_keys():
    # 2**31 - 1 pages of 4096 slots: 2**43 KV elements; capacity 2**32 keys per request.
    num_pages, page_size, num_kv_heads, head_dim, group = INT32_MAX, 4096, 1, 128, 8
    kv_cache = _one_row((num_pages, 2, num_kv_heads, page_size, head_dim))
    batch = 2
    block_tables = torch.zeros(batch, 2**20, dtype=torch.int32)
    seq_lens = torch.tensor([INT32_MAX, 2**31 - 4096], dtype=torch.int32)
    q = torch.zeros(batch, num_kv_heads * group, head_dim, dtype=DTYPE)
    workspace = splitkv.Workspace(64 << 20)

    plan = splitkv.plan_paged_attention(q, kv_cache, block_tables, seq_lens, workspace)
    assert plan.num_tiles == batch * num_kv_heads
    assert 1 < plan.num_splits <= 64  # 2 tiles for several CPU workers, 2**31 keys: split
    assert plan.layout == splitkv.workspace_layout(batch, group, head_dim, plan.num_splits)
    assert plan.layout.required_bytes == _need(batch, group, head_dim, plan.num_splits)
    forced = splitkv.plan_paged_attention(q, kv_cache, block_tables, seq_lens, workspace,
                                          num_splits=64)
    assert forced.num_splits == 64 and forced.layout.required_bytes <= workspace.nbytes


def test_layout_of_the_largest_int32_shapes():
    # Every factor at int32's limit: the products need 93+ bits, and are refused, not wrapped.
    with pytest.raises(ValueError, match=r"workspace_layout: sizes too large"):
        splitkv.workspace_layout(INT32_MAX, INT32_MAX, 1024, 2)
    layout = splitkv.workspace_layout(INT32_MAX, 256, 1024, 2)  # 2**51 bytes of scratch
    assert layout.scratch_bytes == 2 * INT32_MAX * 256 * 1024 * 4
    assert layout.required_bytes == _need(INT32_MAX, 256, 1024, 2)


def _check(out, lse, q, keys, values, options):
    expected, expected_lse = splitkv_reference.attention(q, keys, values, **options)
    harness.assert_close(out, expected, DTYPE)
    harness.assert_lse_close(lse, expected_lse)


@pytest.mark.parametrize("num_splits", [None, 3])
def test_ragged_launch_past_2_31_elements(num_splits):
    num_qo_heads, num_kv_heads, head_dim = 2, 1, 64
    # k and v interleaved in one buffer (token stride 128): request 1's 300 keys start past
    # element 2**31; request 0 has 0 queries, so its keys are never read.
    total_kv = 2**31 // 128 + 2**20
    kv = _reserve(total_kv * 2 * num_kv_heads * head_dim).view(total_kv, 2, num_kv_heads,
                                                               head_dim)
    k, v = kv[:, 0], kv[:, 1]
    first_key = total_kv - 300
    assert first_key * k.stride(0) > 2**31
    generator = torch.Generator().manual_seed(5)
    kv[first_key:] = torch.randn(kv[first_key:].shape, generator=generator).to(DTYPE)
    # 10 query rows 2**28 elements apart, so rows 8 and 9 (and their outputs) lie past 2**31.
    rows, row_stride = 10, 2**28
    shape, strides = (rows, num_qo_heads, head_dim), (row_stride, head_dim, 1)
    q = _reserve((rows - 1) * row_stride + num_qo_heads * head_dim).as_strided(shape, strides)
    out = _reserve((rows - 1) * row_stride + num_qo_heads * head_dim).as_strided(shape, strides)
    q.copy_(torch.randn(shape, generator=generator).to(DTYPE))
    assert q.storage_offset() == 0 and (rows - 1) * row_stride > 2**31
    cu_q = torch.tensor([0, 0, rows], dtype=torch.int32)
    cu_kv = torch.tensor([0, first_key, total_kv], dtype=torch.int32)
    workspace = splitkv.Workspace(16 << 20)

    got, lse = splitkv.ragged_attention(q, k, v, cu_q, cu_kv, workspace, num_splits=num_splits,
                                        out=out, return_lse=True)
    assert got is out
    _check(out, lse, q, k[first_key:], v[first_key:], {})
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("kv_layout, num_splits", [("HND", None), ("NHD", 2)])
def test_paged_launch_past_2_31_elements(kv_layout, num_splits):
    num_qo_heads, num_kv_heads, head_dim, page_size = 4, 1, 64, 16
    page_elements = 2 * num_kv_heads * page_size * head_dim
    num_pages = 2**31 // page_elements + 4096  # the last 4096 pages start past element 2**31
    inner = (2, num_kv_heads, page_size, head_dim) if kv_layout == "HND" else (
        2, page_size, num_kv_heads, head_dim)
    kv_cache = _reserve(num_pages * page_elements).view(num_pages, *inner)
    generator = torch.Generator().manual_seed(6)
    seq_lens = [37, 300, 1]
    pages_needed = [-(-n // page_size) for n in seq_lens]
    high = (num_pages - 4096 + torch.randperm(4096, generator=generator)).tolist()
    block_tables = torch.full((len(seq_lens), max(pages_needed)), num_pages - 1, dtype=torch.int32)
    keys, values = [], []
    for b, n in enumerate(seq_lens):
        k = torch.randn(n, num_kv_heads, head_dim, generator=generator).to(DTYPE)
        v = torch.randn(n, num_kv_heads, head_dim, generator=generator).to(DTYPE)
        keys.append(k)
        values.append(v)
        for p in range(pages_needed[b]):
            page = high.pop()
            block_tables[b, p] = page
            chunk = slice(p * page_size, min(n, (p + 1) * page_size))
            slots = chunk.stop - chunk.start
            for kind, data in ((0, k), (1, v)):
                if kv_layout == "HND":
                    kv_cache[page, kind, :, :slots] = data[chunk].transpose(0, 1)
                else:
                    kv_cache[page, kind, :slots] = data[chunk]
    assert int(block_tables.min()) * page_elements > 2**31
    q = torch.randn(len(seq_lens), num_qo_heads, head_dim, generator=generator).to(DTYPE)
    workspace = splitkv.Workspace(16 << 20)

    out, lse = splitkv.paged_attention(q, kv_cache, block_tables,
                                       torch.tensor(seq_lens, dtype=torch.int32), workspace,
                                       kv_layout=kv_layout, num_splits=num_splits,
                                       return_lse=True)
    for b in range(len(seq_lens)):
        _check(out[b:b + 1], lse[b:b + 1], q[b:b + 1], keys[b], values[b], {})
    harness.assert_counter_region_zero(workspace)
