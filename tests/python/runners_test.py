"""PagedAttentionRunner / RaggedAttentionRunner (python/splitkv/runners.py): a run gives
bitwise what the one-shot function gives for the same arguments, reads the bound index
tensors' values at every run, validates again when one of them changes shape, and refuses
what the one-shot function refuses, with its message."""

import re

import pytest
import torch

import harness
import splitkv
from harness import DEVICES
from splitkv import _calls
from splitkv import runners

_DTYPE = torch.float16


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _fresh_q(problem, seed):
    q = torch.randn(problem.q.shape, generator=torch.Generator().manual_seed(seed))
    return q.to(problem.q.dtype).to(problem.q.device)


def _paged_runner(problem, workspace, **options):
    return splitkv.PagedAttentionRunner(workspace, problem.block_tables, problem.seq_lens,
                                        **problem.kwargs(**options))


def _error(call):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    return info.type, str(info.value)


_PAGED_CASES = {
    "5d": (dict(seq_lens=[40, 17, 64], page_size=16, group=2), {}),
    "pair_nhd": (dict(seq_lens=[33, 5], page_size=16, group=4, kv_layout="NHD", kv_form="pair"),
                 {}),
    "cu_seqlens_q": (dict(seq_lens=[40, 30], page_size=16, q_lens=[3, 2]), {"max_q_len": 3}),
    "split_lse": (dict(seq_lens=[64, 50], page_size=16, group=2),
                  {"num_splits": 3, "return_lse": True}),
    "host_max_q_len": (dict(seq_lens=[40, 30], page_size=16, q_lens=[3, 2]), {}),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(_PAGED_CASES))
def test_paged_runner_equals_paged_attention(device, case):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    make, options = _PAGED_CASES[case]
    make = dict(make)
    problem = harness.make_paged(make.pop("seq_lens"), dtype=_DTYPE, device=device, **make)
    runner = _paged_runner(problem, workspace, **options)
    for seed in range(3):  # the first run validates; the next ones take the runner's path
        problem.q = _fresh_q(problem, seed)
        out = torch.full_like(problem.q, float("nan"))
        ran = _as_tuple(runner.run(problem.q, problem.kv_cache, out=out))
        assert ran[0] is out
        one_shot = _as_tuple(problem.run(workspace, out=torch.full_like(out, float("nan")),
                                         **options))
        for a, b in zip(ran, one_shot):
            assert torch.equal(a, b)
        new_out = _as_tuple(runner.run(problem.q, problem.kv_cache))
        for a, b in zip(new_out, one_shot):
            assert torch.equal(a, b)
    assert len(runner._layouts) == 2  # out given, out new
    expected = problem.reference(**options)
    harness.assert_close(out, expected[0], _DTYPE)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_runner_reads_index_values_at_every_run(device):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_paged([64, 50, 33], page_size=16, group=2, dtype=_DTYPE, device=device)
    runner = _paged_runner(problem, workspace)
    for _ in range(2):
        runner.run(problem.q, problem.kv_cache)
    # A serving step's update in place: shorter requests, and two of them swap pages.
    problem.seq_lens.copy_(torch.tensor([17, 50, 2], dtype=torch.int32))
    problem.block_tables[[0, 1]] = problem.block_tables[[1, 0]].clone()
    problem.keys[0], problem.keys[1] = problem.keys[1][:17], problem.keys[0][:50]
    problem.values[0], problem.values[1] = problem.values[1][:17], problem.values[0][:50]
    problem.keys[2], problem.values[2] = problem.keys[2][:2], problem.values[2][:2]
    ran = runner.run(problem.q, problem.kv_cache)
    assert torch.equal(ran, problem.run(workspace))
    harness.assert_close(ran, problem.reference()[0], _DTYPE)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_runner_validates_an_index_tensor_changed_in_place(device):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE, device=device)
    runner = _paged_runner(problem, workspace)
    for _ in range(2):
        runner.run(problem.q, problem.kv_cache)
    problem.seq_lens.resize_(1)  # now disagrees with block_tables' batch of 2
    expected = _error(lambda: problem.run(workspace))
    assert expected[1].startswith("paged_attention: seq_lens")
    assert _error(lambda: runner.run(problem.q, problem.kv_cache)) == expected
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_runner_refuses_what_paged_attention_refuses(device):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_paged([40, 17], page_size=16, group=2, dtype=_DTYPE, device=device)
    runner = _paged_runner(problem, workspace)
    runner.run(problem.q, problem.kv_cache)
    runner.run(problem.q, problem.kv_cache)
    # Per run: an out over q (the layout is cached: the overlap is found per call), a q of
    # another head_dim, a cache of another dtype.
    bad_runs = [
        dict(q=problem.q, kv_cache=problem.kv_cache, out=problem.q),
        dict(q=problem.q[..., :32].contiguous(), kv_cache=problem.kv_cache),
        dict(q=problem.q.float(), kv_cache=problem.kv_cache),
    ]
    for args in bad_runs:
        q, kv_cache = args.pop("q"), args.pop("kv_cache")
        expected = _error(lambda: splitkv.paged_attention(
            q, kv_cache, problem.block_tables, problem.seq_lens, workspace, **args))
        assert _error(lambda: runner.run(q, kv_cache, **args)) == expected
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("bad", [
    {"window_left": -2}, {"causal": 1}, {"num_splits": 0}, {"logits_soft_cap": -1.0},
    {"kv_layout": "XHD"}, {"kv_layout": 0}, {"return_lse": None}, {"max_q_len": 0},
    {"sm_scale": float("inf")}, {"batch_invariant": "yes"},
    # Two bad options: the refusal is the one paged_attention gives first.
    {"logits_soft_cap": -1.0, "return_lse": None}, {"max_q_len": 0, "causal": 1},
    {"sm_scale": float("nan"), "return_lse": 1},
])
def test_paged_runner_refuses_bad_options_when_made(bad):
    workspace = harness.shared_workspace("cpu")
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    expected = _error(lambda: splitkv.paged_attention(problem.q, problem.kv_cache,
                                                      problem.block_tables, problem.seq_lens,
                                                      workspace, **bad))
    made = _error(lambda: splitkv.PagedAttentionRunner(workspace, problem.block_tables,
                                                       problem.seq_lens, **bad))
    assert made == expected


