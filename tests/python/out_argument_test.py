"""A caller's `out` and the tensors a call reads, as torch's own out= ops treat them.

- A call that writes into `out` moves its version counter, on the first call of a layout and
  on the cached path alike, so autograd refuses a backward that saved out's old values.
- A negated view (`x.is_neg()`) is refused on the cached path as on the first call: its
  layout is any other tensor's, but its memory holds -x.
- The torch op refuses a scale given both as a float and as a tensor.
(The first-call refusals and their messages are in the bad-input catalogue, bad_inputs.py.)
"""

import pytest
import torch

import harness
import splitkv
from harness import DEVICES
from splitkv import _calls


@pytest.fixture(autouse=True)
def _empty_cache():
    _calls._layouts.clear()
    yield
    _calls._layouts.clear()


def _paged(device):
    return harness.make_paged([40, 17, 5], page_size=16, group=2, head_dim=64,
                              dtype=torch.float16 if device == "cuda" else torch.float32,
                              device=device, seed=5)


def _call(problem, workspace, **changes):
    args = dict(q=problem.q, kv_cache=problem.kv_cache, block_tables=problem.block_tables,
                seq_lens=problem.seq_lens)
    args.update(changes)
    return splitkv.paged_attention(args.pop("q"), args.pop("kv_cache"), args.pop("block_tables"),
                                   args.pop("seq_lens"), workspace, **args)


@pytest.mark.parametrize("device", DEVICES)
def test_out_version_moves_on_every_path(device):
    harness.require(device)
    problem = _paged(device)
    workspace = harness.shared_workspace(device)
    out = torch.full_like(problem.q, float("nan"))
    versions = [out._version]
    for _ in range(3):  # the first call takes the full path, the next ones the cached one
        assert _call(problem, workspace, out=out) is out
        versions.append(out._version)
    assert versions[1] > versions[0] and versions[2] > versions[1] and versions[3] > versions[2]
    expected, _ = problem.reference()
    harness.assert_close(out, expected, problem.dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_through_a_rewritten_out_is_refused(device):
    harness.require(device)
    problem = _paged(device)
    workspace = harness.shared_workspace(device)
    out = torch.zeros_like(problem.q)
    _call(problem, workspace, out=out)  # the layout is now cached
    weight = torch.ones_like(problem.q, requires_grad=True)
    loss = (weight * out).sum()  # saves out for weight's gradient
    _call(problem, workspace, out=out)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["q", "out", "kv_cache", "block_tables", "seq_lens"])
def test_negated_view_refused_after_its_layout_was_seen(device, which):
    harness.require(device)
    problem = _paged(device)
    workspace = harness.shared_workspace(device)
    out = torch.empty_like(problem.q)
    plain = _call(problem, workspace, out=out).clone()
    negated = {"q": dict(q=torch._neg_view(problem.q)),
               "out": dict(out=torch._neg_view(out)),
               "kv_cache": dict(kv_cache=torch._neg_view(problem.kv_cache)),
               "block_tables": dict(block_tables=torch._neg_view(problem.block_tables)),
               "seq_lens": dict(seq_lens=torch._neg_view(problem.seq_lens))}[which]
    kwargs = dict(dict(out=out), **negated)
    with pytest.raises(ValueError, match=f"{which} is a negated view: .* pass {which}.resolve_neg"):
        _call(problem, workspace, **kwargs)
    harness.assert_counter_region_zero(workspace)
    harness.assert_bitwise_equal(_call(problem, workspace, out=out), plain)


