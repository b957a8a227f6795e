"""A dirty counter region never gives a silently wrong answer (DESIGN.md invariant 8).

Counter state the split protocol cannot leave (0xFF bytes, a count of num_splits - 1 left
on a few tiles, random bytes, bytes of an old softmax region, a published count with no
arrival) is reported, healed to zero, and the next call is right:
  - CPU: the call that meets it raises (nothing computed) after zeroing the region;
  - CUDA: the launch records it and ends (no hang); the next call on the workspace raises
    (once the GPU has run that launch), or Workspace.raise_if_error() does, after zeroing
    the region; the same after a CUDA-graph replay.
Also: exactness at extreme logits (a dominant key's v row comes back bit for bit).
"""

import pytest
import torch

import harness
import splitkv
import splitkv.workspace

_DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}
_CORRUPT = r"workspace counter region corrupted"


def _problem(kind, device, seed=0):
    # One long request beside a short one: the planner splits it (CPU: 2 threads x 4 tasks;
    # GPU: 132 SMs), and a forced split count splits both.
    if kind == "paged":
        return harness.make_paged([4096, 33], page_size=16, num_kv_heads=2, group=4, head_dim=128,
                                  dtype=_DTYPE[device], device=device, seed=seed)
    return harness.make_ragged([5, 1], [4096, 40], num_kv_heads=2, group=4, head_dim=128,
                               dtype=_DTYPE[device], device=device, seed=seed)


def _dirty(workspace, plan, pattern, generator):
    """Writes `pattern` over the counters `plan` uses (int32 view of the region)."""
    counters = workspace.counter_region().view(torch.int32)
    tiles = plan.num_tiles
    if pattern == "ff":
        counters[:tiles] = -1
    elif pattern == "count_n_minus_1":
        counters[: min(tiles, 3)] = plan.num_splits - 1
    elif pattern == "published_only":  # a published count with no arrival: 1 << 16
        counters[:tiles] = 1 << 16
    elif pattern == "random":
        counters[:tiles] = torch.randint(1, 2**31 - 1, (tiles,), generator=generator,
                                         dtype=torch.int32).to(counters.device)
    elif pattern == "old_stats":  # bytes a previous split launch left in its softmax region
        begin = plan.layout.softmax_offset
        old = workspace.tensor[begin:begin + 4 * tiles].view(torch.int32).clone()
        old[old == 0] = 1
        counters[:tiles] = old
    else:
        raise AssertionError(pattern)


PATTERNS = ["ff", "count_n_minus_1", "published_only", "random", "old_stats"]