def test_paged_runner_refuses_kv_offsets_without_full_seq_lens():
    workspace = harness.shared_workspace("cpu")
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    offsets = torch.zeros(2, dtype=torch.int64)  # also the wrong dtype: the pairing comes first
    expected = _error(lambda: splitkv.paged_attention(problem.q, problem.kv_cache,
                                                      problem.block_tables, problem.seq_lens,
                                                      workspace, kv_offsets=offsets))
    assert "given without the other" in expected[1]
    made = _error(lambda: splitkv.PagedAttentionRunner(workspace, problem.block_tables,
                                                       problem.seq_lens, kv_offsets=offsets))
    assert made == expected


@pytest.mark.parametrize("how", ["swap_tensors", "data"])
def test_paged_runner_sees_a_bound_tensor_replaced_in_place(how):
    """torch.utils.swap_tensors and `x.data = y` keep the object, shape and strides but
    change the dtype: the run refuses it as paged_attention does (int64 index tensors)."""
    workspace = harness.shared_workspace("cpu")
    problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE)
    runner = _paged_runner(problem, workspace)
    for _ in range(2):
        runner.run(problem.q, problem.kv_cache)
    wider = problem.seq_lens.to(torch.int64)
    if how == "swap_tensors":
        torch.utils.swap_tensors(problem.seq_lens, wider)
    else:
        problem.seq_lens.data = wider
    expected = _error(lambda: problem.run(workspace))
    assert expected[0] is TypeError and "seq_lens dtype unsupported" in expected[1]
    assert _error(lambda: runner.run(problem.q, problem.kv_cache)) == expected
    harness.assert_counter_region_zero(workspace)


def test_runner_with_a_workspace_whose_tensor_was_replaced():
    workspace = splitkv.Workspace(64 << 20, "cpu")
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    runner = _paged_runner(problem, workspace)
    for _ in range(2):
        runner.run(problem.q, problem.kv_cache)
    workspace.tensor = None
    expected = _error(lambda: problem.run(workspace))
    assert _error(lambda: runner.run(problem.q, problem.kv_cache)) == expected