@pytest.mark.parametrize("device", DEVICES)
def test_out_requiring_grad_refused_after_its_layout_was_seen(device):
    harness.require(device)
    problem = _paged(device)
    workspace = harness.shared_workspace(device)
    _call(problem, workspace, out=torch.empty_like(problem.q))
    with pytest.raises(ValueError, match="out requires grad"):
        _call(problem, workspace, out=torch.empty_like(problem.q).requires_grad_())
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_op_refuses_a_scale_given_twice(device):
    harness.require(device, torch.float16)
    problem = harness.make_paged([40, 17], page_size=16, head_dim=64, dtype=torch.float16,
                                 device=device, seed=6)
    workspace = harness.shared_workspace(device)
    kv_cache = problem.kv_cache.to(torch.float8_e4m3fn)
    out = torch.empty_like(problem.q)
    common = dict(q=problem.q, k_cache=kv_cache, v_cache=None, block_tables=problem.block_tables,
                  seq_lens=problem.seq_lens, workspace=workspace.tensor, out=out, lse=None,
                  cu_seqlens_q=None, kv_layout="HND", sm_scale=None, causal=True, window_left=-1,
                  logits_soft_cap=0.0, num_splits=None, max_q_len=None)
    scales = torch.full((problem.kv_cache.shape[2],), 0.5, device=device)
    with pytest.raises(ValueError, match=r"k_scale given twice: expected either the float k_scale "
                                         r"or the tensor k_scales, got k_scale=2.0 and a k_scales"):
        torch.ops.splitkv.paged_attention(**common, k_scale=2.0, k_scales=scales, v_scale=1.0)
    with pytest.raises(ValueError, match="v_scale given twice"):
        torch.ops.splitkv.paged_attention(**common, k_scale=1.0, v_scale=2.0, v_scales=scales)
    harness.assert_counter_region_zero(workspace)
    torch.ops.splitkv.paged_attention(**common, k_scale=1.0, v_scales=scales)  # one of each
    eager = splitkv.paged_attention(problem.q, kv_cache, problem.block_tables, problem.seq_lens,
                                    workspace, k_scale=1.0, v_scale=scales)
    harness.assert_bitwise_equal(out, eager)


def _float32_view(x, shape):
    """A float32 tensor of `shape` over the first bytes of contiguous `x`."""
    count = shape[0] * shape[1]
    return x.reshape(-1).view(torch.uint8)[:count * 4].view(torch.float32).view(shape)


@pytest.mark.parametrize("device", DEVICES)
def test_op_refuses_an_lse_sharing_bytes_with_out_or_an_input(device):
    harness.require(device)
    problem = _paged(device)
    workspace = harness.shared_workspace(device)
    lse_shape = tuple(problem.q.shape[:2])
    out = torch.empty_like(problem.q)
    common = dict(k_cache=problem.kv_cache, v_cache=None, block_tables=problem.block_tables,
                  seq_lens=problem.seq_lens, workspace=workspace.tensor, cu_seqlens_q=None,
                  kv_layout="HND", sm_scale=None, causal=True, window_left=-1,
                  logits_soft_cap=0.0, num_splits=3, max_q_len=None)
    q = problem.q.clone()
    for name, host in (("out", out), ("q", q)):
        with pytest.raises(ValueError, match=rf"paged_attention: lse overlaps {name}: expected a "
                                             rf"tensor sharing no byte with {name}, got lse bytes "
                                             rf"\[0, {lse_shape[0] * lse_shape[1] * 4}\) within "
                                             rf"{name}'s span; pass an lse buffer of its own"):
            torch.ops.splitkv.paged_attention(q=q, out=out, lse=_float32_view(host, lse_shape),
                                              **common)
        harness.assert_counter_region_zero(workspace)
    assert torch.equal(q, problem.q)  # the refused calls wrote nothing
    lse = torch.full(lse_shape, float("nan"), device=device)
    torch.ops.splitkv.paged_attention(q=q, out=out, lse=lse, **common)
    eager_out, eager_lse = splitkv.paged_attention(problem.q, problem.kv_cache, problem.block_tables,
                                                   problem.seq_lens, workspace, num_splits=3,
                                                   return_lse=True)
    harness.assert_bitwise_equal(out, eager_out)
    harness.assert_bitwise_equal(lse, eager_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_raw_op_refuses_a_missing_out_and_an_lse_torch_forbids_writing(device):
    # The schema's out is a Tensor, but torch lets None through: the op once launched into an
    # out of its own that it had already dropped (freed memory).
    harness.require(device)
    problem = _paged(device)
    workspace = harness.shared_workspace(device)
    common = dict(q=problem.q, k_cache=problem.kv_cache, v_cache=None,
                  block_tables=problem.block_tables, seq_lens=problem.seq_lens,
                  workspace=workspace.tensor, cu_seqlens_q=None, kv_layout="HND", sm_scale=None,
                  causal=True, window_left=-1, logits_soft_cap=0.0, num_splits=3, max_q_len=None)
    with pytest.raises(TypeError, match="paged_attention: out has the wrong type: expected a "
                                        "torch.Tensor, got NoneType"):
        torch.ops.splitkv.paged_attention(out=None, lse=None, **common)
    lse = torch.empty(problem.q.shape[:2], device=device, requires_grad=True)
    with pytest.raises(ValueError, match=r"paged_attention: lse requires grad: expected "
                                         r"lse.requires_grad == False"):
        torch.ops.splitkv.paged_attention(out=torch.empty_like(problem.q), lse=lse, **common)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["q", "kv_cache", "block_tables", "workspace", "out"])
