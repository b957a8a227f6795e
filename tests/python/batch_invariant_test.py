"""batch_invariant: a request's out and lse bits depend only on the request (issue 16).

Each test computes the same tokens in two or more ways and compares the bits with
torch.equal: alone and in random batches (L1), with other workspace sizes and CPU thread
counts (L2, threads in subprocesses: the pool reads SPLITKV_NUM_THREADS once), a prompt in
one ragged prefill and in chunks of random sizes (1 included) through paged_attention with
cu_seqlens_q (L3), and a token in a prefill, a verify chunk and a one-token decode (L4).
Lengths cross the invariant split (1024 keys on the CPU, 2048 on CUDA: several splits per
request), so split-KV is on wherever the planner splits; the values are checked against the
float64 reference too.
"""

import json
import os
import pathlib
import random
import subprocess
import sys

import pytest
import torch

import harness
import splitkv
import splitkv_reference
from harness import DEVICES

# Keys per invariant split: attention_cpu.cc, cuda/tile_config.h kInvariantSplitKeys.
SPLIT_KEYS = {"cpu": 1024, "cuda": 2048}


class Request:
    """One sequence: keys, values and a query for every position (q[t] is token t's query)."""

    def __init__(self, length, num_kv_heads, group, head_dim, dtype, generator):
        def rnd(*shape):
            return torch.randn(shape, generator=generator).to(dtype)
        self.k = rnd(length, num_kv_heads, head_dim)
        self.v = rnd(length, num_kv_heads, head_dim)
        self.q = rnd(length, num_kv_heads * group, head_dim)