@pytest.mark.parametrize("which", ["block_tables", "seq_lens"])
def test_paged_runner_refuses_bad_index_tensors_when_made(which):
    workspace = harness.shared_workspace("cpu")
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    bad = {"block_tables": problem.block_tables, "seq_lens": problem.seq_lens}
    bad[which] = bad[which].long()
    expected = _error(lambda: splitkv.paged_attention(problem.q, problem.kv_cache,
                                                      bad["block_tables"], bad["seq_lens"],
                                                      workspace))
    assert re.search(rf"^paged_attention: {which}.*int32", expected[1])
    made = _error(lambda: splitkv.PagedAttentionRunner(workspace, bad["block_tables"],
                                                       bad["seq_lens"]))
    assert made == expected


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_runner_equals_ragged_attention(device):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_ragged([30, 0, 8], [200, 3, 8], group=4, dtype=_DTYPE, device=device,
                                  strided=True)
    runner = splitkv.RaggedAttentionRunner(workspace, problem.cu_seqlens_q, problem.cu_seqlens_kv,
                                           num_splits=4, return_lse=True)
    for seed in range(3):
        problem.q = _fresh_q(problem, seed)
        out = torch.full_like(problem.q, float("nan"))
        ran = runner.run(problem.q, problem.k, problem.v, out=out)
        one_shot = problem.run(workspace, num_splits=4, return_lse=True)
        assert ran[0] is out
        assert torch.equal(ran[0], one_shot[0]) and torch.equal(ran[1], one_shot[1])
    assert len(runner._layouts) == 1
    expected, expected_lse = problem.reference()
    harness.assert_close(out, expected, _DTYPE)
    harness.assert_lse_close(ran[1], expected_lse)
    # New lengths in place (the same totals): read at the next run.
    problem.cu_seqlens_q.copy_(torch.tensor([0, 10, 20, 38], dtype=torch.int32))
    problem.cu_seqlens_kv.copy_(torch.tensor([0, 100, 150, 211], dtype=torch.int32))
    ran = runner.run(problem.q, problem.k, problem.v)
    one_shot = problem.run(workspace, num_splits=4, return_lse=True)
    assert torch.equal(ran[0], one_shot[0]) and torch.equal(ran[1], one_shot[1])
    harness.assert_close(ran[0], problem.reference()[0], _DTYPE)
    harness.assert_counter_region_zero(workspace)


def test_ragged_runner_refuses_bad_options_when_made():
    workspace = harness.shared_workspace("cpu")
    problem = harness.make_ragged([3], [3], dtype=_DTYPE)
    for bad in ({"window_left": -2}, {"max_q_len": -1}, {"causal": None}):
        expected = _error(lambda: problem.run(workspace, **bad))
        made = _error(lambda: splitkv.RaggedAttentionRunner(
            workspace, problem.cu_seqlens_q, problem.cu_seqlens_kv, **bad))
        assert made == expected


def test_runner_layouts_are_bounded(monkeypatch):
    monkeypatch.setattr(runners, "_MAX_RUNNER_LAYOUTS", 2)
    workspace = harness.shared_workspace("cpu")
    problem = harness.make_paged([40, 17], page_size=16, group=2, dtype=_DTYPE)
    runner = _paged_runner(problem, workspace)
    total_q, heads, head_dim = problem.q.shape
    # Three layouts of q: contiguous, and two views with other token strides.
    wide = torch.zeros(total_q, heads, 2 * head_dim, dtype=_DTYPE)[..., :head_dim]
    more_heads = torch.zeros(total_q, heads + 1, head_dim, dtype=_DTYPE)[:, :heads]
    sizes = []
    for q in (problem.q, wide, more_heads):
        q.copy_(problem.q)
        assert torch.equal(runner.run(q, problem.kv_cache), problem.run(workspace))
        sizes.append(len(runner._layouts))
    assert sizes == [1, 2, 1]  # full at two: emptied before the third is kept