def test_ops_functions_refuse_a_meta_tensor_before_dispatch(device, which):
    # torch sends a call with a meta tensor among its arguments to the op's fake
    # implementation, which computes nothing: the functions refuse it as the eager ones do.
    harness.require(device)
    problem = _paged(device)
    workspace = harness.shared_workspace(device)
    args = dict(q=problem.q, kv_cache=problem.kv_cache, block_tables=problem.block_tables,
                workspace=workspace.tensor, out=torch.empty_like(problem.q))
    args[which] = args[which].to("meta")
    message = ("q device unsupported: expected a cpu or cuda tensor, got meta" if which == "q" else
               f"{which} device mismatch: expected {problem.q.device} \\(q's device\\), got meta")
    for function in (splitkv.paged_attention, splitkv.ops.paged_attention):
        with pytest.raises(ValueError, match=f"paged_attention: {message}"):
            function(args["q"], args["kv_cache"], args["block_tables"], problem.seq_lens,
                     args["workspace"], out=args["out"])
    harness.assert_counter_region_zero(workspace)
    harness.assert_bitwise_equal(splitkv.ops.paged_attention(problem.q, problem.kv_cache,
                                                             problem.block_tables, problem.seq_lens,
                                                             workspace),
                                 splitkv.paged_attention(problem.q, problem.kv_cache,
                                                         problem.block_tables, problem.seq_lens,
                                                         workspace))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["seq_lens", "lse", "sinks", "out"])
def test_raw_op_refuses_a_meta_tensor_among_real_ones(device, which):
    # torch routes a raw op call with one meta tensor among real ones to the fake
    # implementation: it returned without a word and out stayed unwritten. It now refuses the
    # call with the eager functions' device message.
    harness.require(device)
    problem = _paged(device)
    workspace = harness.shared_workspace(device)
    args = dict(q=problem.q, k_cache=problem.kv_cache, v_cache=None,
                block_tables=problem.block_tables, seq_lens=problem.seq_lens,
                workspace=workspace.tensor, out=torch.full_like(problem.q, float("nan")),
                lse=torch.empty(problem.q.shape[:2], device=device), cu_seqlens_q=None,
                kv_layout="HND", sm_scale=None, causal=True, window_left=-1, logits_soft_cap=0.0,
                num_splits=None, max_q_len=None,
                sinks=torch.zeros(problem.q.shape[1], device=device))
    args[which] = args[which].to("meta")
    with pytest.raises(ValueError, match=f"^paged_attention: {which} device mismatch: expected "
                                         f"{problem.q.device} \\(q's device\\), got meta"):
        torch.ops.splitkv.paged_attention(**args)
    harness.assert_counter_region_zero(workspace)
    ragged = harness.make_ragged([3, 4], [20, 9], dtype=problem.q.dtype, device=device, seed=6)
    args = dict(q=ragged.q, k=ragged.k, v=ragged.v, cu_seqlens_q=ragged.cu_seqlens_q,
                cu_seqlens_kv=ragged.cu_seqlens_kv.to("meta"), workspace=workspace.tensor,
                out=torch.empty_like(ragged.q), lse=None, causal=True, sm_scale=None,
                window_left=-1, logits_soft_cap=0.0, num_splits=None, max_q_len=4)
    with pytest.raises(ValueError, match=r"^ragged_attention: cu_seqlens_kv device mismatch"):
        torch.ops.splitkv.ragged_attention(**args)
    harness.assert_counter_region_zero(workspace)
