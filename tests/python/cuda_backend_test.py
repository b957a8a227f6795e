"""The CUDA backend against the float64 reference and the CPU backend, under the workspace
contract: many interleaved launches on one never re-zeroed workspace, and CUDA graphs.

Every test here needs a GPU (mark `gpu`). With SPLITKV_METRICS set to a file path, each
correctness case appends one JSON line with its errors (tools/gpu/run_checks.sh reads them).
"""

import json
import os
import random
import re
import zlib

import pytest
import torch

import harness
import splitkv
import splitkv_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda():
    harness.require("cuda")


def _record(kind, case, **figures):
    path = os.environ.get("SPLITKV_METRICS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, "case": case, **figures}) + "\n")


def _errors(actual, expected):
    """Max absolute error and the relative error ||a - e|| / ||e|| (float64)."""
    a = actual.detach().cpu().to(torch.float64)
    diff = (a - expected).abs()
    return float(diff.max()) if diff.numel() else 0.0, float(
        (a - expected).norm() / max(float(expected.norm()), 1e-30))


def _to_cpu(x):
    if isinstance(x, tuple):
        return tuple(t.cpu() for t in x)
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _check_against_cpu(out_gpu, out_cpu, dtype):
    # Both backends approximate the same float64 value: allow each one's tolerance.
    atol, rtol = harness.OUT_TOLERANCE[dtype]
    torch.testing.assert_close(out_gpu.cpu().to(torch.float64), out_cpu.to(torch.float64),
                               atol=2 * atol, rtol=2 * rtol)


# ---- correctness: float64 reference and the CPU backend on the same inputs ----

_PAGED_CASES = harness.pairwise({
    "dtype": [torch.float16, torch.bfloat16],
    "head_dim": [64, 128, 256],
    "page_size": [1, 16, 128],
    "layout": ["HND", "NHD"],
    "form": ["5d", "pair", "strided"],
    "group": [1, 4, 8],
    "queries": ["decode", "spec", "chunk"],
    "options": ["plain", "window", "softcap", "noncausal"],
    "num_splits": [None, 1, 3],
}, seed=3)

_OPTIONS = {
    "plain": {},
    "window": {"window_left": 37},
    "softcap": {"logits_soft_cap": 5.0},
    "noncausal": {"causal": False},
}


def _paged_problem(case, device):
    seq_lens = [1, 97, 300, 1100]
    q_lens = {"decode": None, "spec": [1, 3, 4, 2], "chunk": [1, 70, 150, 37]}[case["queries"]]
    return harness.make_paged(
        seq_lens, page_size=case["page_size"], num_kv_heads=2, group=case["group"],
        head_dim=case["head_dim"], dtype=case["dtype"], device=device, kv_layout=case["layout"],
        kv_form=case["form"], q_lens=q_lens, seed=zlib.crc32(harness.case_id(case).encode()))


def _check_against_reference_and_cpu(kind, make_problem, case):
    """One CUDA call of `case` (NaN-poisoned out, garbage in the workspace's scratch)
    against float64 and the CPU backend; the counter region zero after it."""
    problem = make_problem(case, "cuda")
    workspace = harness.shared_workspace("cuda")
    harness.fill_garbage(workspace)
    options = dict(_OPTIONS[case["options"]], num_splits=case["num_splits"], return_lse=True)
    out = torch.full_like(problem.q, float("nan"))
    plan = problem.plan(workspace, **options)
    got, lse = problem.run(workspace, out=out, **options)
    torch.cuda.synchronize()
    harness.assert_counter_region_zero(workspace)

    expected, expected_lse = problem.reference(**options)
    harness.assert_close(got, expected, case["dtype"])
    harness.assert_lse_close(lse, expected_lse)

    cpu_out, _ = make_problem(case, "cpu").run(harness.shared_workspace("cpu"), **options)
    _check_against_cpu(got, cpu_out, case["dtype"])
    abs_err, rel_err = _errors(got, expected)
    _record(kind, harness.case_id(case), num_splits=plan.num_splits, max_abs_err=abs_err,
            rel_err=rel_err, max_abs_diff_cpu=_errors(got, cpu_out.to(torch.float64))[0])


@pytest.mark.parametrize("case", _PAGED_CASES, ids=harness.case_id)
def test_paged_matches_reference_and_cpu(case):
    _check_against_reference_and_cpu("paged", _paged_problem, case)


# Long decode tiles on the sm_90 kernel's tensor copies (head_dim 256 through its K/V ring):
# splits that end inside a 64-key block, pages from the smallest box (8 slots) to a whole
# block, a window (the first key inside a box: the copies fetch keys below it, which must be
# masked and their V rows zeroed), NaN in every slot past seq_len, a NaN-poisoned out and
# workspace. Elsewhere (other GPUs) the same cases check the cp.async kernel.
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("page_size", [8, 16, 64])
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
@pytest.mark.parametrize("window_left", [-1, 37])
def test_long_decode_matches_reference(head_dim, page_size, num_splits, kv_layout, window_left):
    problem = harness.make_paged([5, 333, 2049, 4133], page_size=page_size, num_kv_heads=2, group=4,
                                 head_dim=head_dim, dtype=torch.bfloat16, device="cuda",
                                 kv_layout=kv_layout, seed=head_dim * 1000 + page_size * 10 + num_splits)
    workspace = harness.shared_workspace("cuda")
    harness.fill_garbage(workspace)
    options = {} if window_left < 0 else {"window_left": window_left}
    harness.run_and_check(problem, workspace, options, poison_out=True, num_splits=num_splits)


# Head_dim 64's unsplit decode grids by the kernel shape each runs (cuda/attention_launch.cuh):
# up to 2 CTAs an SM and past 4 the 128-key wgmma-order tiles at three an SM, 2-3 the 64-key
# shape, 3-4 the 128-key tiles at two an SM (D64TwoPerSmGrid); sized from this GPU's SM count
# (2 kv heads: two tiles a request), request lengths from 1 key to several blocks.
@pytest.mark.parametrize("ctas_per_sm", [1.5, 2.5, 3.5, 4.5])
@pytest.mark.parametrize("page_size", [16, 64])
def test_d64_decode_grid_shapes_match_reference(ctas_per_sm, page_size):
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    batch = int(ctas_per_sm * sms) // 2
    problem = harness.make_paged([1 + (97 * i) % 1500 for i in range(batch)], page_size=page_size, num_kv_heads=2,
                                 group=4, head_dim=64, dtype=torch.bfloat16, device="cuda", seed=batch + page_size)
    workspace = harness.shared_workspace("cuda")
    harness.fill_garbage(workspace)
    harness.run_and_check(problem, workspace, {}, poison_out=True, num_splits=1)


def _bulk_decode_shapes(call):
    """The BulkDecodeShape template arguments of every decode_kernel.cuh kernel `call` launches,
    as tuples of ints (true 1, false 0), read from the CUDA kernels' names in a torch.profiler
    trace (a cast such as (bool)1 in a demangled name is dropped)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    shapes = []
    for event in prof.events():
        match = re.search(r"BulkDecodeShape<([^<>]*)>", event.name)
        if match:
            args = [re.sub(r"\(\w+\)", "", a).strip() for a in match.group(1).split(",")]
            shapes.append(tuple(int({"true": "1", "false": "0"}.get(a, a)) for a in args))
    return shapes


# Head_dim 128's default decode grids (cuda/attention_launch.cuh): the 128-key wgmma-order
# tiles unsplit (1.5 and 2.5 CTAs an SM) and on split grids past one wave of the split shape's
# CTAs (4 forced splits of 2 tiles an SM: 8 CTAs an SM, short requests leaving splits empty);
# a one-wave split grid (2 splits of 1 tile an SM) stays on the 2-stage split shape. Sized from
# this GPU's SM count (2 kv heads: two tiles a request), request lengths from 1 key to several
# blocks. On sm_90 the test also checks which kernel shape ran (BulkDecodeShape's arguments:
# head_dim, block keys, stages, tensor copies, K/V ring, fp8, keys as rows, wgmma order).
@pytest.mark.parametrize("tiles_per_sm,num_splits", [(1.5, 1), (2.5, 1), (2, 4), (1, 2)])
@pytest.mark.parametrize("page_size", [16, 64])
def test_d128_decode_grid_shapes_match_reference(tiles_per_sm, num_splits, page_size):
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    batch = int(tiles_per_sm * sms) // 2
    problem = harness.make_paged([1 + (97 * i) % 1500 for i in range(batch)], page_size=page_size, num_kv_heads=2,
                                 group=4, head_dim=128, dtype=torch.bfloat16, device="cuda",
                                 seed=batch * 10 + num_splits + page_size)
    workspace = harness.shared_workspace("cuda")
    harness.fill_garbage(workspace)
    harness.run_and_check(problem, workspace, {}, poison_out=True, num_splits=num_splits)
    if torch.cuda.get_device_capability() == (9, 0):
        shapes = _bulk_decode_shapes(lambda: problem.run(workspace, num_splits=num_splits))
        one_wave_split = num_splits > 1 and tiles_per_sm * num_splits <= 3
        expected = (128, 64, 2, 1, 0, 0, 0, 0) if one_wave_split else (128, 128, 3, 1, 1, 0, 0, 1)
        assert [s[:8] for s in shapes] == [expected], shapes


# A split tile's merge from shared memory in chunks of rows (split_merge.cuh MergeFromShared):
# 32 splits of 8, 16 or 4 rows whose partials outgrow the decode kernel's shared memory (head_dim
# 128 at group 8 and 2 tokens x 8, 256 at group 4, 64 at group 16), 13 splits (one piece),
# sinks, and an invariant call (30 splits: its fold takes the register path where the tile does
# not fit in one piece). The default head_dim 128 rows are one-wave split grids (the 2-stage
# split shape) but the one that repeats its requests 7 times (1344 CTAs: the wgmma-order tiles,
# attention_launch.cuh). NaN-poisoned output and workspace scratch, against the float64 reference.
@pytest.mark.parametrize("head_dim,group,q_len,options", [
    (128, 8, 1, dict(num_splits=32)),
    (128, 8, 1, dict(num_splits=13, sinks=True)),
    (128, 8, 2, dict(num_splits=32)),
    (128, 8, 1, dict(num_splits=32, repeat=7)),
    (256, 4, 1, dict(num_splits=32)),
    (64, 16, 1, dict(num_splits=32, sinks=True)),
    (128, 8, 1, dict(batch_invariant=True)),
])
def test_decode_merge_in_row_chunks_matches_reference(head_dim, group, q_len, options):
    lengths = ([60000, 9000, 1] if options.get("batch_invariant") else [4000, 2100, 1]) * options.get("repeat", 1)
    problem = harness.make_paged(lengths, page_size=16, group=group, head_dim=head_dim, dtype=torch.bfloat16,
                                 device="cuda", q_lens=[q_len] * len(lengths) if q_len > 1 else None,
                                 seed=head_dim + group + q_len)
    run = dict(num_splits=options["num_splits"]) if "num_splits" in options else {}
    attention = {k: v for k, v in options.items() if k not in ("num_splits", "sinks", "repeat")}
    if options.get("sinks"):
        attention["sinks"] = torch.linspace(-3, 3, 2 * group, device="cuda")
    if q_len > 1:
        run["max_q_len"] = q_len
    workspace = harness.shared_workspace("cuda")
    harness.fill_garbage(workspace)
    harness.run_and_check(problem, workspace, attention, poison_out=True, **run)


_RAGGED_CASES = harness.pairwise({
    "dtype": [torch.float16, torch.bfloat16],
    "head_dim": [64, 128, 256],
    "group": [1, 4, 8],
    "lengths": ["square", "q<kv", "q>kv", "empty"],
    "options": ["plain", "window", "softcap", "noncausal"],
    "strided": [False, True],
    "num_splits": [None, 1, 3],
}, seed=5)

_LENGTHS = {
    "square": ([300, 65, 1], [300, 65, 1]),
    "q<kv": ([100, 7, 129], [600, 7, 400]),
    "q>kv": ([90, 5], [40, 5]),  # causal: the first 50 queries of request 0 see no key
    "empty": ([0, 80, 33], [10, 0, 200]),
}


def _ragged_problem(case, device):
    q_lens, kv_lens = _LENGTHS[case["lengths"]]
    return harness.make_ragged(q_lens, kv_lens, num_kv_heads=2, group=case["group"],
                               head_dim=case["head_dim"], dtype=case["dtype"], device=device,
                               strided=case["strided"],
                               seed=zlib.crc32(harness.case_id(case).encode()))


@pytest.mark.parametrize("case", _RAGGED_CASES, ids=harness.case_id)
def test_ragged_matches_reference_and_cpu(case):
    _check_against_reference_and_cpu("ragged", _ragged_problem, case)


# ---- the workspace contract under many launches ----


def _random_launch(rng, seed, workspace):
    """A random paged or ragged problem on the GPU, with random options; a forced
    num_splits the workspace cannot hold falls back to the planner's choice."""
    dtype = rng.choice([torch.float16, torch.bfloat16])
    head_dim = rng.choice([64, 128, 256])
    group = rng.choice([1, 2, 4, 8])
    options = dict(rng.choice(list(_OPTIONS.values())))
    options["num_splits"] = rng.choice([None, None, 1, 2, 5, 16])
    options["return_lse"] = True
    batch = rng.randint(1, 5)
    if rng.random() < 0.5:
        seq_lens = [rng.choice([0, 1, rng.randint(1, 64), rng.randint(64, 1500)])
                    for _ in range(batch)]
        q_lens = None
        if rng.random() < 0.5:
            q_lens = [min(n, rng.choice([1, 2, 4, rng.randint(1, 80)])) for n in seq_lens]
        problem = harness.make_paged(
            seq_lens, page_size=rng.choice([1, 2, 8, 16, 64, 128]), num_kv_heads=rng.randint(1, 2),
            group=group, head_dim=head_dim, dtype=dtype, device="cuda",
            kv_layout=rng.choice(["HND", "NHD"]), kv_form=rng.choice(["5d", "pair", "strided"]),
            q_lens=q_lens, seed=seed)
        if q_lens is not None:
            options["max_q_len"] = max(1, max(q_lens))
    else:
        q_lens = [rng.choice([0, 1, rng.randint(1, 40), rng.randint(40, 200)]) for _ in range(batch)]
        kv_lens = [q + rng.choice([0, 0, rng.randint(0, 300)]) for q in q_lens]
        problem = harness.make_ragged(q_lens, kv_lens, num_kv_heads=rng.randint(1, 2), group=group,
                                      head_dim=head_dim, dtype=dtype, device="cuda",
                                      strided=rng.random() < 0.3, seed=seed)
        options["max_q_len"] = max(q_lens)
    if options["num_splits"] is not None:
        total_q, num_qo_heads, _ = problem.q.shape
        needed = splitkv.required_workspace_bytes(total_q, num_qo_heads, head_dim,
                                                  options["num_splits"])
        if needed > workspace.nbytes:
            options["num_splits"] = None
    return problem, options


def test_interleaved_launches_keep_the_workspace_contract():
    launches = int(os.environ.get("SPLITKV_STRESS_LAUNCHES", "1000"))
    rng = random.Random(1234)
    workspace = splitkv.Workspace(64 << 20, "cuda")  # zeroed here, never again
    counters = workspace.counter_region()
    split_launches = 0
    kinds = {"paged": 0, "ragged": 0}
    worst = 0.0
    for i in range(launches):
        problem, options = _random_launch(rng, i, workspace)
        kinds["paged" if isinstance(problem, harness.PagedProblem) else "ragged"] += 1
        plan = problem.plan(workspace, **options)
        split_launches += plan.num_splits > 1
        results = []
        for _ in range(2):  # a re-run on re-poisoned scratch must give the same bits
            harness.fill_garbage(workspace)
            results.append(problem.run(workspace, **options))
            assert int(counters.count_nonzero()) == 0, f"launch {i}: counters not zero"
        (out, lse), (out2, lse2) = results
        harness.assert_bitwise_equal(out, out2)
        harness.assert_bitwise_equal(lse, lse2)
        expected, expected_lse = problem.reference(**options)
        harness.assert_close(out, expected, problem.dtype)
        harness.assert_lse_close(lse, expected_lse)
        worst = max(worst, _errors(out, expected)[0])
    harness.assert_counter_region_zero(workspace)
    _record("stress", "interleaved", launches=2 * launches, problems=launches,
            split_problems=split_launches, **kinds, max_abs_err=worst)
    assert split_launches > launches // 4  # the counter protocol ran often


# ---- CUDA graphs: capture once, replay with new lengths and page tables ----


def _gather_pages(cache, pages, kv_len):
    """[kv_len, num_kv_heads, head_dim] from an HND cache [num_pages, 2, H, page, D]."""
    num_kv_heads, head_dim = cache.shape[2], cache.shape[4]
    k = cache[pages.long(), 0].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, head_dim)
    v = cache[pages.long(), 1].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, head_dim)
    return k[:kv_len], v[:kv_len]