@pytest.mark.gpu
def test_paged_runner_under_cuda_graph_replay():
    harness.require("cuda")
    workspace = splitkv.Workspace(64 << 20, "cuda")
    problem = harness.make_paged([300, 17, 1000], page_size=16, group=4, dtype=torch.bfloat16,
                                 device="cuda")
    runner = _paged_runner(problem, workspace)
    out = torch.full_like(problem.q, float("nan"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        runner.run(problem.q, problem.kv_cache, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner.run(problem.q, problem.kv_cache, out=out)
    problem.q.copy_(_fresh_q(problem, 7))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    eager = runner.run(problem.q, problem.kv_cache)
    assert torch.equal(out, eager)
    assert torch.equal(out, problem.run(workspace))
    harness.assert_close(out, problem.reference()[0], torch.bfloat16)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_runner_copies_run_as_the_original(how):
    """A runner that has run holds C++ templates: copy, deepcopy and pickle keep its bound
    arguments and drop those (a deepcopy or pickle raised TypeError on them)."""
    make = harness.copier(how)
    workspace = splitkv.Workspace(16 << 20, "cpu")
    problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE)
    runner = _paged_runner(problem, workspace, num_splits=3, return_lse=True)
    expected = runner.run(problem.q, problem.kv_cache)
    runner.run(problem.q, problem.kv_cache)
    made = make(runner)
    assert made._layouts == {} and len(runner._layouts) == 1
    for _ in range(2):
        for a, b in zip(made.run(problem.q, problem.kv_cache), expected):
            assert torch.equal(a, b)
    cu = harness.cu_seqlens([3, 5], "cpu")
    ragged = splitkv.RaggedAttentionRunner(workspace, cu, cu)
    q = torch.randn(8, 2, 64, dtype=_DTYPE)
    ran = ragged.run(q, q, q)
    assert torch.equal(make(ragged).run(q, q, q), ran)
    harness.assert_counter_region_zero(workspace)


class _Subclass(torch.Tensor):
    """A torch.Tensor subclass whose __torch_function__ (torch's default) keeps its class."""


def test_outputs_are_plain_tensors_for_a_subclass_q_on_every_path():
    """The full path allocates plain tensors; the per-call path allocated with empty_like(q),
    which returns q's subclass: the type of a result depended on whether its layout was cached."""
    workspace = harness.shared_workspace("cpu")
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    q = problem.q.as_subclass(_Subclass)
    runner = _paged_runner(problem, workspace, return_lse=True)
    for _ in range(3):
        out, lse = splitkv.paged_attention(q, problem.kv_cache, problem.block_tables,
                                           problem.seq_lens, workspace, return_lse=True)
        assert type(out) is torch.Tensor and type(lse) is torch.Tensor
        ran = runner.run(q, problem.kv_cache)
        assert [type(x) for x in ran] == [torch.Tensor, torch.Tensor]
        assert torch.equal(ran[0], out)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "send"])
def test_runner_over_a_user_buffer_copies_and_sends(how):
    """A runner over a user's aligned uint8 buffer: a deepcopy or pickle copied the buffer as
    a tensor (64-byte aligned by torch: its first run refused as misaligned, more often than
    not), and torch.multiprocessing's pickler moved the original's storage into shared memory
    (the sender's runner refused from then on). A copy now gets a new zeroed aligned buffer;
    copy.copy still shares the original's."""
    import copy
    make = harness.copier(how)
    problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE)
    for _ in range(8):
        raw = torch.zeros((16 << 20) + splitkv.WORKSPACE_ALIGNMENT, dtype=torch.uint8)
        skip = -raw.data_ptr() % splitkv.WORKSPACE_ALIGNMENT
        buffer = raw[skip:skip + (16 << 20)]
        runner = _paged_runner(problem, buffer, num_splits=3)
        expected = runner.run(problem.q, problem.kv_cache)
        made = make(runner)
        assert made._fixed[2].data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
        assert made._fixed[2].numel() == buffer.numel()
        assert torch.equal(made.run(problem.q, problem.kv_cache), expected)
        assert buffer.data_ptr() == raw.data_ptr() + skip
        assert torch.equal(runner.run(problem.q, problem.kv_cache), expected)
        assert copy.copy(runner)._fixed[2] is buffer


@pytest.mark.parametrize("shape", [(2, 8 << 20), (4, 2, 2 << 20)], ids=["2d", "3d"])
@pytest.mark.parametrize("how", ["deepcopy", "pickle", "send"])
def test_runner_over_a_user_buffer_of_any_rank_copies_and_sends(how, shape):
    """The calls take a contiguous uint8 workspace of any rank (its flat bytes), but a copy
    made a new aligned buffer for a 1-D one only: a 2-D one was copied as a tensor, bytes and
    all (64-byte aligned: its first run refused as misaligned, more often than not), and
    sending it moved the original's storage into shared memory. It now gets a new zeroed
    aligned buffer of the same shape, as a 1-D one does."""
    make = harness.copier(how)
    problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE)
    raw = torch.zeros((16 << 20) + splitkv.WORKSPACE_ALIGNMENT, dtype=torch.uint8)
    skip = -raw.data_ptr() % splitkv.WORKSPACE_ALIGNMENT
    buffer = raw[skip:skip + (16 << 20)].view(shape)
    runner = _paged_runner(problem, buffer, num_splits=3)
    expected = runner.run(problem.q, problem.kv_cache)
    buffer.view(-1)[splitkv.COUNTER_REGION_BYTES:].fill_(7)  # scratch: not copied
    made = make(runner)
    workspace = made._fixed[2]
    assert (type(workspace), workspace.shape, workspace.dtype, workspace.device) == (
        torch.Tensor, buffer.shape, torch.uint8, buffer.device)
    assert workspace.is_contiguous() and not workspace.any()
    assert workspace.data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
    assert torch.equal(made.run(problem.q, problem.kv_cache), expected)
    assert buffer.data_ptr() == raw.data_ptr() + skip
    assert torch.equal(runner.run(problem.q, problem.kv_cache), expected)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "send"])
