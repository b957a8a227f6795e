"""The workspace layout report: fixed counter region, aligned regions, exact 64-bit sizes."""

import itertools

import pytest
import torch

import harness
import splitkv

MIB8 = 8 << 20
SHAPES = [  # (total_q, num_qo_heads, head_dim)
    (0, 1, 1), (1, 1, 64), (1, 32, 128), (7, 3, 100), (513, 8, 256), (4096, 64, 128),
    (100000, 64, 256),
]
SPLITS = [1, 2, 3, 7, 8, 64]


def _align(n):
    return (n + 255) // 256 * 256


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_regions(shape):
    total_q, num_qo_heads, head_dim = shape
    previous = 0
    for num_splits in SPLITS:
        layout = splitkv.workspace_layout(total_q, num_qo_heads, head_dim, num_splits)
        partials = num_splits * total_q * num_qo_heads if num_splits > 1 else 0
        assert layout.regions() == {
            "counter": (0, MIB8),
            "softmax": (MIB8, MIB8 + partials * 8),
            "scratch": (_align(MIB8 + partials * 8), _align(MIB8 + partials * 8) + partials * head_dim * 4),
        }
        assert layout.required_bytes == _align(layout.scratch_offset + layout.scratch_bytes)
        assert layout.required_bytes == splitkv.required_workspace_bytes(*shape, num_splits)
        for begin, _ in layout.regions().values():
            assert begin % splitkv.WORKSPACE_ALIGNMENT == 0
        # No region overlaps another, nor the counters.
        spans = sorted(layout.regions().values())
        for (_, end), (begin, _) in zip(spans, spans[1:]):
            assert end <= begin
        assert layout.required_bytes >= previous  # monotone in num_splits
        previous = layout.required_bytes
    assert splitkv.required_workspace_bytes(*shape, 1) == MIB8


def test_sizes_past_2_to_the_31_are_exact():
    layout = splitkv.workspace_layout(100000, 64, 256, 64)  # reports, allocates nothing
    partials = 64 * 100000 * 64
    assert layout.softmax_bytes == partials * 8 == 3_276_800_000
    assert layout.scratch_bytes == partials * 256 * 4 == 419_430_400_000
    assert layout.required_bytes == _align(layout.scratch_offset + layout.scratch_bytes)
    assert layout.required_bytes > 2**38


def test_argument_errors():
    with pytest.raises(ValueError, match=r"workspace_layout: num_splits out of range: "
                       r"expected >= 1, got 0"):
        splitkv.workspace_layout(1, 1, 64, 0)
    with pytest.raises(ValueError, match=r"workspace_layout: total_q out of range: "
                       r"expected >= 0, got -1"):
        splitkv.required_workspace_bytes(-1, 1, 64, 2)
    with pytest.raises(TypeError, match=r"workspace_layout: head_dim has the wrong type: "
                       r"expected an int, got 64.0"):
        splitkv.workspace_layout(1, 1, 64.0, 2)
    with pytest.raises(ValueError, match=r"workspace_layout: sizes too large"):
        splitkv.workspace_layout(2**31 - 1, 2**31 - 1, 2**31 - 1, 64)


@pytest.mark.parametrize("total_q,num_qo_heads,head_dim,num_splits", [
    (2**30 - 1, 1, 1, 2**30),           # softmax stats twice the scratch: 2**62 - 2**33 in all
    (2147483632, 134217729, 2, 2),      # stats as large as the scratch
    (2**29, 1, 2**31 - 1, 4),           # the scratch alone
])
def test_sizes_past_int64_byte_counts_are_refused(total_q, num_qo_heads, head_dim, num_splits):
    # Layouts whose softmax stats and scratch together reach 2**62 bytes are refused, whatever
    # the share of either; they once passed a check of the scratch alone and came back as
    # negative sizes (int64 wrap in ComputeWorkspaceLayout).
    partials = total_q * num_qo_heads * num_splits
    expected = partials * (8 + 4 * head_dim)
    assert expected >= 2**62
    for function in (splitkv.workspace_layout, splitkv.required_workspace_bytes):
        with pytest.raises(ValueError, match=rf"^workspace_layout: sizes too large: expected softmax and "
                           rf"scratch bytes below 2\*\*62, got {expected}$"):
            function(total_q, num_qo_heads, head_dim, num_splits)



def test_sizes_just_below_the_bound_are_counted_exactly():
    # 1.5 * 2**61 bytes of stats and scratch at head_dim 1: exact, positive sizes.
    total_q, num_splits = 2**30 - 1, 2**28
    partials = total_q * num_splits
    layout = splitkv.workspace_layout(total_q, 1, 1, num_splits)
    assert layout.softmax_bytes == 8 * partials and layout.scratch_bytes == 4 * partials
    assert layout.required_bytes == _align(_align(MIB8 + 8 * partials) + 4 * partials)


@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (8, 128), (3, 256)])
def test_fp8_prefill_workspace_bytes(num_kv_heads, head_dim):
    # The 16-bit copy: k then v past the counter region, each 256-byte aligned; a paged copy
    # adds its int32 block table (workspace_layout.h StagedKvLayout).
    row = num_kv_heads * head_dim * 2
    for total_kv in (0, 1, 7, 16384):
        k_end = MIB8 + total_kv * row
        v_end = _align(k_end) + total_kv * row
        assert splitkv.fp8_prefill_workspace_bytes(num_kv_heads, head_dim, total_kv=total_kv) == _align(v_end)
    for batch_size, max_pages, page_size in ((1, 1, 16), (3, 17, 16), (5, 2049, 1), (0, 4, 64)):
        rows = batch_size * max_pages * page_size
        table = _align(_align(MIB8 + rows * row) + rows * row)
        assert splitkv.fp8_prefill_workspace_bytes(
            num_kv_heads, head_dim, batch_size=batch_size, max_pages_per_seq=max_pages,
            page_size=page_size) == _align(table + 4 * batch_size * max_pages)


