"""Bad input: each refused call names the argument, the value and the expectation, leaves
the counter region zero, and a following valid call on the same workspace is right."""

import re

import pytest
import torch

import harness
import splitkv
from harness import DEVICES

_DTYPE = torch.float16
_PAGE_SIZE = 16
_SEQ_LENS = [37, 16, 5]        # max_pages_per_seq = 3 + 1 padding column = 4 -> capacity 64
_CAPACITY = 4 * _PAGE_SIZE

_PROBLEMS = {}


def _valid(device, kind):
    """A valid paged or ragged problem and its expected output (built once per device)."""
    if (device, kind) not in _PROBLEMS:
        if kind == "paged":
            problem = harness.make_paged(_SEQ_LENS, page_size=_PAGE_SIZE, group=2, head_dim=64,
                                         dtype=_DTYPE, device=device, seed=1)
        else:
            problem = harness.make_ragged([5, 0, 9], [40, 3, 9], group=2, head_dim=64,
                                          dtype=_DTYPE, device=device, seed=2)
        _PROBLEMS[device, kind] = (problem, problem.reference()[0])
    return _PROBLEMS[device, kind]


def _aligned_buffer(nbytes, device, offset=0):
    raw = torch.zeros(nbytes + 512, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % 256 + offset
    return raw[skip:skip + nbytes]


def _without_tensor(device):
    """A Workspace whose tensor attribute was set to None (the message names the attribute,
    not the Workspace, whose type is the one expected)."""
    workspace = splitkv.Workspace(8 << 20, device)
    workspace.tensor = None
    return workspace


def _other_device(device):
    return "meta" if device == "cpu" else "cpu"


def _paged_call(p, ws, **changes):
    """paged_attention with some arguments replaced."""
    args = dict(q=p.q, kv_cache=p.kv_cache, block_tables=p.block_tables, seq_lens=p.seq_lens,
                workspace=ws, cu_seqlens_q=p.cu_seqlens_q, kv_layout=p.kv_layout)
    args.update(changes)
    return splitkv.paged_attention(
        args.pop("q"), args.pop("kv_cache"), args.pop("block_tables"), args.pop("seq_lens"),
        args.pop("workspace"), **args)


def _ragged_call(p, ws, **changes):
    args = dict(q=p.q, k=p.k, v=p.v, cu_seqlens_q=p.cu_seqlens_q, cu_seqlens_kv=p.cu_seqlens_kv,
                workspace=ws)
    args.update(changes)
    return splitkv.ragged_attention(
        args.pop("q"), args.pop("k"), args.pop("v"), args.pop("cu_seqlens_q"),
        args.pop("cu_seqlens_kv"), args.pop("workspace"), **args)


def _edited(t, index, value):
    t = t.clone()
    t[index] = value
    return t


def _int64(t):
    return t.to(torch.int64)


# (id, error, message regex, call(problem, workspace, device), cpu_only). cpu_only: the
# check reads index values, which the CUDA backend does not (they stay on the device).
PAGED_CASES = [
    ("workspace_too_small", ValueError,
     r"paged_attention: workspace too small: need at least 8388608 bytes \(the counter "
     r"region\), got 4194304",
     lambda p, ws, d: _paged_call(p, _aligned_buffer(4 << 20, d)), False),
    ("forced_splits_do_not_fit", ValueError,
     r"paged_attention: workspace too small: need {need} bytes for num_splits=4, got 8388608; "
     r"pass a larger workspace or let the planner choose num_splits",
     lambda p, ws, d: _paged_call(p, _aligned_buffer(8 << 20, d), num_splits=4), False),
    ("workspace_misaligned", ValueError,
     r"paged_attention: workspace misaligned: expected a base address aligned to 256 bytes, "
     r"got address % 256 = 1",
     lambda p, ws, d: _paged_call(p, _aligned_buffer(16 << 20, d, offset=1)), False),
    ("workspace_dtype", TypeError,
     r"paged_attention: workspace dtype unsupported: expected torch.uint8, got torch.int8",
     lambda p, ws, d: _paged_call(p, ws.tensor.view(torch.int8)), False),
    ("workspace_type", TypeError,
     r"paged_attention: workspace has the wrong type: expected a splitkv.Workspace or a uint8 "
     r"torch.Tensor, got int",
     lambda p, ws, d: _paged_call(p, 1 << 24), False),
    ("workspace_tensor_type", TypeError,
     r"paged_attention: workspace.tensor has the wrong type: expected a uint8 torch.Tensor, "
     r"got NoneType",
     lambda p, ws, d: _paged_call(p, _without_tensor(d)), False),
    ("q_dtype", TypeError,
     r"paged_attention: q dtype unsupported: expected torch.float16, torch.bfloat16 or "
     r"torch.float32, got torch.float64",
     lambda p, ws, d: _paged_call(p, ws, q=p.q.double()), False),
    ("kv_dtype", TypeError,
     r"paged_attention: kv_cache dtype mismatch: expected torch.float16 \(the dtype of q\), "
     r"got torch.bfloat16",
     lambda p, ws, d: _paged_call(p, ws, kv_cache=p.kv_cache.bfloat16()), False),
    ("block_tables_device", ValueError,
     r"paged_attention: block_tables device mismatch: expected {device} \(q's device\), got "
     r"{other}; move block_tables to {device}",
     lambda p, ws, d: _paged_call(p, ws, block_tables=p.block_tables.to(_other_device(d))), False),
    ("kv_cache_device", ValueError,
     r"paged_attention: kv_cache device mismatch: expected {device} \(q's device\), got {other}",
     lambda p, ws, d: _paged_call(p, ws, kv_cache=p.kv_cache.to(_other_device(d))), False),
    ("heads_not_multiple", ValueError,
     r"paged_attention: num_qo_heads is not a multiple of num_kv_heads: expected a multiple "
     r"of 2, got 3",
     lambda p, ws, d: _paged_call(p, ws, q=p.q[:, :3]), False),
    ("head_dim_mismatch", ValueError,
     r"paged_attention: kv_cache head_dim mismatch: expected 32 \(q.shape\[2\]\), got 64",
     lambda p, ws, d: _paged_call(p, ws, q=p.q[..., :32]), False),
    ("page_id_too_large", ValueError,
     r"paged_attention: block_tables\[1\]\[0\] \(a page id\) out of range: expected a value in "
     r"\[0, {num_pages}\), got {num_pages}",
     lambda p, ws, d: _paged_call(p, ws, block_tables=_edited(p.block_tables, (1, 0),
                                                              p.kv_cache.shape[0])), True),
    ("page_id_negative", ValueError,
     r"paged_attention: block_tables\[2\]\[0\] \(a page id\) out of range: expected a value in "
     r"\[0, {num_pages}\), got -1",
     lambda p, ws, d: _paged_call(p, ws, block_tables=_edited(p.block_tables, (2, 0), -1)), True),
    ("seq_len_past_capacity", ValueError,
     rf"paged_attention: seq_lens\[0\] out of range: expected a length in \[0, {_CAPACITY}\] "
     rf"\(max_pages_per_seq \* page_size\), got {_CAPACITY + 1}",
     lambda p, ws, d: _paged_call(p, ws, seq_lens=_edited(p.seq_lens, 0, _CAPACITY + 1)), True),
    ("seq_lens_batch", ValueError,
     r"paged_attention: seq_lens.shape\[0\] mismatch: expected 3 \(batch_size, "
     r"block_tables.shape\[0\]\), got 2",
     lambda p, ws, d: _paged_call(p, ws, seq_lens=p.seq_lens[:2]), False),
    ("total_q_batch", ValueError,
     r"paged_attention: total_q mismatch: expected batch_size \(one token per request\) = 3, "
     r"got 2",
     lambda p, ws, d: _paged_call(p, ws, q=p.q[:2]), False),
    ("cu_seqlens_q_batch", ValueError,
     r"paged_attention: cu_seqlens_q.shape\[0\] mismatch: expected 4 \(batch_size \+ 1, "
     r"block_tables.shape\[0\] \+ 1\), got 3",
     lambda p, ws, d: _paged_call(p, ws, cu_seqlens_q=harness.cu_seqlens([1, 2], d)), False),
    ("cu_seqlens_q_start", ValueError,
     r"paged_attention: cu_seqlens_q\[0\] is not 0: expected 0, got 1",
     lambda p, ws, d: _paged_call(p, ws, cu_seqlens_q=torch.tensor(
         [1, 1, 2, 3], dtype=torch.int32, device=d)), True),
    ("cu_seqlens_q_decreasing", ValueError,
     r"paged_attention: cu_seqlens_q decreases at index 2: expected a non-decreasing prefix "
     r"sum \(>= 2\), got 1",
     lambda p, ws, d: _paged_call(p, ws, cu_seqlens_q=torch.tensor(
         [0, 2, 1, 3], dtype=torch.int32, device=d)), True),
    ("cu_seqlens_q_end", ValueError,
     r"paged_attention: cu_seqlens_q\[batch_size\] does not match total_q: expected 3, got 4",
     lambda p, ws, d: _paged_call(p, ws, cu_seqlens_q=harness.cu_seqlens([1, 1, 2], d)), True),
    ("max_q_len_too_small", ValueError,
     r"paged_attention: max_q_len is below the longest query: expected >= 2, got 1",
     lambda p, ws, d: _paged_call(p, ws, q=torch.cat([p.q, p.q[:1]]),
                                  cu_seqlens_q=harness.cu_seqlens([2, 1, 1], d), max_q_len=1),
     True),
    ("block_tables_int64", TypeError,
     r"paged_attention: block_tables dtype unsupported: expected torch.int32, got torch.int64; "
     r"pass block_tables.to\(torch.int32\)",
     lambda p, ws, d: _paged_call(p, ws, block_tables=_int64(p.block_tables)), False),
    ("seq_lens_int64", TypeError,
     r"paged_attention: seq_lens dtype unsupported: expected torch.int32, got torch.int64",
     lambda p, ws, d: _paged_call(p, ws, seq_lens=_int64(p.seq_lens)), False),
    ("cu_seqlens_q_int64", TypeError,
     r"paged_attention: cu_seqlens_q dtype unsupported: expected torch.int32, got torch.int64",
     lambda p, ws, d: _paged_call(p, ws, cu_seqlens_q=_int64(harness.cu_seqlens([1, 1, 1], d))),
     False),
    ("kv_layout", ValueError,
     r"paged_attention: kv_layout unknown: expected 'HND' or 'NHD', got 'HDN'",
     lambda p, ws, d: _paged_call(p, ws, kv_layout="HDN"), False),
    ("block_tables_overlapping_rows", ValueError,
     r"paged_attention: block_tables.stride\(0\) out of range: expected 0 \(one row for every "
     r"request\) or >= max_pages_per_seq = \d+ \(rows that do not overlap\), got 1",
     lambda p, ws, d: _paged_call(p, ws, block_tables=p.block_tables.flatten().as_strided(
         p.block_tables.shape, (1, 1))), False),
    ("kv_layout_type", TypeError,
     r"paged_attention: kv_layout has the wrong type: expected a str, 'HND' or 'NHD', got NoneType",
     lambda p, ws, d: _paged_call(p, ws, kv_layout=None), False),
    ("kv_cache_rank", ValueError,
     r"paged_attention: kv_cache has the wrong number of dimensions: expected a 5-D tensor "
     r"\[num_pages, 2, num_kv_heads, page_size, head_dim\] \(HND\), got shape",
     lambda p, ws, d: _paged_call(p, ws, kv_cache=p.kv_cache[:, 0]), False),
    ("kv_pair_shapes", ValueError,
     r"paged_attention: kv_cache\[1\] shape mismatch: expected .* \(the shape of kv_cache\[0\]\)",
     lambda p, ws, d: _paged_call(p, ws, kv_cache=(p.kv_cache[:, 0], p.kv_cache[:-1, 1])), False),
    ("kv_head_dim_stride", ValueError,
     r"paged_attention: kv_cache.stride\(-1\) is not 1: expected 1 \(a dense last dimension\), "
     r"got 2; pass kv_cache.contiguous\(\)",
     lambda p, ws, d: _paged_call(p, ws, q=p.q[..., :32], kv_cache=p.kv_cache[..., ::2]), False),
    ("num_splits_zero", ValueError,
     r"paged_attention: num_splits out of range: expected None \(the planner chooses\) or an "
     r"int >= 1, got 0",
     lambda p, ws, d: _paged_call(p, ws, num_splits=0), False),
    ("window_left", ValueError,
     r"paged_attention: window_left out of range: expected -1 \(no window\) or an int >= 0, "
     r"got -2",
     lambda p, ws, d: _paged_call(p, ws, window_left=-2), False),
    ("soft_cap", ValueError,
     r"paged_attention: logits_soft_cap out of range: expected a finite value >= 0 \(0 "
     r"disables it\), got -1$",
     lambda p, ws, d: _paged_call(p, ws, logits_soft_cap=-1.0), False),
    ("out_shape", ValueError,
     r"paged_attention: out shape mismatch: expected \(3, 4, 64\) \(the shape of q\), got "
     r"\(3, 4, 32\)",
     lambda p, ws, d: _paged_call(p, ws, out=torch.empty(3, 4, 32, dtype=_DTYPE, device=d)), False),
    ("out_dtype", TypeError,
     r"paged_attention: out dtype mismatch: expected torch.float16 \(the dtype of q\), got "
     r"torch.float32",
     lambda p, ws, d: _paged_call(p, ws, out=torch.empty(3, 4, 64, device=d)), False),
    ("q_not_a_tensor", TypeError,
     r"paged_attention: q has the wrong type: expected a torch.Tensor, got list",
     lambda p, ws, d: _paged_call(p, ws, q=[1.0]), False),
    ("out_overlaps_q", ValueError,
     r"paged_attention: out overlaps q: expected a tensor sharing no byte with q, got out "
     r"bytes \[0, 1536\) within q's span; attention is not computed in place",
     lambda p, ws, d: _paged_call(p, ws, out=p.q), False),
    ("out_rows_overlap", ValueError,
     r"paged_attention: out strides overlap: expected rows of head_dim = 64 elements that "
     r"share no element, got out_stride_token = 64, out_stride_head = 0",
     lambda p, ws, d: _paged_call(p, ws, out=torch.empty(3, 1, 64, dtype=p.q.dtype,
                                                          device=d).expand(3, 4, 64)), False),
    ("logits_soft_cap_below_float32", ValueError,
     r"paged_attention: logits_soft_cap outside float32's normal range: expected 0 or a "
     r"magnitude in \[1.2e-38, 3.4e38\], got 1e-46",
     lambda p, ws, d: _paged_call(p, ws, logits_soft_cap=1e-46), False),
]

RAGGED_CASES = [
    ("workspace_too_small", ValueError,
     r"ragged_attention: workspace too small: need at least 8388608 bytes \(the counter "
     r"region\), got 8388352",
     lambda p, ws, d: _ragged_call(p, _aligned_buffer((8 << 20) - 256, d)), False),
    ("forced_splits_do_not_fit", ValueError,
     r"ragged_attention: workspace too small: need {need} bytes for num_splits=4, got 8388608",
     lambda p, ws, d: _ragged_call(p, _aligned_buffer(8 << 20, d), num_splits=4), False),
    ("workspace_misaligned", ValueError,
     r"ragged_attention: workspace misaligned: expected a base address aligned to 256 bytes, "
     r"got address % 256 = 64",
     lambda p, ws, d: _ragged_call(p, _aligned_buffer(16 << 20, d, offset=64)), False),
    ("k_dtype", TypeError,
     r"ragged_attention: k dtype mismatch: expected torch.float16 \(the dtype of q\), got "
     r"torch.float32",
     lambda p, ws, d: _ragged_call(p, ws, k=p.k.float()), False),
    ("v_device", ValueError,
     r"ragged_attention: v device mismatch: expected {device} \(q's device\), got {other}",
     lambda p, ws, d: _ragged_call(p, ws, v=p.v.to(_other_device(d))), False),
    ("workspace_device", ValueError,
     r"ragged_attention: workspace device mismatch: expected {device} \(q's device\), got "
     r"{other}",
     lambda p, ws, d: _ragged_call(p, ws.tensor.to(_other_device(d))), False),
    ("heads_not_multiple", ValueError,
     r"ragged_attention: num_qo_heads is not a multiple of num_kv_heads: expected a multiple "
     r"of 2, got 5",
     lambda p, ws, d: _ragged_call(p, ws, q=torch.cat([p.q, p.q[:, :1]], dim=1)), False),
    ("head_dim_mismatch", ValueError,
     r"ragged_attention: k head_dim mismatch: expected 64 \(q.shape\[2\]\), got 32",
     lambda p, ws, d: _ragged_call(p, ws, k=p.k[..., :32], v=p.v[..., :32]), False),
    ("kv_shapes", ValueError,
     r"ragged_attention: v shape mismatch: expected \(52, 2, 64\) \(the shape of k\), got "
     r"\(51, 2, 64\)",
     lambda p, ws, d: _ragged_call(p, ws, v=p.v[:-1]), False),
    ("cu_seqlens_kv_batch", ValueError,
     r"ragged_attention: cu_seqlens_kv.shape\[0\] mismatch: expected 4 \(batch_size \+ 1, "
     r"cu_seqlens_q.shape\[0\]\), got 5",
     lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_kv=harness.cu_seqlens([40, 3, 9, 0], d)),
     False),
    ("cu_seqlens_q_empty", ValueError,
     r"ragged_attention: cu_seqlens_q is empty: expected \[batch_size \+ 1\] prefix sums from "
     r"0, got shape \(0,\)",
     lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_q=p.cu_seqlens_q[:0]), False),
    ("cu_seqlens_kv_start", ValueError,
     r"ragged_attention: cu_seqlens_kv\[0\] is not 0: expected 0, got 2",
     lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_kv=_edited(p.cu_seqlens_kv, 0, 2)), True),
    ("cu_seqlens_kv_decreasing", ValueError,
     r"ragged_attention: cu_seqlens_kv decreases at index 2: expected a non-decreasing prefix "
     r"sum \(>= 40\), got 39",
     lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_kv=_edited(p.cu_seqlens_kv, 2, 39)), True),
    ("cu_seqlens_kv_end", ValueError,
     r"ragged_attention: cu_seqlens_kv\[batch_size\] does not match total_kv: expected 52, "
     r"got 51",
     lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_kv=_edited(p.cu_seqlens_kv, 3, 51)), True),
    ("cu_seqlens_q_end", ValueError,
     r"ragged_attention: cu_seqlens_q\[batch_size\] does not match total_q: expected 14, got 13",
     lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_q=_edited(p.cu_seqlens_q, 3, 13)), True),
    ("cu_seqlens_kv_int64", TypeError,
     r"ragged_attention: cu_seqlens_kv dtype unsupported: expected torch.int32, got "
     r"torch.int64; pass cu_seqlens_kv.to\(torch.int32\)",
     lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_kv=_int64(p.cu_seqlens_kv)), False),
    ("cu_seqlens_q_2d", ValueError,
     r"ragged_attention: cu_seqlens_q has the wrong number of dimensions: expected a 1-D "
     r"tensor, got shape \(1, 4\)",
     lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_q=p.cu_seqlens_q[None]), False),
    ("num_splits_type", TypeError,
     r"ragged_attention: num_splits has the wrong type: expected an int, got 2.5",
     lambda p, ws, d: _ragged_call(p, ws, num_splits=2.5), False),
    ("causal_type", TypeError,
     r"ragged_attention: causal has the wrong type: expected a bool, got 'yes'",
     lambda p, ws, d: _ragged_call(p, ws, causal="yes"), False),
]