def make_requests(lengths, *, num_kv_heads=2, group=2, head_dim=64, dtype=torch.bfloat16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [Request(n, num_kv_heads, group, head_dim, dtype, generator) for n in lengths]


def paged_inputs(requests, spans, *, device="cpu", page_size=16, seed=0):
    """paged_attention's arguments for `spans`: (request, kv_len, q_begin), the request's
    queries at positions q_begin .. kv_len - 1 over its first kv_len keys, in a cache whose
    pages come in a random order (unused slots NaN). Returns (args, kwargs, q_lens)."""
    generator = torch.Generator().manual_seed(seed)
    pages = [-(-kv_len // page_size) for _, kv_len, _ in spans]
    num_pages = sum(pages) + 1
    order = torch.randperm(num_pages, generator=generator).tolist()
    ref = requests[0]
    cache = torch.full((num_pages, 2, ref.k.shape[1], page_size, ref.k.shape[2]), float("nan"),
                       dtype=ref.k.dtype)
    tables = torch.full((len(spans), max(pages + [1])), order[-1], dtype=torch.int32)
    used = 0
    for b, (r, kv_len, _) in enumerate(spans):
        req = requests[r]
        for p in range(pages[b]):
            page = order[used]
            used += 1
            tables[b, p] = page
            chunk = slice(p * page_size, min(kv_len, (p + 1) * page_size))
            cache[page, 0, :, :chunk.stop - chunk.start] = req.k[chunk].transpose(0, 1)
            cache[page, 1, :, :chunk.stop - chunk.start] = req.v[chunk].transpose(0, 1)
    q = torch.cat([requests[r].q[begin:kv_len] for r, kv_len, begin in spans])
    q_lens = [kv_len - begin for _, kv_len, begin in spans]
    seq_lens = torch.tensor([kv_len for _, kv_len, _ in spans], dtype=torch.int32, device=device)
    args = (q.to(device), cache.to(device), tables.to(device), seq_lens)
    kwargs = dict(cu_seqlens_q=harness.cu_seqlens(q_lens, device), max_q_len=max(q_lens),
                  return_lse=True, batch_invariant=True)
    return args, kwargs, q_lens


def paged(requests, spans, workspace, *, device="cpu", page_size=16, seed=0, **options):
    """paged_attention over `spans` (see paged_inputs); one (out, lse) per span."""
    args, kwargs, q_lens = paged_inputs(requests, spans, device=device, page_size=page_size, seed=seed)
    out, lse = splitkv.paged_attention(*args, workspace, **kwargs, **options)
    harness.assert_counter_region_zero(workspace)
    return _unpack(out.cpu(), lse.cpu(), q_lens)


def ragged(requests, spans, workspace, *, device="cpu", **options):
    """ragged_attention over `spans` as in `paged` (keys 0 .. kv_len - 1 packed)."""
    q = torch.cat([requests[r].q[begin:kv_len] for r, kv_len, begin in spans])
    k = torch.cat([requests[r].k[:kv_len] for r, kv_len, _ in spans])
    v = torch.cat([requests[r].v[:kv_len] for r, kv_len, _ in spans])
    q_lens = [kv_len - begin for _, kv_len, begin in spans]
    out, lse = splitkv.ragged_attention(
        q.to(device), k.to(device), v.to(device), harness.cu_seqlens(q_lens, device),
        harness.cu_seqlens([kv_len for _, kv_len, _ in spans], device), workspace,
        return_lse=True, batch_invariant=True, **options)
    harness.assert_counter_region_zero(workspace)
    return _unpack(out.cpu(), lse.cpu(), q_lens)


def _unpack(out, lse, q_lens):
    results, begin = [], 0
    for n in q_lens:
        results.append((out[begin:begin + n], lse[begin:begin + n]))
        begin += n
    return results


def assert_same(a, b):
    harness.assert_bitwise_equal(a[0], b[0])
    harness.assert_bitwise_equal(a[1], b[1])


def reference(request, kv_len, begin, **options):
    opts = {k: v for k, v in options.items() if k in ("causal", "window_left", "logits_soft_cap", "sinks")}
    if opts.get("sinks") is not None:
        opts["sinks"] = opts["sinks"].cpu()
    return splitkv_reference.attention(request.q[begin:kv_len], request.k[:kv_len], request.v[:kv_len],
                                       sm_scale=request.q.shape[-1] ** -0.5, **opts)


OPTIONS = {
    "plain": {},
    "window": {"window_left": 700},
    "cap": {"logits_soft_cap": 30.0},
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,head_dim,group", [
    (torch.bfloat16, 64, 4),   # block kernels (row lanes), BF16 dot product off
    (torch.float16, 128, 1),
    (torch.float32, 40, 2),    # head_dim off the vector width: the generic path
])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_decode_alone_equals_any_batch(device, dtype, head_dim, group, option):
    """L1: one-token decodes of a request, alone and in random batches, same bits; and the
    values match the float64 reference."""
    harness.require(device, dtype, head_dim)
    rng = random.Random(hash((option, head_dim)) & 0xffff)
    lengths = [3000, 1, 1024, 1025, 2048, 700, 2900, 5]
    requests = make_requests(lengths, group=group, head_dim=head_dim, dtype=dtype, seed=head_dim)
    workspace = splitkv.Workspace(64 << 20, device)
    options = OPTIONS[option]
    alone = [paged(requests, [(r, n, n - 1)], workspace, device=device, **options)[0]
             for r, n in enumerate(lengths)]
    for r, n in enumerate(lengths):
        expected, expected_lse = reference(requests[r], n, n - 1, **options)
        harness.assert_close(alone[r][0], expected, dtype)
        harness.assert_lse_close(alone[r][1], expected_lse)
    for trial in range(4):
        members = rng.sample(range(len(lengths)), rng.randint(2, len(lengths)))
        spans = [(r, lengths[r], lengths[r] - 1) for r in members]
        for r, got in zip(members, paged(requests, spans, workspace, device=device, seed=trial, **options)):
            assert_same(got, alone[r])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("option", list(OPTIONS))
def test_prefill_chunks_verify_and_decode_agree(device, option):
    """L3 and L4: every token of a prompt gets the same bits from one ragged prefill (alone
    and beside other prompts), from paged chunks of random sizes (1 included) over the
    paged cache, from a speculative verify of 3 tokens and from a one-token decode."""
    harness.require(device)
    check_prefill_chunks_verify_and_decode(device, OPTIONS[option])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,head_dim,group,page_size,option", [
    (torch.bfloat16, 128, 4, 16, "plain"),
    (torch.float16, 64, 8, 16, "window"),
    (torch.bfloat16, 128, 2, 4, "cap"),      # pages under 8 slots: decode tiles by row copies
    (torch.bfloat16, 128, 2, 4, "window"),   # ... and their rows below the window's first key zeroed
    (torch.bfloat16, 64, 4, 64, "sinks"),
    (torch.float16, 128, 16, 8, "window"),
    (torch.bfloat16, 256, 4, 16, "plain"),   # head_dim 256: decode tiles for every call
    (torch.bfloat16, 128, 3, 16, "plain"),   # a group the wgmma kernel declines
])
def test_prefill_and_decode_kernels_agree_cuda(dtype, head_dim, group, page_size, option):
    """L3 and L4 on CUDA across its kernels: ragged and paged prefills of more than one split
    (the wgmma kernel, which merges a tile's splits itself), chunks, verifies and decodes (the
    decode kernel's wgmma-order path, by tensor copies or row copies) give the same bits."""
    harness.require("cuda", dtype, head_dim)
    options = dict(OPTIONS.get(option, {}))
    if option == "sinks":
        options["sinks"] = torch.randn(2 * group, generator=torch.Generator().manual_seed(3)).to("cuda")
    check_prefill_chunks_verify_and_decode("cuda", options, dtype=dtype, head_dim=head_dim, group=group,
                                           page_size=page_size)