def test_runners_sharing_a_user_buffer_share_one_new_buffer_in_a_copy(how):
    """Runners bound to one user buffer (a runner per layer group, say), copied together, got
    a new buffer each (one _NewBuffer per runner): as many buffers as runners, where runners
    bound to one Workspace share one new Workspace. They now share one, as the originals do;
    a later copy gets a buffer of its own, and one made after a resize_ has the new shape."""
    make = harness.copier(how)
    problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE)
    buffer = torch.zeros(2, 8 << 20, dtype=torch.uint8)
    other = torch.zeros(16 << 20, dtype=torch.uint8)
    runners = [_paged_runner(problem, buffer, num_splits=3), _paged_runner(problem, buffer),
               _paged_runner(problem, other)]
    made = make(runners)
    workspaces = [runner._fixed[2] for runner in made]
    assert workspaces[0] is workspaces[1] and workspaces[0].shape == (2, 8 << 20)
    assert workspaces[2].data_ptr() != workspaces[0].data_ptr()
    assert workspaces[0].data_ptr() % splitkv.WORKSPACE_ALIGNMENT == 0
    expected = problem.run(splitkv.Workspace(16 << 20, "cpu"), num_splits=3)
    assert torch.equal(made[0].run(problem.q, problem.kv_cache), expected)
    again = make(runners[:2])
    assert again[0]._fixed[2] is again[1]._fixed[2]
    assert again[0]._fixed[2].data_ptr() != workspaces[0].data_ptr()
    buffer.resize_(16 << 20)
    assert make(runners[:1])[0]._fixed[2].shape == (16 << 20,)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_runner_over_a_tensor_that_is_no_workspace_copies_it_as_it_is(how):
    """A tensor the calls refuse as a workspace is copied as a tensor, so the copy's run
    refuses it too (it is not made into a valid workspace)."""
    make = harness.copier(how)
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    for bad in (torch.zeros(2, 8 << 20, dtype=torch.uint8).t(),  # not contiguous
                torch.zeros(16 << 20, dtype=torch.int8),
                torch.zeros(2, 1 << 20, dtype=torch.uint8)):  # below the counter region
        runner = _paged_runner(problem, bad)
        made = make(runner)
        assert (made._fixed[2].shape, made._fixed[2].stride(), made._fixed[2].dtype) == (
            bad.shape, bad.stride(), bad.dtype)
        if bad.numel() >= splitkv.COUNTER_REGION_BYTES:  # refused on the torch side, as before
            assert _error(lambda: made.run(problem.q, problem.kv_cache)) == _error(
                lambda: runner.run(problem.q, problem.kv_cache))
        else:  # C++ checks alignment before size, and the copy's address is another
            with pytest.raises(ValueError,
                               match="^paged_attention: workspace (too small|misaligned)"):
                made.run(problem.q, problem.kv_cache)


def test_torch_load_maps_a_runners_new_workspace_with_its_tensors():
    """torch.load's map_location moved a runner's bound tensors but not the device of the new
    buffer made for its user workspace (a str): loaded from CUDA onto a CPU-only machine, the
    buffer was made on CUDA. The device now goes as an empty tensor, mapped like the others."""
    import io
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE)
    runner = _paged_runner(problem, torch.zeros(2, 8 << 20, dtype=torch.uint8))
    saved = io.BytesIO()
    torch.save(runner, saved)
    seen = []
    saved.seek(0)
    record = lambda storage, location: seen.append(storage.nbytes()) or storage  # noqa: E731
    made = torch.load(saved, map_location=record, weights_only=False)
    # block_tables, seq_lens, and the workspace's device (an empty tensor).
    assert sorted(seen) == sorted([problem.block_tables.nbytes, problem.seq_lens.nbytes, 0])
    assert made._fixed[2].shape == (2, 8 << 20)
    assert torch.equal(made.run(problem.q, problem.kv_cache), problem.run(made._fixed[2]))