def _expand(pattern, problem, device):
    fields = {"device": re.escape(str(problem.q.device)),
              "other": re.escape(_other_device(device))}
    if "{need}" in pattern:
        q = problem.q
        fields["need"] = splitkv.required_workspace_bytes(q.shape[0], q.shape[1], q.shape[2], 4)
    if "{num_pages}" in pattern:
        fields["num_pages"] = problem.kv_cache.shape[0]
    return pattern.format(**fields) if fields else pattern


def _check_refused(kind, device, error, pattern, call, cpu_only):
    harness.require(device)
    if cpu_only and device != "cpu":
        pytest.skip("index values are checked on the host by the CPU backend only")
    problem, expected = _valid(device, kind)
    workspace = harness.shared_workspace(device)
    with pytest.raises(error, match=_expand(pattern, problem, device)):
        call(problem, workspace, device)
    harness.assert_counter_region_zero(workspace)
    # The same workspace then serves a valid call (split, to use its counters).
    harness.assert_close(problem.run(workspace, num_splits=3), expected, _DTYPE)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("error, pattern, call, cpu_only", [c[1:] for c in PAGED_CASES],
                         ids=[c[0] for c in PAGED_CASES])
def test_paged_refuses(device, error, pattern, call, cpu_only):
    _check_refused("paged", device, error, pattern, call, cpu_only)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("error, pattern, call, cpu_only", [c[1:] for c in RAGGED_CASES],
                         ids=[c[0] for c in RAGGED_CASES])