def check_prefill_chunks_verify_and_decode(device, options, *, dtype=torch.bfloat16, head_dim=64, group=4,
                                           page_size=16):
    lengths = [2600, 300, 1100]
    requests = make_requests(lengths, group=group, head_dim=head_dim, dtype=dtype, seed=7)
    workspace = splitkv.Workspace((512 if device == "cuda" else 256) << 20, device)
    harness.fill_garbage(workspace)
    n = lengths[0]
    whole = ragged(requests, [(0, n, 0)], workspace, device=device, **options)[0]
    expected, expected_lse = reference(requests[0], n, 0, **options)
    harness.assert_close(whole[0], expected, dtype)
    harness.assert_lse_close(whole[1], expected_lse)
    # Beside other prompts, first or last.
    beside = ragged(requests, [(1, 300, 0), (0, n, 0), (2, 1100, 0)], workspace, device=device, **options)
    assert_same(beside[1], whole)
    # Chunks of random sizes through paged_attention, some of them 1 token.
    rng = random.Random(11)
    outs, lses, begin = [], [], 0
    while begin < n:
        size = rng.choice([1, 1, 2, 7, 64, 129, 300, 1024])
        end = min(n, begin + size)
        # The chunk rides with a decode of another request, as in a serving step.
        got = paged(requests, [(2, 1100, 1099), (0, end, begin)], workspace, device=device,
                    seed=begin, page_size=page_size, **options)[1]
        outs.append(got[0])
        lses.append(got[1])
        begin = end
    assert_same((torch.cat(outs), torch.cat(lses)), whole)
    # A verify of 3 tokens and one-token decodes, at split edges and inside splits.
    for t in [0, 1, 63, 64, 1023, 1024, 1025, 2047, 2048, 2599]:
        decode = paged(requests, [(0, t + 1, t)], workspace, device=device, page_size=page_size, **options)[0]
        assert_same(decode, (whole[0][t:t + 1], whole[1][t:t + 1]))
        if t >= 2:
            verify = paged(requests, [(1, 300, 299), (0, t + 1, t - 2)], workspace, device=device,
                           page_size=page_size, **options)[1]
            assert_same(verify, (whole[0][t - 2:t + 1], whole[1][t - 2:t + 1]))