def test_cuda_graph_replays_paged_decode():
    torch.manual_seed(7)
    batch, num_kv_heads, group, head_dim, page_size, max_pages = 6, 4, 4, 128, 16, 64
    num_pages = batch * max_pages
    dtype = torch.bfloat16
    cache = torch.randn(num_pages, 2, num_kv_heads, page_size, head_dim, device="cuda").to(dtype)
    q = torch.empty(batch, num_kv_heads * group, head_dim, device="cuda", dtype=dtype)
    block_tables = torch.zeros(batch, max_pages, dtype=torch.int32, device="cuda")
    seq_lens = torch.ones(batch, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    workspace = splitkv.Workspace(64 << 20, "cuda")
    options = dict(num_splits=4, max_q_len=1)

    def step():
        return splitkv.paged_attention(q, cache, block_tables, seq_lens, workspace, out=out,
                                       return_lse=True, **options)

    def new_inputs(rng):
        q.copy_(torch.randn(q.shape, device="cuda").to(dtype))
        block_tables.copy_(torch.randperm(num_pages, device="cuda")[:batch * max_pages]
                           .view(batch, max_pages).to(torch.int32))
        lens = [rng.randint(0, max_pages * page_size) for _ in range(batch)]
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        return lens

    rng = random.Random(11)
    new_inputs(rng)
    graph, (_, lse) = harness.capture_graph(step)  # replays write this captured lse tensor
    worst = 0.0
    for replay in range(100):
        lens = new_inputs(rng)
        harness.fill_garbage(workspace)
        graph.replay()
        torch.cuda.synchronize()
        assert int(workspace.counter_region().count_nonzero()) == 0, f"replay {replay}"
        for b, kv_len in enumerate(lens):
            pages = block_tables[b, :(kv_len + page_size - 1) // page_size]
            k, v = _gather_pages(cache, pages, kv_len)
            expected, expected_lse = splitkv_reference.attention(q[b:b + 1].cpu(), k.cpu(),
                                                                 v.cpu())
            harness.assert_close(out[b:b + 1], expected, dtype)
            harness.assert_lse_close(lse[b:b + 1], expected_lse)
            worst = max(worst, _errors(out[b:b + 1], expected)[0])
    _record("graph", "paged_decode", replays=100, num_splits=4, max_abs_err=worst)


def test_cuda_graph_replays_ragged_prefill():
    torch.manual_seed(8)
    batch, num_kv_heads, group, head_dim = 3, 2, 4, 64
    total_q, total_kv, max_q_len = 240, 480, 160
    dtype = torch.float16
    q = torch.empty(total_q, num_kv_heads * group, head_dim, device="cuda", dtype=dtype)
    k = torch.empty(total_kv, num_kv_heads, head_dim, device="cuda", dtype=dtype)
    v = torch.empty_like(k)
    cu_q = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    cu_kv = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    workspace = splitkv.Workspace(64 << 20, "cuda")
    options = dict(num_splits=3, max_q_len=max_q_len)

    def step():
        return splitkv.ragged_attention(q, k, v, cu_q, cu_kv, workspace, out=out,
                                        return_lse=True, **options)

    def cut(rng, total, limit):
        """batch lengths summing to total, each <= limit."""
        while True:
            a, b = sorted(rng.sample(range(total + 1), 2))
            lens = [a, b - a, total - b]
            if max(lens) <= limit:
                return lens

    def new_inputs(rng):
        for x in (q, k, v):
            x.copy_(torch.randn(x.shape, device="cuda").to(dtype))
        q_lens = cut(rng, total_q, max_q_len)
        kv_lens = cut(rng, total_kv, total_kv)
        cu_q.copy_(harness.cu_seqlens(q_lens, "cuda"))
        cu_kv.copy_(harness.cu_seqlens(kv_lens, "cuda"))

    rng = random.Random(12)
    new_inputs(rng)
    graph, (_, lse) = harness.capture_graph(step)  # replays write this captured lse tensor
    worst = 0.0
    for replay in range(100):
        new_inputs(rng)
        harness.fill_garbage(workspace)
        graph.replay()
        torch.cuda.synchronize()
        assert int(workspace.counter_region().count_nonzero()) == 0, f"replay {replay}"
        expected, expected_lse = splitkv_reference.ragged_attention(q.cpu(), k.cpu(), v.cpu(),
                                                                    cu_q, cu_kv)
        harness.assert_close(out, expected, dtype)
        harness.assert_lse_close(lse, expected_lse)
        worst = max(worst, _errors(out, expected)[0])
    _record("graph", "ragged_prefill", replays=100, num_splits=3, max_abs_err=worst)


# ---- Back-to-back launches: each call may start while the one before it still runs ----


def _chain(q, run, outs, between=None):
    """One call a tensor of outs, each reading the previous call's output as its q (the first
    reads q); call i writes outs[i]; `between` runs after each call."""
    for out in outs:
        run(q, out)
        if between is not None:
            between()
        q = out


@pytest.mark.parametrize("kind,head_dim,num_splits", [
    ("decode", 64, None), ("decode", 64, 1), ("decode", 128, None), ("decode", 128, 1),
    ("decode", 128, 4), ("decode", 256, 3), ("decode_fp8", 128, None), ("paged_prefill", 128, None),
    ("paged_prefill", 128, 2), ("ragged_prefill", 128, None), ("ragged_prefill", 64, 2)])
def test_back_to_back_calls_read_the_previous_calls_output(kind, head_dim, num_splits):
    """On sm_90 the kernels are launched with programmatic stream serialization (launch.h
    LaunchKernel): a call's CTAs may be scheduled before the call ahead of it has completed.
    Eight calls, each taking the previous call's output as its q, captured in one CUDA graph
    and replayed (so they run back to back) must give the bits of the same calls run one at a
    time with a synchronize between them: the outputs are poisoned with NaN before each
    replay, so a call that read its q early would show. The kernel families: the decode
    kernel's split grids (planned, forced 3 or 4) and unsplit ones (forced 1), fp8 decode,
    paged and ragged prefill on the sm90 kernel (one split) and on mma.sync (forced splits).
    Since no splitkv kernel releases the next grid early, a call starts only as the previous
    one's CTAs exit, so this guards the results under PDL more than it proves where each
    kernel waits (tools/gpu/sass_pdl_check.py reads that from the SASS)."""
    steps, dtype = 8, torch.bfloat16
    if kind == "ragged_prefill":
        problem = harness.make_ragged([300, 77, 1024], [300, 77, 1024], num_kv_heads=8, group=4,
                                      head_dim=head_dim, dtype=dtype, device="cuda", seed=21)
        causal = dict(causal=True, max_q_len=1024)

        def run(q, out):
            splitkv.ragged_attention(q, problem.k, problem.v, problem.cu_seqlens_q, problem.cu_seqlens_kv,
                                     workspace, out=out, num_splits=num_splits, **causal)
    else:
        seq_lens = [2048, 37, 5000, 640] if kind != "paged_prefill" else [700, 1500]
        q_lens = [300, 900] if kind == "paged_prefill" else None
        problem = harness.make_paged(seq_lens, page_size=16, num_kv_heads=8, group=4, head_dim=head_dim,
                                     dtype=dtype, device="cuda", q_lens=q_lens, seed=22)
        kv_cache, scales = problem.kv_cache, {}
        if kind == "decode_fp8":
            kv_cache = torch.nan_to_num(kv_cache).to(torch.float8_e4m3fn)
            scales = dict(k_scale=0.5, v_scale=0.25)
        extra = dict(cu_seqlens_q=problem.cu_seqlens_q, max_q_len=max(q_lens), causal=True) if q_lens else {}

        def run(q, out):
            splitkv.paged_attention(q, kv_cache, problem.block_tables, problem.seq_lens, workspace, out=out,
                                    num_splits=num_splits, **scales, **extra)
    workspace = splitkv.Workspace(64 << 20, "cuda")
    stepwise = [torch.empty_like(problem.q) for _ in range(steps)]
    _chain(problem.q, run, stepwise, between=torch.cuda.synchronize)
    assert all(bool(torch.isfinite(o).all()) for o in stepwise)

    outs = [torch.empty_like(problem.q) for _ in range(steps)]
    graph, _ = harness.capture_graph(lambda: _chain(problem.q, run, outs))
    for replay in range(3):
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i in range(steps):
            harness.assert_bitwise_equal(outs[i], stepwise[i])
        harness.assert_counter_region_zero(workspace)
    # And eagerly, back to back (the host may or may not keep ahead of the GPU here).
    for o in outs:
        o.fill_(float("nan"))
    _chain(problem.q, run, outs)
    torch.cuda.synchronize()
    for i in range(steps):
        harness.assert_bitwise_equal(outs[i], stepwise[i])