def test_ragged_refuses(device, error, pattern, call, cpu_only):
    _check_refused("ragged", device, error, pattern, call, cpu_only)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_refuses_like_the_call(device):
    harness.require(device)
    problem, _ = _valid(device, "paged")
    small = _aligned_buffer(8 << 20, device)
    with pytest.raises(ValueError, match=r"paged_attention: workspace too small: need \d+ bytes "
                       r"for num_splits=4, got 8388608"):
        problem.plan(small, num_splits=4)
    assert problem.plan(small).num_splits == 1


_TRANSFORMED = {
    # (kind, the wrapped argument, how torch.func wraps it, what the message says it got)
    "paged_vmap_q": ("paged", "q", "vmap", "a batched tensor (torch.func.vmap)"),
    "paged_vmap_kv_cache": ("paged", "kv_cache", "vmap", "a batched tensor (torch.func.vmap)"),
    "paged_grad_q": ("paged", "q", "grad",
                     "a tensor of torch.func.grad, jvp or another transform"),
    "ragged_vmap_k": ("ragged", "k", "vmap", "a batched tensor (torch.func.vmap)"),
}


def _runner_call(kind, problem, workspace):
    """A call through a runner bound to `problem`'s fixed arguments, with _paged_call's /
    _ragged_call's signature (only the tensors run() takes may be replaced)."""
    if kind == "paged":
        runner = splitkv.PagedAttentionRunner(workspace, problem.block_tables, problem.seq_lens,
                                              cu_seqlens_q=problem.cu_seqlens_q,
                                              kv_layout=problem.kv_layout)
        return lambda p, ws, **changes: runner.run(changes.get("q", p.q),
                                                   changes.get("kv_cache", p.kv_cache))
    runner = splitkv.RaggedAttentionRunner(workspace, problem.cu_seqlens_q, problem.cu_seqlens_kv)
    return lambda p, ws, **changes: runner.run(changes.get("q", p.q), changes.get("k", p.k),
                                               changes.get("v", p.v))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("through", ["function", "runner"])