@pytest.mark.gpu
@pytest.mark.parametrize("length,group,head_dim", [
    (32 * SPLIT_KEYS["cuda"] + 232, 4, 128),  # 33 splits: the decode merge's register path (> 32)
    (12 * SPLIT_KEYS["cuda"] + 712, 16, 64),  # 13 splits of 16-row tiles: past the merge's shared memory
])
def test_long_decode_matches_prefill_rows_cuda(length, group, head_dim):
    """L4 where the decode's merging CTA folds its splits from the workspace in registers (not
    shared memory): a decode of the last token, and a verify of the last 3 (decode tiles at
    group 4; the paged wgmma kernel at group 16), against the same rows of a ragged prefill of
    the prompt's tail over all its keys (the wgmma kernel folding its splits)."""
    harness.require("cuda", torch.bfloat16, head_dim)
    requests = make_requests([length], group=group, head_dim=head_dim, seed=length)
    workspace = splitkv.Workspace(64 << 20, "cuda")
    harness.fill_garbage(workspace)
    tail = 20
    rows = ragged(requests, [(0, length, length - tail)], workspace, device="cuda")[0]
    expected, expected_lse = reference(requests[0], length, length - tail)
    harness.assert_close(rows[0], expected, torch.bfloat16)
    harness.assert_lse_close(rows[1], expected_lse)
    decode = paged(requests, [(0, length, length - 1)], workspace, device="cuda")[0]
    assert_same(decode, (rows[0][-1:], rows[1][-1:]))
    verify = paged(requests, [(0, length, length - 3)], workspace, device="cuda")[0]
    assert_same(verify, (rows[0][-3:], rows[1][-3:]))