@pytest.mark.parametrize("device", harness.DEVICES)
@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_dirty_counters_are_reported_healed_and_the_next_call_is_right(device, kind, num_splits, pattern):
    harness.require(device, _DTYPE[device], 128)
    problem = _problem(kind, device)
    workspace = splitkv.Workspace(64 << 20, device)
    plan = problem.plan(workspace, num_splits=num_splits)
    assert plan.num_splits > 1, "the problem must split for its counters to be used"
    expected, expected_lse = problem.reference()
    # A clean split call first: it fills the softmax region the "old_stats" pattern reuses.
    harness.run_and_check(problem, workspace, {}, num_splits=num_splits)
    harness.fill_garbage(workspace)
    _dirty(workspace, plan, pattern, torch.Generator().manual_seed(1))

    if device == "cpu":
        with pytest.raises(ValueError, match=rf"{kind}_attention: {_CORRUPT}: expected counter \d+ "
                           r".* nothing was computed and the counter region was reset to zero"):
            problem.run(workspace, num_splits=num_splits)
    else:
        problem.run(workspace, num_splits=num_splits)  # records the dirty counter, ends
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match=rf"{kind}_attention: {_CORRUPT}: an earlier launch on "
                           r"this workspace found counter \d+ .* holding \d+ when a split arrived"):
            problem.run(workspace, num_splits=num_splits)
        torch.cuda.synchronize()
    harness.assert_counter_region_zero(workspace)
    workspace.raise_if_error()  # nothing left to report

    # Healed: the next call is right, on poisoned scratch and a poisoned out.
    out, lse = harness.run_and_check(problem, workspace, {}, poison_out=True, num_splits=num_splits)
    harness.assert_close(out, expected, problem.dtype)
    harness.assert_lse_close(lse, expected_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("pattern", ["ff", "count_n_minus_1", "published_only"])
def test_dirty_counters_under_graph_replay(kind, pattern):
    device = "cuda"
    harness.require(device, _DTYPE[device], 128)
    problem = _problem(kind, device, seed=2)
    workspace = splitkv.Workspace(64 << 20, device)
    # max_q_len given: finding it from cu_seqlens_q would sync, which capture forbids.
    options = dict(num_splits=4, max_q_len=5) if kind == "ragged" else dict(num_splits=4)
    plan = problem.plan(workspace, **options)
    out = torch.full_like(problem.q, float("nan"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        problem.run(workspace, out=out, **options)  # warm-up outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            problem.run(workspace, out=out, **options)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    expected = problem.reference()[0]

    _dirty(workspace, plan, pattern, torch.Generator().manual_seed(3))
    graph.replay()  # must end: no hang
    with pytest.raises(ValueError, match=rf"check_workspace: {_CORRUPT}: an earlier launch"):
        workspace.raise_if_error()
    torch.cuda.synchronize()
    harness.assert_counter_region_zero(workspace)

    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    workspace.raise_if_error()
    harness.assert_close(out, expected, problem.dtype)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", harness.DEVICES)
def test_check_every_call_finds_a_counter_no_launch_uses(device, monkeypatch):
    # SPLITKV_CHECK_WORKSPACE=1 checks the whole region around every call, so even a word
    # no launch touches is found (and healed) at once.
    harness.require(device, _DTYPE[device], 128)
    monkeypatch.setattr(splitkv.workspace, "_CHECK_EVERY_CALL", True)
    problem = _problem("paged", device)
    workspace = splitkv.Workspace(64 << 20, device)
    counters = workspace.counter_region().view(torch.int32)
    last = splitkv._splitkv.kMaxCounters - 1
    counters[last] = 12345
    with pytest.raises(ValueError, match=r"paged_attention: workspace counter region not zero before "
                       rf"the call: .* the first at index {last} \(byte {4 * last}\) holding 12345; "
                       r"the region was reset to zero"):
        problem.run(workspace)
    harness.assert_counter_region_zero(workspace)
    harness.run_and_check(problem, workspace, {})


@pytest.mark.parametrize("device", harness.DEVICES)
def test_reset_zeroes_the_region(device):
    harness.require(device, backend=False)
    workspace = splitkv.Workspace(16 << 20, device)
    workspace.counter_region().fill_(0xA5)
    workspace.reset()
    if device == "cuda":
        torch.cuda.synchronize()
    harness.assert_counter_region_zero(workspace)


# ---- exactness at extreme logits ----


def _dominant_key_inputs(device, kv_len, share_row):
    """q = 64 + noise, k = -64 + noise (scaled logits about -1e4 .. -5e4, far apart): the
    softmax is one-hot on the largest logit. With share_row, a second key copies the
    dominant key and its v row (two exact maxima, p = 1 each)."""
    generator = torch.Generator().manual_seed(7)
    dtype = _DTYPE[device]
    head_dim, num_kv_heads, group = 128, 1, 4
    q = (64 + torch.randn(1, num_kv_heads * group, head_dim, generator=generator)).to(dtype)
    k = (-64 + torch.randn(kv_len, num_kv_heads, head_dim, generator=generator)).to(dtype)
    v = torch.randn(kv_len, num_kv_heads, head_dim, generator=generator).to(dtype)
    logits = torch.einsum("hd,kd->hk", q[0].double(), k[:, 0].double())
    best = logits.argmax(dim=1)
    assert bool((best == best[0]).all()), "one key must dominate every head of the group"
    best = int(best[0])
    if share_row:
        twin = (best + kv_len // 2) % kv_len
        k[twin], v[twin] = k[best], v[best]
    return q, k, v, best


@pytest.mark.parametrize("device", harness.DEVICES)
@pytest.mark.parametrize("num_splits", [1, 2, 3, 8])
@pytest.mark.parametrize("share_row", [False, True])
def test_dominant_key_gives_its_v_row_exactly_paged(device, num_splits, share_row):
    harness.require(device, _DTYPE[device], 128)
    kv_len, page_size = 512, 16
    q, k, v, best = _dominant_key_inputs(device, kv_len, share_row)
    num_pages = kv_len // page_size
    kv_cache = torch.stack([k.view(num_pages, page_size, 1, 128).transpose(1, 2),
                            v.view(num_pages, page_size, 1, 128).transpose(1, 2)], dim=1)
    block_tables = torch.arange(num_pages, dtype=torch.int32).view(1, num_pages)
    seq_lens = torch.tensor([kv_len], dtype=torch.int32)
    workspace = splitkv.Workspace(64 << 20, device)
    out = splitkv.paged_attention(q.to(device), kv_cache.contiguous().to(device), block_tables.to(device),
                                  seq_lens.to(device), workspace, num_splits=num_splits)
    want = v[best, 0].expand(4, 128)
    assert torch.equal(out[0].cpu(), want), (out[0].cpu() - want).abs().max()


@pytest.mark.parametrize("device", harness.DEVICES)
@pytest.mark.parametrize("num_splits", [1, 2, 4])
def test_one_visible_key_gives_its_v_row_exactly_ragged(device, num_splits):
    # Causal prefill: query row 0 sees key 0 alone; with splits, the other splits of its
    # tile are empty, so the merge of one non-empty split must give its partial back.
    harness.require(device, _DTYPE[device], 128)
    problem = harness.make_ragged([256], [256], num_kv_heads=2, group=4, head_dim=128,
                                  dtype=_DTYPE[device], device=device, seed=5)
    workspace = splitkv.Workspace(64 << 20, device)
    out = problem.run(workspace, num_splits=num_splits)
    assert torch.equal(out[0].cpu(), problem.v[0].repeat_interleave(4, dim=0).cpu())
    # And one split's rows are bitwise those of a one-split call wherever a row sees one split.
    single = problem.run(workspace, num_splits=1)
    harness.assert_bitwise_equal(out[:1], single[:1])