def test_fp8_prefill_workspace_bytes_argument_errors():
    op = "fp8_prefill_workspace_bytes"
    with pytest.raises(ValueError, match=rf"{op}: arguments not one form: expected total_kv alone, or "
                       r"batch_size, max_pages_per_seq and page_size together, got .*'total_kv': None"):
        splitkv.fp8_prefill_workspace_bytes(8, 128)
    with pytest.raises(ValueError, match=rf"{op}: arguments not one form: .*'total_kv': 5, 'batch_size': 2"):
        splitkv.fp8_prefill_workspace_bytes(8, 128, total_kv=5, batch_size=2, max_pages_per_seq=3, page_size=16)
    with pytest.raises(ValueError, match=rf"{op}: arguments not one form: .*'page_size': None"):
        splitkv.fp8_prefill_workspace_bytes(8, 128, batch_size=2, max_pages_per_seq=3)
    with pytest.raises(ValueError, match=rf"{op}: total_kv out of range: expected >= 0, got -1"):
        splitkv.fp8_prefill_workspace_bytes(8, 128, total_kv=-1)
    with pytest.raises(ValueError, match=rf"{op}: max_pages_per_seq out of range: expected >= 1, got 0"):
        splitkv.fp8_prefill_workspace_bytes(8, 128, batch_size=2, max_pages_per_seq=0, page_size=16)
    with pytest.raises(TypeError, match=rf"{op}: head_dim has the wrong type: expected an int, got 128.0"):
        splitkv.fp8_prefill_workspace_bytes(8, 128.0, total_kv=5)
    with pytest.raises(ValueError, match=rf"{op}: sizes too large"):
        splitkv.fp8_prefill_workspace_bytes(2**31 - 1, 2**31 - 1, total_kv=2**31 - 1)
    # The figure refused is the one checked: K, V and the table's 4 bytes an entry.
    with pytest.raises(ValueError, match=rf"^{op}: sizes too large: expected bytes below 2\*\*62, "
                       rf"got {2**61 + 4 * 2**59}$"):
        splitkv.fp8_prefill_workspace_bytes(1, 1, batch_size=2**29, max_pages_per_seq=2**30, page_size=1)


def test_plans_of_many_calls_keep_the_counter_region():
    # Paged and ragged calls of many sizes, split or not, on a small and a large workspace:
    # the counters are always bytes [0, 8 MiB) and nothing else is placed there.
    small = splitkv.Workspace(MIB8 + (1 << 20))
    large = splitkv.Workspace(64 << 20)
    for (batch, q_len, group), num_splits in itertools.product(
            [(1, 1, 1), (3, 5, 4), (17, 1, 8), (2, 300, 2)], [None, 1, 2]):
        paged = harness.make_paged([40 + 9 * b for b in range(batch)], page_size=16,
                                   group=group, q_lens=[q_len] * batch, dtype=torch.float16)
        ragged = harness.make_ragged([q_len] * batch, [q_len + 30] * batch, group=group,
                                     dtype=torch.float16)
        for problem, workspace in itertools.product((paged, ragged), (small, large)):
            if num_splits is not None and splitkv.required_workspace_bytes(
                    *problem.q.shape, num_splits) > workspace.nbytes:
                with pytest.raises(ValueError, match="workspace too small"):
                    problem.plan(workspace, num_splits=num_splits)
                continue
            plan = problem.plan(workspace, num_splits=num_splits)
            harness.assert_plan_keeps_counter_region(plan)
            assert plan.layout.required_bytes <= workspace.nbytes
            assert plan.layout == splitkv.workspace_layout(
                problem.q.shape[0], problem.q.shape[1], problem.q.shape[2], plan.num_splits)
            if num_splits is not None:
                assert plan.num_splits == num_splits


def test_planner_lowers_splits_to_fit():
    problem = harness.make_paged([4096], page_size=64, group=8, dtype=torch.float16)
    wanted = problem.plan(splitkv.Workspace(64 << 20)).num_splits
    assert wanted > 2
    # Room for exactly 2 splits: the planner uses 2; only the counters: 1.
    shape = problem.q.shape
    fits_two = splitkv.Workspace(splitkv.required_workspace_bytes(*shape, 2))
    assert problem.plan(fits_two).num_splits == 2
    assert problem.plan(splitkv.Workspace(MIB8)).num_splits == 1
    out = problem.run(splitkv.Workspace(MIB8))
    harness.assert_close(out, problem.reference()[0], torch.float16)


def test_more_tiles_than_counters():
    # A huge max_q_len makes more work tiles than the 2**21 counters: a forced split is
    # refused with the counts, the planner falls back to 1 split (which needs no counter).
    problem = harness.make_ragged([3, 5], [30, 50], group=1, dtype=torch.float16)
    workspace = splitkv.Workspace(16 << 20)
    max_q_len = 2**31 - 1  # 33554432 query tiles of 64 tokens, x 2 requests x 2 kv heads
    with pytest.raises(ValueError, match=r"ragged_attention: too many work tiles for the counter "
                       r"region: need 134217728 counters for num_splits=2, the region holds "
                       r"2097088; use num_splits=1 or a smaller batch"):
        problem.plan(workspace, num_splits=2, max_q_len=max_q_len)
    assert problem.plan(workspace, max_q_len=max_q_len).num_splits == 1
    out = problem.run(workspace, max_q_len=max_q_len)
    harness.assert_close(out, problem.reference()[0], torch.float16)
    harness.assert_counter_region_zero(workspace)