@pytest.mark.gpu
def test_decode_grid_of_three_to_four_ctas_an_sm_cuda():
    """L1 across head_dim 64's two invariant decode shapes (cuda/attention_launch.cuh
    D64TwoPerSmGrid): a batch whose grid holds more than 3 and at most 4 CTAs an SM runs
    the two-an-SM shape, each of its requests alone the three-an-SM one. Every request's out
    and lse bits agree, the batch matches the float64 reference, and the batch replayed from
    a CUDA graph gives the eager bits."""
    harness.require("cuda", torch.bfloat16, 64)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    # 4 splits a request (3 x 2048 + 1 .. + 299 keys) x 2 kv heads: 8 CTAs a request.
    batch = 7 * sms // 16
    assert 3 * sms < 8 * batch <= 4 * sms
    rng = random.Random(sms)
    lengths = [rng.randrange(3 * SPLIT_KEYS["cuda"] + 1, 3 * SPLIT_KEYS["cuda"] + 300) for _ in range(batch)]
    problem = harness.make_paged(lengths, page_size=16, group=4, head_dim=64, dtype=torch.bfloat16,
                                 device="cuda", seed=batch)
    workspace = splitkv.Workspace(64 << 20, "cuda")
    harness.fill_garbage(workspace)
    whole = harness.run_and_check(problem, workspace, dict(batch_invariant=True), poison_out=True)
    for i in range(batch):
        alone = splitkv.paged_attention(problem.q[i:i + 1], problem.kv_cache, problem.block_tables[i:i + 1],
                                        problem.seq_lens[i:i + 1], workspace, return_lse=True,
                                        batch_invariant=True)
        assert_same(alone, (whole[0][i:i + 1], whole[1][i:i + 1]))
    harness.assert_counter_region_zero(workspace)
    # L5 on the two-an-SM shape: the batch replayed from a CUDA graph (the torch op) gives
    # the eager bits, twice over (the counters the first replay left must be zero).
    args = (problem.q, problem.kv_cache, problem.block_tables, problem.seq_lens, workspace)
    out = torch.full_like(problem.q, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = splitkv.ops.paged_attention(*args, out=out, return_lse=True, batch_invariant=True,
                                               kv_layout=problem.kv_layout)
    for _ in range(2):
        out.fill_(float("nan"))
        captured[1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_same(captured, whole)
        harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_workspace_size_and_plan_do_not_change_bits(device):
    """L2: the smallest workspace (no room for split partials: every tile runs its splits in
    its own task) and a large one (split tasks merged through the workspace) give the same
    bits on the CPU, and on CUDA for the calls the wgmma prefill kernel serves (it folds a
    tile's splits in its CTA); CUDA refuses the small one for decode tiles (split CTAs merge
    through the workspace) and for prefills the wgmma kernel does not serve (pages of 4).
    The plan splits long KV at small batch, and a forced num_splits is refused."""
    harness.require(device)
    lengths = [3000, 2000]
    requests = make_requests(lengths, seed=3)
    large = splitkv.Workspace(64 << 20, device)
    small = splitkv.Workspace(splitkv.COUNTER_REGION_BYTES, device)
    harness.fill_garbage(large)
    spans = [(0, 3000, 2999), (1, 2000, 1999)]
    a = paged(requests, spans, large, device=device)
    q = requests[0].q[:1].to(device)
    k, v = requests[0].k.to(device), requests[0].v.to(device)
    cu_q, cu_kv = harness.cu_seqlens([1], device), harness.cu_seqlens([3000], device)
    plan = splitkv.plan_ragged_attention(q, k, v, cu_q, cu_kv, large, batch_invariant=True)
    keys = SPLIT_KEYS[device]
    assert (plan.num_splits, plan.invariant_split_keys) == (-(-3000 // keys), keys)
    assert splitkv.plan_ragged_attention(q, k, v, cu_q, cu_kv, large).invariant_split_keys == 0
    with pytest.raises(ValueError, match="num_splits conflicts with batch_invariant: expected None"):
        splitkv.ragged_attention(q, k, v, cu_q, cu_kv, large, num_splits=2, batch_invariant=True)
    if device == "cuda":
        # Decode tiles split across CTAs: a workspace without room for the partials is refused.
        with pytest.raises(ValueError, match="workspace too small: need .* for batch_invariant"):
            paged(requests, spans, small, device=device)
        harness.assert_counter_region_zero(small)
        # Prefill-sized calls (1000 rows) on the wgmma kernel need no partials: the same bits.
        chunks = [(0, 3000, 2500), (1, 2000, 1500)]
        for x, y in zip(paged(requests, chunks, large, device=device), paged(requests, chunks, small, device=device)):
            assert_same(x, y)
        prefill_a = ragged(requests, [(0, 3000, 2500)], large, device=device)
        prefill_b = ragged(requests, [(0, 3000, 2500)], small, device=device)
        assert_same(prefill_a[0], prefill_b[0])
        q500 = requests[0].q[2500:3000].to(device)
        cu_q500 = harness.cu_seqlens([500], device)
        plan = splitkv.plan_ragged_attention(q500, k, v, cu_q500, cu_kv, small, batch_invariant=True)
        assert (plan.num_splits, plan.invariant_split_keys) == (1, keys)
        plan = splitkv.plan_ragged_attention(q500, k, v, cu_q500, cu_kv, large, batch_invariant=True)
        assert (plan.num_splits, plan.invariant_split_keys) == (-(-3000 // keys), keys)
        # Pages of 4 slots: the wgmma kernel declines them (its page boxes take 8 or more), and
        # the decode kernel's split CTAs need the partials.
        with pytest.raises(ValueError, match="workspace too small: need .* for batch_invariant"):
            paged(requests, chunks, small, device=device, page_size=4)
        harness.assert_counter_region_zero(small)
        harness.assert_counter_region_zero(large)
        return
    b = paged(requests, spans, small, device=device)
    for x, y in zip(a, b):
        assert_same(x, y)
    prefill_a = ragged(requests, [(0, 3000, 2500)], large, device=device)
    prefill_b = ragged(requests, [(0, 3000, 2500)], small, device=device)
    assert_same(prefill_a[0], prefill_b[0])
    plan = splitkv.plan_ragged_attention(q, k, v, cu_q, cu_kv, small, batch_invariant=True)
    assert (plan.num_splits, plan.invariant_split_keys) == (1, keys)
    harness.assert_counter_region_zero(large)


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_each_cpu_build_is_invariant(isa, monkeypatch):
    """Every CPU kernel build keeps the guarantee on its own (bits differ between builds)."""
    monkeypatch.setenv("SPLITKV_CPU_ISA", isa)
    lengths = [2100, 1500, 9]
    requests = make_requests(lengths, group=4, seed=5)
    workspace = splitkv.Workspace(64 << 20, "cpu")
    whole = ragged(requests, [(0, 2100, 0)], workspace)[0]
    chunked = [paged(requests, [(1, 1500, 1499), (0, end, begin)], workspace)[1]
               for begin, end in [(0, 1), (1, 1030), (1030, 2099), (2099, 2100)]]
    assert_same((torch.cat([c[0] for c in chunked]), torch.cat([c[1] for c in chunked])), whole)
    alone = paged(requests, [(1, 1500, 1499)], workspace)[0]
    batch = paged(requests, [(2, 9, 8), (1, 1500, 1499), (0, 2100, 2099)], workspace)
    assert_same(batch[1], alone)
    assert_same(batch[2], (whole[0][-1:], whole[1][-1:]))


_THREADS_SCRIPT = """
import json, sys, torch
sys.path[:0] = json.loads(sys.argv[2])
import conftest  # makes splitkv importable outside Bazel too
import batch_invariant_test as t
torch.save(t.thread_probe(), sys.argv[1])
"""


def thread_probe():
    """Results of a fixed set of calls, for the thread-count test's subprocesses."""
    lengths = [2600, 1200, 40]
    requests = make_requests(lengths, group=4, seed=9)
    workspace = splitkv.Workspace(64 << 20, "cpu")
    spans = [(0, 2600, 2599), (1, 1200, 1100), (2, 40, 0)]
    return paged(requests, spans, workspace) + ragged(requests, spans, workspace)


def test_thread_count_does_not_change_bits(tmp_path):
    """L2: 1, 2, 3 and 7 pool threads (SPLITKV_NUM_THREADS, read once per process) give the
    same bits as this process."""
    here = thread_probe()
    for threads in [1, 2, 3, 7]:
        path = tmp_path / f"threads{threads}.pt"
        env = dict(os.environ, SPLITKV_NUM_THREADS=str(threads))
        paths = [str(pathlib.Path(__file__).parent)] + sys.path
        subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(path), json.dumps(paths)],
                       env=env, check=True)
        there = torch.load(path)
        assert len(there) == len(here)
        for a, b in zip(there, here):
            assert_same(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 128), (torch.float16, 64), (torch.bfloat16, 256)])
def test_cuda_graph_replay_and_torch_op_match_eager(dtype, head_dim):
    """L5: a batch captured in a CUDA graph (through the torch op) and replayed gives each
    request the bits of its eager decode alone; so does the op outside a graph."""
    harness.require("cuda", dtype, head_dim)
    lengths = [3000, 1500, 40, 2049]
    requests = make_requests(lengths, group=4, head_dim=head_dim, dtype=dtype, seed=13)
    workspace = splitkv.Workspace(64 << 20, "cuda")
    alone = [paged(requests, [(r, n, n - 1)], workspace, device="cuda")[0] for r, n in enumerate(lengths)]
    spans = [(r, n, n - 1) for r, n in enumerate(lengths)][::-1]
    args, kwargs, q_lens = paged_inputs(requests, spans, device="cuda", seed=5)
    out = torch.empty_like(args[0])
    eager = splitkv.ops.paged_attention(*args, workspace, out=out, **kwargs)
    for got, (r, _, _) in zip(_unpack(eager[0].cpu(), eager[1].cpu(), q_lens), spans):
        assert_same(got, alone[r])
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = splitkv.ops.paged_attention(*args, workspace, out=out, **kwargs)
    graph.replay()
    torch.cuda.synchronize()
    harness.assert_counter_region_zero(workspace)
    for got, (r, _, _) in zip(_unpack(captured[0].cpu(), captured[1].cpu(), q_lens), spans):
        assert_same(got, alone[r])


def test_torch_op_matches_eager_cpu():
    """The torch op (splitkv.ops) passes batch_invariant through: same bits as the eager call."""
    lengths = [2100, 33]
    requests = make_requests(lengths, seed=17)
    workspace = splitkv.Workspace(64 << 20, "cpu")
    spans = [(0, 2100, 2000), (1, 33, 32)]
    args, kwargs, q_lens = paged_inputs(requests, spans)
    via_op = splitkv.ops.paged_attention(*args, workspace, **kwargs)
    eager = splitkv.paged_attention(*args, workspace, **kwargs)
    default = splitkv.ops.paged_attention(*args, workspace, **dict(kwargs, batch_invariant=False))
    assert_same(via_op, eager)
    assert not torch.equal(via_op[0], default[0])  # the keyword reached the kernels
    prefill = splitkv.ops.ragged_attention(
        requests[0].q, requests[0].k, requests[0].v, harness.cu_seqlens([2100], "cpu"),
        harness.cu_seqlens([2100], "cpu"), workspace, return_lse=True, batch_invariant=True)
    assert_same((via_op[0][:100], via_op[1][:100]), (prefill[0][2000:], prefill[1][2000:]))