@pytest.mark.parametrize("case", list(_TRANSFORMED))
def test_torch_func_transforms_are_refused_by_name(device, case, through):
    # A tensor that vmap, grad or jvp wraps has no storage: before, the call failed inside
    # torch ("Cannot access data pointer of Tensor that doesn't have storage"), naming no
    # argument. Twice: the second call reaches the per-call path of a cached layout. A
    # runner's run() refuses as the function does.
    harness.require(device)
    kind, name, transform, got = _TRANSFORMED[case]
    problem, expected = _valid(device, kind)
    workspace = harness.shared_workspace(device)
    if through == "runner":
        call = _runner_call(kind, problem, workspace)
    else:
        call = _paged_call if kind == "paged" else _ragged_call
    call(problem, workspace)  # the layout is cached: the wrapped call takes the per-call path
    value = getattr(problem, name)
    if transform == "vmap":
        run = torch.func.vmap(lambda x: call(problem, workspace, **{name: x}))
        batch = value.unsqueeze(0).expand((2,) + value.shape)
    else:
        run = torch.func.grad(lambda x: call(problem, workspace, **{name: x}).sum())
        batch = value.clone()
    for _ in range(2):
        with pytest.raises(TypeError) as caught:
            run(batch)
        assert str(caught.value) == (
            f"{kind}_attention: {name} is wrapped by a torch.func transform: expected a plain "
            f"tensor with storage, got {got}; call splitkv outside torch.func transforms: "
            f"batch requests along q's first dimension (block_tables / cu_seqlens) instead of "
            f"vmap; the calls have no derivative")
        harness.assert_counter_region_zero(workspace)
    harness.assert_close(call(problem, workspace), expected, _DTYPE)
