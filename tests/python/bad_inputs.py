"""The catalogue of inputs splitkv refuses: one row per refused input, and the tool that
writes docs/bad_inputs.md's table from the rows.

Rows come from two files: errors_test.py (PAGED_CASES, RAGGED_CASES: regex patterns) and
ROWS below (exact messages); bad_inputs_test.py tests the rows below the same way
errors_test.py tests its own: the call is refused with its error type and message, the
counter region is still zero, and the next valid call on the same workspace is right.

    .venv/bin/python tests/python/bad_inputs.py          # rewrites the table in docs/bad_inputs.md
    .venv/bin/python tests/python/bad_inputs.py --check  # exits 1 if the table is stale
    (after ./tools/bazel build //python/splitkv: the extension is loaded from bazel-bin)

The table shows each message as the CPU backend raises it (run here, not copied), except
for rows only CUDA can raise, which show the row's expected message.
"""

import dataclasses
import os
import sys

import numpy
import torch

try:
    import splitkv  # noqa: F401
except ImportError:  # run as a script from a source checkout
    import conftest  # noqa: F401

import errors_test
import harness
import splitkv
from splitkv import _splitkv
from errors_test import _aligned_buffer, _edited, _other_device, _paged_call, _ragged_call

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                   "bad_inputs.md")
BEGIN = "<!-- BEGIN TABLE: written by tests/python/bad_inputs.py, do not edit by hand -->"
END = "<!-- END TABLE -->"


@dataclasses.dataclass(frozen=True)
class Row:
    """One refused input.

    message: the exact text, with {device} and {other} filled in from the valid problem
    (errors_test._valid) and the device. where: "any", "cpu" (index values are read on the
    host by the CPU backend only, or the text is the CPU's) or "cuda" (a CUDA limit).
    """

    id: str
    kind: str          # "paged" or "ragged": the valid problem the call starts from
    input: str         # what is wrong, for the docs
    error: type
    message: str
    call: object       # call(problem, workspace, device), expected to raise
    where: str = "any"
    op: str = None     # the table's op when not the kind's (merge_states, distributed)


def _invariant_small_workspace(p, ws, d):
    """A batch_invariant prefill of 1 query over 3000 keys (2 CUDA splits of 2048) with only
    the counter region for a workspace."""
    q = p.q[:1, :2, :64].contiguous()
    k = torch.randn(3000, 2, 64, dtype=q.dtype, device=d)
    cu_q = torch.tensor([0, 1], dtype=torch.int32, device=d)
    cu_kv = torch.tensor([0, 3000], dtype=torch.int32, device=d)
    small = splitkv.Workspace(splitkv.COUNTER_REGION_BYTES, d)
    return splitkv.ragged_attention(q, k, k, cu_q, cu_kv, small, batch_invariant=True)


def _in_workspace(device, tensor, offset):
    """(workspace, copy of tensor placed at byte `offset` of it): an overlapping input."""
    buffer = _aligned_buffer(16 << 20, device)
    nbytes = tensor.numel() * tensor.element_size()
    inside = buffer[offset:offset + nbytes].view(tensor.dtype).view(tensor.shape)
    inside.copy_(tensor)
    return buffer, inside


def _paged_with_head_dim(p, ws, d, head_dim):
    kv = p.kv_cache.new_zeros(p.kv_cache.shape[:-1] + (head_dim,))
    return _paged_call(p, ws, q=p.q.new_zeros(p.q.shape[:-1] + (head_dim,)), kv_cache=kv)


def _paged_page_size_12(p, ws, d):
    kv = p.kv_cache.new_zeros(p.kv_cache.shape[:3] + (12,) + p.kv_cache.shape[4:])
    return _paged_call(p, ws, kv_cache=kv)


def _ws_over_q(p, ws, d):
    buffer, q = _in_workspace(d, p.q, 9 << 20)
    return _paged_call(p, buffer, q=q)


def _ws_over_kv(p, ws, d):
    buffer, kv = _in_workspace(d, p.kv_cache, 12 << 20)
    return _paged_call(p, buffer, kv_cache=kv)


def _ws_over_out(p, ws, d):
    buffer, out = _in_workspace(d, torch.empty_like(p.q), 8 << 20)
    return _paged_call(p, buffer, out=out)


def _out_over(p, index):
    """(out for the paged problem's q, a copy of the int32 tensor `index` in out's first
    bytes): an out that would overwrite an index tensor the kernels read meanwhile."""
    out = torch.empty_like(p.q)
    inside = out.view(-1).view(torch.int32)[:index.numel()]
    inside.copy_(index)
    return out, inside


def _out_over_kv_offsets(p, ws, d):
    out, offsets = _out_over(p, torch.zeros_like(p.seq_lens))
    return _paged_call(p, ws, out=out, kv_offsets=offsets, full_seq_lens=p.seq_lens.clone())


def _out_over_seq_lens(p, ws, d):
    out, seq_lens = _out_over(p, p.seq_lens)
    return _paged_call(p, ws, out=out, seq_lens=seq_lens)


def _out_over_cu_seqlens_kv(p, ws, d):
    out = torch.empty_like(p.q)
    inside = out.view(-1).view(torch.int32)[:p.cu_seqlens_kv.numel()]
    inside.copy_(p.cu_seqlens_kv)
    return _ragged_call(p, ws, out=out, cu_seqlens_kv=inside)


def _out_over_k_scale(p, ws, d):
    out = torch.empty_like(p.q)
    k_scale = out.view(-1).view(torch.float32)[:2]
    k_scale.fill_(0.5)
    return _paged_call(p, ws, out=out, kv_cache=p.kv_cache.to(torch.float8_e4m3fn),
                       k_scale=k_scale, v_scale=0.25)


def _ws_over_v_scale(p, ws, d):
    buffer, v_scale = _in_workspace(d, torch.full((2,), 0.25, device=d), 9 << 20)
    return _ragged_call(p, buffer, k=p.k.to(torch.float8_e4m3fn), v=p.v.to(torch.float8_e4m3fn),
                        k_scale=0.5, v_scale=v_scale)


def _ws_over_k(p, ws, d):
    buffer, k = _in_workspace(d, p.k, 10 << 20)
    return _ragged_call(p, buffer, k=k)


def _inference_empty_like(x):
    with torch.inference_mode():
        return torch.empty_like(x)


_P = "paged_attention: "
_R = "ragged_attention: "
_M = "merge_states: "
_D = "splitkv.distributed.paged_attention: "


def _merge(outs=None, lses=None, device="cpu"):
    """merge_states of 3 partials [3, 5, 4, 8] float32, with one argument replaced."""
    if outs is None:
        outs = torch.zeros(3, 5, 4, 8, device=device)
    if lses is None:
        lses = torch.zeros(3, 5, 4, device=device)
    return splitkv.merge_states(outs, lses)


def _distributed(p, ws, **changes):
    """splitkv.distributed.paged_attention of the paged problem as one shard holding every
    key, with some arguments replaced. Refused before any collective: no group is needed."""
    args = dict(kv_offsets=torch.zeros_like(p.seq_lens), full_seq_lens=p.seq_lens.clone())
    args.update(changes)
    return splitkv.distributed.paged_attention(
        args.pop("q", p.q), p.kv_cache, p.block_tables, p.seq_lens, args.pop("kv_offsets"),
        args.pop("full_seq_lens"), ws, cu_seqlens_q=p.cu_seqlens_q, kv_layout=p.kv_layout, **args)

ROWS = [
    # ---- paged: index tensors ----
    Row("seq_len_negative", "paged", "seq_lens entry < 0", ValueError,
        _P + "seq_lens[1] out of range: expected a length in [0, 64] (max_pages_per_seq * "
        "page_size), got -1",
        lambda p, ws, d: _paged_call(p, ws, seq_lens=_edited(p.seq_lens, 1, -1)), "cpu"),
    Row("block_tables_no_columns", "paged", "block_tables with 0 columns", ValueError,
        _P + "max_pages_per_seq out of range: expected >= 1, got 0",
        lambda p, ws, d: _paged_call(p, ws, block_tables=p.block_tables[:, :0])),
    Row("block_tables_column_major", "paged", "block_tables with a strided last dimension",
        ValueError,
        _P + "block_tables.stride(-1) is not 1: expected 1 (a dense last dimension), got 3; "
        "pass block_tables.contiguous()",
        lambda p, ws, d: _paged_call(p, ws, block_tables=p.block_tables.t().contiguous().t())),
    Row("seq_lens_not_contiguous", "paged", "seq_lens not contiguous", ValueError,
        _P + "seq_lens is not contiguous: expected a contiguous tensor, got strides (2,); pass "
        "seq_lens.contiguous()",
        lambda p, ws, d: _paged_call(p, ws, seq_lens=torch.stack([p.seq_lens] * 2, 1)[:, 0])),
    Row("seq_lens_int16", "paged", "seq_lens int16", TypeError,
        _P + "seq_lens dtype unsupported: expected torch.int32, got torch.int16",
        lambda p, ws, d: _paged_call(p, ws, seq_lens=p.seq_lens.to(torch.int16))),
    # ---- paged: q, kv_cache, out ----
    Row("kv_cache_no_pages", "paged", "kv_cache with 0 pages", ValueError,
        _P + "num_pages out of range: expected >= 1, got 0",
        lambda p, ws, d: _paged_call(p, ws, kv_cache=p.kv_cache[:0])),
    Row("kv_cache_three_tensors", "paged", "kv_cache a sequence of 3 tensors", ValueError,
        _P + "kv_cache has the wrong length: expected a (k, v) pair of tensors, got 3 items",
        lambda p, ws, d: _paged_call(p, ws, kv_cache=(p.kv_cache[:, 0],) * 3)),
    Row("kv_layout_other", "paged",
        "an HND cache passed as NHD (refused only when the shapes disagree)", ValueError,
        _P + "num_qo_heads is not a multiple of num_kv_heads: expected a multiple of 16, got 4",
        lambda p, ws, d: _paged_call(p, ws, kv_layout="NHD")),
    Row("q_rank", "paged", "q 2-D", ValueError,
        _P + "q has the wrong number of dimensions: expected a 3-D tensor [total_q, "
        "num_qo_heads, head_dim], got shape (4, 64)",
        lambda p, ws, d: _paged_call(p, ws, q=p.q[0])),
    Row("q_head_dim_stride", "paged", "q with a strided last dimension", ValueError,
        _P + "q.stride(-1) is not 1: expected 1 (a dense last dimension), got 2; pass "
        "q.contiguous()",
        lambda p, ws, d: _paged_call(p, ws, q=torch.cat([p.q, p.q], -1)[..., ::2])),
    Row("q_device_unsupported", "paged", "q on a device without a backend (meta)", ValueError,
        _P + "q device unsupported: expected a cpu or cuda tensor, got meta",
        lambda p, ws, d: _paged_call(p, ws, q=p.q.to("meta"))),
    Row("q_bool", "paged", "q of a non-float dtype", TypeError,
        _P + "q dtype unsupported: expected torch.float16, torch.bfloat16 or torch.float32, "
        "got torch.bool",
        lambda p, ws, d: _paged_call(p, ws, q=p.q.bool())),
    Row("out_device", "paged", "out on another device", ValueError,
        _P + "out device mismatch: expected {device} (q's device), got {other}; move out to "
        "{device}",
        lambda p, ws, d: _paged_call(p, ws, out=torch.empty_like(p.q, device=_other_device(d)))),
    # A negated view (x.is_neg(): torch.conj(c).imag, torch._neg_view) holds -x in memory,
    # and the launchers read memory: refused, first call or a layout seen before.
    Row("q_negated_view", "paged", "q a negated view (is_neg())", ValueError,
        _P + "q is a negated view: expected a tensor whose memory holds its values, got "
        "is_neg() == True; pass q.resolve_neg()",
        lambda p, ws, d: _paged_call(p, ws, q=torch._neg_view(p.q))),
    Row("out_negated_view", "paged", "out a negated view (is_neg())", ValueError,
        _P + "out is a negated view: expected a tensor whose memory holds its values, got "
        "is_neg() == True; pass out.resolve_neg()",
        lambda p, ws, d: _paged_call(p, ws, out=torch._neg_view(torch.empty_like(p.q)))),
    Row("v_negated_view", "ragged", "v a negated view (is_neg())", ValueError,
        _R + "v is a negated view: expected a tensor whose memory holds its values, got "
        "is_neg() == True; pass v.resolve_neg()",
        lambda p, ws, d: _ragged_call(p, ws, v=torch._neg_view(p.v))),
    # torch's own out= ops refuse these: the write would go around autograd.
    Row("out_requires_grad", "paged", "out that requires grad", ValueError,
        _P + "out requires grad: expected out.requires_grad == False (splitkv's calls record no "
        "gradient), got out.requires_grad == True",
        lambda p, ws, d: _paged_call(p, ws, out=torch.empty_like(p.q).requires_grad_())),
    Row("out_inference_tensor", "ragged", "out an inference tensor, outside inference mode",
        ValueError,
        _R + "out is an inference tensor outside inference mode: expected a tensor writable in "
        "place here, got out.is_inference() == True; call inside torch.inference_mode() or pass "
        "another out",
        lambda p, ws, d: _ragged_call(p, ws, out=_inference_empty_like(p.q))),
    Row("out_head_dim_stride", "paged", "out with a strided last dimension", ValueError,
        _P + "out.stride(-1) is not 1: expected 1 (a dense last dimension), got 2; pass "
        "out.contiguous()",
        lambda p, ws, d: _paged_call(p, ws, out=torch.cat([p.q, p.q], -1)[..., ::2])),
    Row("head_dim_too_large_cpu", "paged", "head_dim above the CPU backend's 1024", ValueError,
        _P + "head_dim out of range: expected a value in [1, 1025), got 2048",
        lambda p, ws, d: _paged_with_head_dim(p, ws, d, 2048), "cpu"),
    Row("head_dim_unsupported_cuda", "paged", "head_dim other than 64, 128, 256 on CUDA",
        ValueError, _P + "head_dim not supported on cuda: expected 64, 128 or 256, got 96",
        lambda p, ws, d: _paged_with_head_dim(p, ws, d, 96), "cuda"),
    Row("float32_on_cuda", "paged", "float32 tensors on CUDA", ValueError,
        _P + "dtype float32 is not supported on cuda: expected float16 or bfloat16, got float32",
        lambda p, ws, d: _paged_call(p, ws, q=p.q.float(), kv_cache=p.kv_cache.float()), "cuda"),
    Row("page_size_not_power_of_two_cuda", "paged", "page_size not a power of two on CUDA",
        ValueError, _P + "page_size not supported on cuda: expected a power of two, got 12",
        _paged_page_size_12, "cuda"),
    # ---- paged: scalars ----
    Row("sm_scale_nan", "paged", "sm_scale NaN or infinite", ValueError,
        _P + "sm_scale is not finite: expected a finite scale, got nan",
        lambda p, ws, d: _paged_call(p, ws, sm_scale=float("nan"))),
    Row("soft_cap_inf", "paged", "logits_soft_cap infinite or NaN", ValueError,
        _P + "logits_soft_cap out of range: expected a finite value >= 0 (0 disables it), "
        "got inf",
        lambda p, ws, d: _paged_call(p, ws, logits_soft_cap=float("inf"))),
    Row("max_q_len_zero", "paged", "max_q_len 0", ValueError,
        _P + "max_q_len out of range: expected an int >= 1, got 0",
        lambda p, ws, d: _paged_call(p, ws, max_q_len=0)),
    Row("num_splits_past_int32", "paged", "num_splits >= 2**31", ValueError,
        _P + "num_splits out of range: expected None (the planner chooses) or an int >= 1 and "
        "<= 2147483647 (int32), got 2147483648",
        lambda p, ws, d: _paged_call(p, ws, num_splits=2**31)),
    Row("batch_invariant_forced_splits", "paged", "num_splits forced with batch_invariant",
        ValueError,
        _P + "num_splits conflicts with batch_invariant: expected None (0 in C++: the "
        "invariant split rule chooses), got 2",
        lambda p, ws, d: _paged_call(p, ws, num_splits=2, batch_invariant=True)),
    Row("batch_invariant_type", "paged", "batch_invariant not a bool", TypeError,
        _P + "batch_invariant has the wrong type: expected a bool, got 'yes'",
        lambda p, ws, d: _paged_call(p, ws, batch_invariant="yes")),
    # ---- sinks ----
    Row("sinks_float16", "paged", "sinks not float32", TypeError,
        _P + "sinks dtype unsupported: expected torch.float32, got torch.float16; pass "
        "sinks.float()",
        lambda p, ws, d: _paged_call(p, ws, sinks=torch.zeros(4, dtype=torch.float16, device=d))),
    Row("sinks_not_a_tensor", "paged", "sinks a list", TypeError,
        _P + "sinks has the wrong type: expected a torch.Tensor, got list",
        lambda p, ws, d: _paged_call(p, ws, sinks=[0.0] * 4)),
    Row("sinks_shape", "paged", "sinks of another length than num_qo_heads", ValueError,
        _P + "sinks.shape[0] mismatch: expected 4 (num_qo_heads, q.shape[1]), got 2",
        lambda p, ws, d: _paged_call(p, ws, sinks=torch.zeros(2, device=d))),
    Row("sinks_rank", "paged", "sinks 2-D", ValueError,
        _P + "sinks has the wrong number of dimensions: expected a 1-D tensor [num_qo_heads], "
        "got shape (1, 4)",
        lambda p, ws, d: _paged_call(p, ws, sinks=torch.zeros(1, 4, device=d))),
    Row("sinks_device", "paged", "sinks on another device", ValueError,
        _P + "sinks device mismatch: expected {device} (q's device), got {other}; move sinks "
        "to {device}",
        lambda p, ws, d: _paged_call(p, ws, sinks=torch.zeros(4, device=_other_device(d)))),
    Row("sinks_not_contiguous", "ragged", "sinks not contiguous", ValueError,
        _R + "sinks is not contiguous: expected a contiguous tensor, got strides (2,); pass "
        "sinks.contiguous()",
        lambda p, ws, d: _ragged_call(p, ws, sinks=torch.zeros(8, device=d)[::2])),
    Row("sinks_float64_ragged", "ragged", "sinks float64", TypeError,
        _R + "sinks dtype unsupported: expected torch.float32, got torch.float64; pass "
        "sinks.float()",
        lambda p, ws, d: _ragged_call(p, ws, sinks=torch.zeros(4, dtype=torch.float64, device=d))),
    # ---- fp8 KV cache ----
    Row("fp8_without_scales", "paged", "an fp8 (float8_e4m3fn) cache without k_scale", ValueError,
        _P + "k_scale is missing: expected a float or a float32 tensor [num_kv_heads] with a "
        "torch.float8_e4m3fn KV cache, got None",
        lambda p, ws, d: _paged_call(p, ws, kv_cache=p.kv_cache.to(torch.float8_e4m3fn),
                                     v_scale=1.0)),
    Row("fp8_e5m2", "paged", "a float8_e5m2 cache", TypeError,
        _P + "kv_cache dtype unsupported: expected torch.float16 (the dtype of q) or "
        "torch.float8_e4m3fn (fp8 with k_scale, v_scale), got torch.float8_e5m2",
        lambda p, ws, d: _paged_call(p, ws, kv_cache=p.kv_cache.to(torch.float8_e5m2),
                                     k_scale=1.0, v_scale=1.0)),
    Row("fp8_q", "paged", "q float8_e4m3fn", TypeError,
        _P + "q dtype unsupported: expected torch.float16, torch.bfloat16 or torch.float32, "
        "got torch.float8_e4m3fn",
        lambda p, ws, d: _paged_call(p, ws, q=p.q.to(torch.float8_e4m3fn),
                                     kv_cache=p.kv_cache.to(torch.float8_e4m3fn),
                                     k_scale=1.0, v_scale=1.0)),
    Row("fp8_with_float32_q", "paged", "an fp8 cache with float32 q", TypeError,
        _P + "kv_cache dtype unsupported with q torch.float32: expected q torch.float16 or "
        "torch.bfloat16 with a torch.float8_e4m3fn cache, got torch.float8_e4m3fn",
        lambda p, ws, d: _paged_call(p, ws, q=p.q.float(),
                                     kv_cache=p.kv_cache.to(torch.float8_e4m3fn),
                                     k_scale=1.0, v_scale=1.0)),
    Row("scale_without_fp8", "paged", "k_scale with a float16 cache", ValueError,
        _P + "k_scale given without an fp8 KV cache: expected None (scales apply to a "
        "torch.float8_e4m3fn cache; this one is torch.float16), got 0.5",
        lambda p, ws, d: _paged_call(p, ws, k_scale=0.5)),
    Row("fp8_scale_shape", "ragged", "a per-head v_scale of the wrong length", ValueError,
        _R + "v_scale.shape[0] mismatch: expected 2 (num_kv_heads), got 3",
        lambda p, ws, d: _ragged_call(p, ws, k=p.k.to(torch.float8_e4m3fn),
                                      v=p.v.to(torch.float8_e4m3fn), k_scale=1.0,
                                      v_scale=torch.ones(3, device=d))),
    Row("fp8_scale_float16", "ragged", "a per-head k_scale of float16", TypeError,
        _R + "k_scale dtype unsupported: expected torch.float32, got torch.float16; pass "
        "k_scale.float()",
        lambda p, ws, d: _ragged_call(p, ws, k=p.k.to(torch.float8_e4m3fn),
                                      v=p.v.to(torch.float8_e4m3fn), v_scale=1.0,
                                      k_scale=torch.ones(2, dtype=torch.float16, device=d))),
    Row("fp8_scale_inf", "ragged", "k_scale infinite", ValueError,
        _R + "k_scale is not finite: expected a finite scale, got inf",
        lambda p, ws, d: _ragged_call(p, ws, k=p.k.to(torch.float8_e4m3fn),
                                      v=p.v.to(torch.float8_e4m3fn), k_scale=float("inf"),
                                      v_scale=1.0)),
    Row("fp8_scale_subnormal", "ragged", "k_scale a float32 subnormal (1e-40)", ValueError,
        _R + "k_scale outside float32's normal range: expected 0 or a magnitude in [1.2e-38, "
        "3.4e38], got 1e-40",
        lambda p, ws, d: _ragged_call(p, ws, k=p.k.to(torch.float8_e4m3fn),
                                      v=p.v.to(torch.float8_e4m3fn), k_scale=1e-40,
                                      v_scale=1.0)),
    Row("fp8_scale_past_float32", "ragged", "v_scale past float32's largest value (1e39)",
        ValueError,
        _R + "v_scale outside float32's normal range: expected 0 or a magnitude in [1.2e-38, "
        "3.4e38], got 1e+39",
        lambda p, ws, d: _ragged_call(p, ws, k=p.k.to(torch.float8_e4m3fn),
                                      v=p.v.to(torch.float8_e4m3fn), k_scale=1.0,
                                      v_scale=1e39)),
    Row("fp8_k_not_v", "ragged", "fp8 k with a float16 v", TypeError,
        _R + "v dtype mismatch: expected torch.float8_e4m3fn (the dtype of k), got torch.float16",
        lambda p, ws, d: _ragged_call(p, ws, k=p.k.to(torch.float8_e4m3fn), k_scale=1.0,
                                      v_scale=1.0)),
    # ---- paged: workspace ----
    Row("workspace_not_contiguous", "paged", "workspace not contiguous", ValueError,
        _P + "workspace is not contiguous: expected a contiguous tensor, got strides (2,); "
        "pass workspace.contiguous()",
        lambda p, ws, d: _paged_call(p, _aligned_buffer(32 << 20, d)[::2])),
    Row("workspace_overlaps_q", "paged", "workspace holding q", ValueError,
        _P + "workspace overlaps q: expected a buffer sharing no byte with q, got workspace "
        "bytes [9437184, 9438720) within q's span; allocate the workspace on its own "
        "(splitkv.Workspace)",
        _ws_over_q),
    Row("workspace_overlaps_kv_cache", "paged", "workspace holding the KV cache", ValueError,
        _P + "workspace overlaps kv_cache: expected a buffer sharing no byte with kv_cache, "
        "got workspace bytes [12582912, 12636160) within kv_cache's span; allocate the "
        "workspace on its own (splitkv.Workspace)",
        _ws_over_kv),
    Row("workspace_overlaps_out", "paged", "workspace holding out", ValueError,
        _P + "workspace overlaps out: expected a buffer sharing no byte with out, got "
        "workspace bytes [8388608, 8390144) within out's span; allocate the workspace on its "
        "own (splitkv.Workspace)",
        _ws_over_out),
    Row("workspace_empty", "paged", "workspace of 0 bytes (an empty tensor: null data pointer)",
        ValueError,
        _P + "workspace too small: need at least 8388608 bytes (the counter region), got 0",
        lambda p, ws, d: _paged_call(p, torch.empty(0, dtype=torch.uint8, device=d))),
    # ---- ragged ----
    Row("cu_seqlens_kv_past_end", "ragged", "cu_seqlens_kv ending past the end of k and v",
        ValueError,
        _R + "cu_seqlens_kv[batch_size] does not match total_kv: expected 52, got 53",
        lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_kv=_edited(p.cu_seqlens_kv, 3, 53)),
        "cpu"),
    Row("cu_seqlens_kv_inner_past_end", "ragged",
        "a cu_seqlens_kv entry past the end of k and v", ValueError,
        _R + "cu_seqlens_kv decreases at index 3: expected a non-decreasing prefix sum "
        "(>= 60), got 52",
        lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_kv=_edited(p.cu_seqlens_kv, 2, 60)),
        "cpu"),
    Row("cu_seqlens_q_negative", "ragged", "a negative cu_seqlens_q entry", ValueError,
        _R + "cu_seqlens_q decreases at index 1: expected a non-decreasing prefix sum (>= 0), "
        "got -1",
        lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_q=_edited(p.cu_seqlens_q, 1, -1)),
        "cpu"),
    Row("cu_seqlens_q_short", "ragged",
        "cu_seqlens_q one entry short (the batch follows cu_seqlens_q)", ValueError,
        _R + "cu_seqlens_kv.shape[0] mismatch: expected 3 (batch_size + 1, "
        "cu_seqlens_q.shape[0]), got 4",
        lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_q=p.cu_seqlens_q[:3])),
    Row("cu_seqlens_q_int64", "ragged", "cu_seqlens_q int64", TypeError,
        _R + "cu_seqlens_q dtype unsupported: expected torch.int32, got torch.int64; pass "
        "cu_seqlens_q.to(torch.int32)",
        lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_q=p.cu_seqlens_q.long())),
    Row("cu_seqlens_q_not_contiguous", "ragged", "cu_seqlens_q not contiguous", ValueError,
        _R + "cu_seqlens_q is not contiguous: expected a contiguous tensor, got strides (2,); "
        "pass cu_seqlens_q.contiguous()",
        lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_q=torch.stack([p.cu_seqlens_q] * 2,
                                                                      1)[:, 0])),
    Row("q_no_heads", "ragged", "q with 0 heads", ValueError,
        _R + "num_qo_heads out of range: expected >= 1, got 0",
        lambda p, ws, d: _ragged_call(p, ws, q=p.q[:, :0])),
    Row("k_head_dim_stride", "ragged", "k with a strided last dimension", ValueError,
        _R + "k.stride(-1) is not 1: expected 1 (a dense last dimension), got 2; pass "
        "k.contiguous()",
        lambda p, ws, d: _ragged_call(p, ws, k=torch.cat([p.k, p.k], -1)[..., ::2])),
    Row("max_q_len_negative", "ragged", "max_q_len < 0", ValueError,
        _R + "max_q_len out of range: expected an int >= 0, got -1",
        lambda p, ws, d: _ragged_call(p, ws, max_q_len=-1)),
    Row("too_many_tiles", "ragged",
        "forced num_splits > 1 with more work tiles than counters (2**21; refused on CUDA "
        "too, with its own tile count)", ValueError,
        _R + "too many work tiles for the counter region: need 4194306 counters for "
        "num_splits=2, the region holds 2097088; use num_splits=1 or a smaller batch",
        # 2**21 + 1 requests, the last with the one query: a tile per request and kv head (2).
        lambda p, ws, d: _ragged_call(
            p, ws, q=p.q[:1], k=p.k[:1], v=p.v[:1], num_splits=2,
            cu_seqlens_q=torch.cat([torch.zeros(2**21 + 1, dtype=torch.int32),
                                    torch.ones(1, dtype=torch.int32)]).to(d),
            cu_seqlens_kv=torch.cat([torch.zeros(2**21 + 1, dtype=torch.int32),
                                     torch.ones(1, dtype=torch.int32)]).to(d)),
        "cpu"),
    Row("batch_invariant_workspace_cuda", "ragged",
        "batch_invariant with a workspace too small for the request's splits, a call of decode "
        "tiles (CUDA; the CPU, and CUDA's sm_90 wgmma prefill for calls of more than 16 rows, "
        "run a tile's splits in one task instead)", ValueError,
        _R + "workspace too small: need 8389888 bytes for batch_invariant (2 splits of 2048 "
        "keys), got 8388608; pass a larger workspace",
        _invariant_small_workspace, "cuda"),
    Row("ragged_head_dim_unsupported_cuda", "ragged", "head_dim other than 64, 128, 256 on CUDA",
        ValueError, _R + "head_dim not supported on cuda: expected 64, 128 or 256, got 32",
        lambda p, ws, d: _ragged_call(p, ws, q=p.q[..., :32].contiguous(),
                                      k=p.k[..., :32].contiguous(), v=p.v[..., :32].contiguous()),
        "cuda"),
    Row("workspace_overlaps_k", "ragged", "workspace holding k", ValueError,
        _R + "workspace overlaps k: expected a buffer sharing no byte with k, got workspace "
        "bytes [10485760, 10499072) within k's span; allocate the workspace on its own "
        "(splitkv.Workspace)",
        _ws_over_k),
    # ---- merge_states (kind "paged": the test's valid call afterwards) ----
    Row("merge_outs_type", "paged", "outs a list", TypeError,
        _M + "outs has the wrong type: expected a torch.Tensor, got list",
        lambda p, ws, d: splitkv.merge_states([torch.zeros(5, 4, 8)], torch.zeros(1, 5, 4)),
        op="merge"),
    Row("merge_outs_rank", "paged", "outs 3-D", ValueError,
        _M + "outs has the wrong number of dimensions: expected a 4-D tensor [n, total_q, "
        "num_qo_heads, head_dim], got shape (3, 5, 4)",
        lambda p, ws, d: _merge(outs=torch.zeros(3, 5, 4, device=d), device=d), op="merge"),
    Row("merge_outs_int", "paged", "outs int32", TypeError,
        _M + "outs dtype unsupported: expected a floating-point dtype, got torch.int32",
        lambda p, ws, d: _merge(outs=torch.zeros(3, 5, 4, 8, dtype=torch.int32, device=d),
                                device=d), op="merge"),
    Row("merge_lses_float64", "paged", "lses float64", TypeError,
        _M + "lses dtype unsupported: expected torch.float32, got torch.float64",
        lambda p, ws, d: _merge(lses=torch.zeros(3, 5, 4, dtype=torch.float64, device=d),
                                device=d), op="merge"),
    Row("merge_lses_shape", "paged", "lses of another shape than outs.shape[:3]", ValueError,
        _M + "lses shape mismatch: expected (3, 5, 4) (outs.shape[:3]), got (3, 4, 5)",
        lambda p, ws, d: _merge(lses=torch.zeros(3, 4, 5, device=d), device=d), op="merge"),
    Row("merge_lses_device", "paged", "lses on another device than outs", ValueError,
        _M + "lses device mismatch: expected {device} (outs' device), got {other}; move lses "
        "to {device}",
        lambda p, ws, d: _merge(lses=torch.zeros(3, 5, 4, device=_other_device(d)), device=d),
        op="merge"),
    Row("merge_no_partials", "paged", "no partials (n = 0)", ValueError,
        _M + "outs.shape[0] out of range: expected >= 1 (one partial per key set), got 0",
        lambda p, ws, d: splitkv.merge_states(torch.zeros(0, 5, 4, 8, device=d),
                                              torch.zeros(0, 5, 4, device=d)), op="merge"),
    Row("merge_no_heads", "paged", "outs with 0 heads", ValueError,
        _M + "outs.shape[2] out of range: expected >= 1 (num_qo_heads), got 0",
        lambda p, ws, d: splitkv.merge_states(torch.zeros(3, 5, 0, 8, device=d),
                                              torch.zeros(3, 5, 0, device=d)), op="merge"),
    Row("merge_no_head_dim", "paged", "outs with head_dim 0 (float64 too)", ValueError,
        _M + "outs.shape[3] out of range: expected >= 1 (head_dim), got 0",
        lambda p, ws, d: splitkv.merge_states(torch.zeros(3, 5, 4, 0, dtype=torch.float64, device=d),
                                              torch.zeros(3, 5, 4, device=d)), op="merge"),
    # ---- paged: kv_offsets / full_seq_lens (keys as a shard of longer requests) ----
    Row("kv_offsets_alone", "paged", "kv_offsets without full_seq_lens", ValueError,
        _P + "kv_offsets/full_seq_lens given without the other: expected both or neither, got "
        "kv_offsets only",
        lambda p, ws, d: _paged_call(p, ws, kv_offsets=torch.zeros_like(p.seq_lens))),
    Row("full_seq_lens_alone", "paged", "full_seq_lens without kv_offsets", ValueError,
        _P + "kv_offsets/full_seq_lens given without the other: expected both or neither, got "
        "full_seq_lens only",
        lambda p, ws, d: _paged_call(p, ws, full_seq_lens=p.seq_lens.clone())),
    Row("kv_offsets_int64", "paged", "kv_offsets int64", TypeError,
        _P + "kv_offsets dtype unsupported: expected torch.int32, got torch.int64; pass "
        "kv_offsets.to(torch.int32)",
        lambda p, ws, d: _paged_call(p, ws, kv_offsets=torch.zeros_like(p.seq_lens).long(),
                                     full_seq_lens=p.seq_lens.clone())),
    Row("full_seq_lens_batch", "paged", "full_seq_lens of another length than batch_size",
        ValueError,
        _P + "full_seq_lens.shape[0] mismatch: expected 3 (batch_size, block_tables.shape[0]), "
        "got 2",
        lambda p, ws, d: _paged_call(p, ws, kv_offsets=torch.zeros_like(p.seq_lens),
                                     full_seq_lens=p.seq_lens[:2].clone())),
    Row("kv_offsets_device", "paged", "kv_offsets on another device", ValueError,
        _P + "kv_offsets device mismatch: expected {device} (q's device), got {other}; move "
        "kv_offsets to {device}",
        lambda p, ws, d: _paged_call(p, ws, kv_offsets=torch.zeros(3, dtype=torch.int32,
                                                                   device=_other_device(d)),
                                     full_seq_lens=p.seq_lens.clone())),
    Row("kv_offsets_negative", "paged", "a kv_offsets entry < 0", ValueError,
        _P + "kv_offsets[2] out of range: expected 0 <= kv_offsets[b] and kv_offsets[b] + "
        "seq_lens[b] <= full_seq_lens[b], got kv_offsets -1, seq_lens 5, full_seq_lens 5",
        lambda p, ws, d: _paged_call(p, ws, kv_offsets=_edited(torch.zeros_like(p.seq_lens), 2, -1),
                                     full_seq_lens=p.seq_lens.clone()), "cpu"),
    Row("shard_past_full_seq_lens", "paged", "kv_offsets[b] + seq_lens[b] > full_seq_lens[b]",
        ValueError,
        _P + "kv_offsets[0] out of range: expected 0 <= kv_offsets[b] and kv_offsets[b] + "
        "seq_lens[b] <= full_seq_lens[b], got kv_offsets 10, seq_lens 37, full_seq_lens 40",
        lambda p, ws, d: _paged_call(p, ws, kv_offsets=_edited(torch.zeros_like(p.seq_lens), 0, 10),
                                     full_seq_lens=_edited(p.seq_lens, 0, 40)), "cpu"),
    Row("out_overlaps_kv_offsets", "paged", "out holding kv_offsets", ValueError,
        _P + "out overlaps kv_offsets: expected a tensor sharing no byte with kv_offsets, got "
        "out bytes [0, 12) within kv_offsets's span; attention is not computed in place",
        _out_over_kv_offsets),
    Row("out_overlaps_seq_lens", "paged", "out holding seq_lens", ValueError,
        _P + "out overlaps seq_lens: expected a tensor sharing no byte with seq_lens, got "
        "out bytes [0, 12) within seq_lens's span; attention is not computed in place",
        _out_over_seq_lens),
    Row("out_overlaps_cu_seqlens_kv", "ragged", "out holding cu_seqlens_kv", ValueError,
        _R + "out overlaps cu_seqlens_kv: expected a tensor sharing no byte with "
        "cu_seqlens_kv, got out bytes [0, 16) within cu_seqlens_kv's span; attention is not "
        "computed in place",
        _out_over_cu_seqlens_kv),
    Row("out_overlaps_k_scale", "paged", "out holding a per-head k_scale", ValueError,
        _P + "out overlaps k_scale: expected a tensor sharing no byte with k_scale, got out "
        "bytes [0, 8) within k_scale's span; attention is not computed in place",
        _out_over_k_scale),
    Row("workspace_overlaps_v_scale", "ragged", "workspace holding a per-head v_scale",
        ValueError,
        _R + "workspace overlaps v_scale: expected a buffer sharing no byte with v_scale, got "
        "workspace bytes [9437184, 9437192) within v_scale's span; allocate the workspace on "
        "its own (splitkv.Workspace)",
        _ws_over_v_scale),
    # ---- splitkv.distributed.paged_attention (its other arguments: as paged_attention) ----
    Row("cp_kv_offsets_int64", "paged", "kv_offsets int64", TypeError,
        _D + "kv_offsets dtype unsupported: expected torch.int32, got torch.int64; pass "
        "kv_offsets.to(torch.int32)",
        lambda p, ws, d: _distributed(p, ws, kv_offsets=torch.zeros_like(p.seq_lens).long()),
        op="distributed"),
    Row("cp_full_seq_lens_batch", "paged", "full_seq_lens of another length than batch_size",
        ValueError,
        _D + "full_seq_lens.shape[0] mismatch: expected 3 (batch_size, block_tables.shape[0]), "
        "got 2",
        lambda p, ws, d: _distributed(p, ws, full_seq_lens=p.seq_lens[:2].clone()),
        op="distributed"),
    Row("cp_q_1d_with_sinks", "paged", "q 1-D, with sinks", ValueError,
        _D + "q has the wrong number of dimensions: expected a 3-D tensor [total_q, "
        "num_qo_heads, head_dim], got shape (128,)",
        lambda p, ws, d: _distributed(p, ws, q=torch.randn(128, device=d),
                                      sinks=torch.zeros(4, device=d)),
        op="distributed"),
    Row("cp_group_not_a_group", "paged", "group not a ProcessGroup (a rank number)", TypeError,
        _D + "group has the wrong type: expected None (the default group) or a "
        "torch.distributed.ProcessGroup, got int",
        lambda p, ws, d: _distributed(p, ws, group=5), op="distributed"),
    Row("cp_shard_past_request", "paged", "a shard past its request's full_seq_lens",
        ValueError,
        _P + "kv_offsets[1] out of range: expected 0 <= kv_offsets[b] and kv_offsets[b] + "
        "seq_lens[b] <= full_seq_lens[b], got kv_offsets 5, seq_lens 16, full_seq_lens 16",
        lambda p, ws, d: _distributed(p, ws, kv_offsets=_edited(torch.zeros_like(p.seq_lens),
                                                                1, 5)),
        "cpu", op="distributed"),
    # ---- found by an adversarial pass (2026-12-02) ----
    Row("cu_seqlens_q_decreasing_no_max_q_len", "paged",
        "cu_seqlens_q decreasing, max_q_len not given (derived from it)", ValueError,
        _P + "cu_seqlens_q decreases at index 1: expected a non-decreasing prefix sum (>= 0), "
        "got -2147483648",
        lambda p, ws, d: _paged_call(p, ws, cu_seqlens_q=torch.tensor(
            [0, -2**31, 2, 3], dtype=torch.int32, device=d)), "cpu"),
    Row("cu_seqlens_q_decreasing_forced_splits", "ragged",
        "cu_seqlens_q decreasing, max_q_len not given, forced num_splits", ValueError,
        _R + "cu_seqlens_q decreases at index 2: expected a non-decreasing prefix sum "
        "(>= 2000000000), got 5",
        lambda p, ws, d: _ragged_call(p, ws, cu_seqlens_q=_edited(p.cu_seqlens_q, 1, 2_000_000_000),
                                      num_splits=2), "cpu"),
    Row("causal_float", "paged", "causal 1.0 (a float equal to True)", TypeError,
        _P + "causal has the wrong type: expected a bool, got 1.0",
        lambda p, ws, d: _paged_call(p, ws, causal=1.0)),
    Row("batch_invariant_tensor", "ragged", "batch_invariant a torch bool tensor", TypeError,
        _R + "batch_invariant has the wrong type: expected a bool, got a torch.bool tensor of shape ()",
        lambda p, ws, d: _ragged_call(p, ws, batch_invariant=torch.tensor(True))),
    # Scalar options from tensors: reading one is a silent conversion (a device sync on CUDA).
    Row("sm_scale_tensor", "paged", "sm_scale a one-element tensor", TypeError,
        _P + "sm_scale has the wrong type: expected a float, got a torch.float32 tensor of "
        "shape (1,)",
        lambda p, ws, d: _paged_call(p, ws, sm_scale=torch.tensor([0.1]))),
    Row("window_left_tensor", "ragged", "window_left a 0-d int tensor", TypeError,
        _R + "window_left has the wrong type: expected an int, got a torch.int64 tensor of "
        "shape ()",
        lambda p, ws, d: _ragged_call(p, ws, window_left=torch.tensor(3))),
    Row("sm_scale_huge_int", "paged", "sm_scale an int past float64's range (10**400)",
        ValueError,
        _P + "sm_scale outside float32's normal range: expected 0 or a magnitude in [1.2e-38, "
        "3.4e38], got an int of 1329 bits",
        lambda p, ws, d: _paged_call(p, ws, sm_scale=10**400)),
    Row("sm_scale_numpy_array", "paged", "sm_scale a one-element numpy array", TypeError,
        _P + "sm_scale has the wrong type: expected a float, got array([0.3])",
        lambda p, ws, d: _paged_call(p, ws, sm_scale=numpy.array([0.3]))),
    Row("window_left_numpy_array", "ragged", "window_left a one-element numpy array", TypeError,
        _R + "window_left has the wrong type: expected an int, got array([3])",
        lambda p, ws, d: _ragged_call(p, ws, window_left=numpy.array([3]))),
    Row("sm_scale_numpy_0d_array", "paged", "sm_scale a 0-d numpy array (an array, not a scalar)",
        TypeError, _P + "sm_scale has the wrong type: expected a float, got array(0.3)",
        lambda p, ws, d: _paged_call(p, ws, sm_scale=numpy.array(0.3))),
    Row("sm_scale_numpy_str", "paged", "sm_scale numpy's str_ '0.1' (has __float__: parsed)", TypeError,
        _P + "sm_scale has the wrong type: expected a float, got np.str_('0.1')",
        lambda p, ws, d: _paged_call(p, ws, sm_scale=numpy.str_("0.1"))),
    Row("sm_scale_numpy_complex", "paged", "sm_scale a numpy complex (its imaginary part dropped)",
        TypeError, _P + "sm_scale has the wrong type: expected a float, got np.complex128(0.1+2j)",
        lambda p, ws, d: _paged_call(p, ws, sm_scale=numpy.complex128(0.1 + 2j))),
    Row("sm_scale_numpy_timedelta", "paged", "sm_scale numpy's timedelta64(3) (an integer type to "
        "numpy)", TypeError, _P + "sm_scale has the wrong type: expected a float, got np.timedelta64(3)",
        lambda p, ws, d: _paged_call(p, ws, sm_scale=numpy.timedelta64(3))),
    Row("soft_cap_numpy_bool", "ragged", "logits_soft_cap numpy's True (reads as 1.0)", TypeError,
        _R + "logits_soft_cap has the wrong type: expected a float, got np.True_",
        lambda p, ws, d: _ragged_call(p, ws, logits_soft_cap=numpy.True_)),
    Row("q_sparse", "paged", "q a sparse tensor", TypeError,
        _P + "q layout unsupported: expected a strided (dense) tensor, got torch.sparse_coo; "
        "pass q.to_dense()",
        lambda p, ws, d: _paged_call(p, ws, q=p.q.to_sparse())),
    Row("return_lse_type", "ragged", "return_lse not a bool", TypeError,
        _R + "return_lse has the wrong type: expected a bool, got 'no'",
        lambda p, ws, d: _ragged_call(p, ws, return_lse="no")),
    Row("fp8_scale_tensor_inf", "ragged", "a per-head k_scale holding an infinity", ValueError,
        _R + "k_scale[1] is not finite: expected a finite scale, got inf",
        lambda p, ws, d: _ragged_call(p, ws, k=p.k.to(torch.float8_e4m3fn),
                                      v=p.v.to(torch.float8_e4m3fn), v_scale=1.0,
                                      k_scale=torch.tensor([1.0, float("inf")], device=d)),
        "cpu"),
    Row("status_record_set", "paged", "a workspace whose status record is set (bytes someone "
        "else wrote)", ValueError,
        _P + "workspace counter region corrupted: expected the status record (bytes 8388352.."
        "8388608) to be 0 at rest, got 7 in its word 2; nothing was computed and the counter "
        "region was reset to zero (was the workspace zeroed when made, or written by someone "
        "else?)",
        lambda p, ws, d: _with_status_word(p, ws, 2, 7), "cpu"),
    Row("seq_lens_freed_cached", "paged", "seq_lens whose storage was freed (resized to 0) "
        "after its layout's first calls (the cached per-call path)", ValueError,
        _P + "seq_lens is null: expected a valid pointer, got null",
        lambda p, ws, d: _freed_after_caching(_paged_call, p, ws, "seq_lens")),
    Row("cu_seqlens_kv_freed_cached", "ragged", "cu_seqlens_kv whose storage was freed "
        "(resized to 0) after its layout's first calls", ValueError,
        _R + "cu_seqlens_kv is null: expected a valid pointer, got null",
        lambda p, ws, d: _freed_after_caching(_ragged_call, p, ws, "cu_seqlens_kv")),
    Row("raw_op_meta_lse", "paged", "the raw op torch.ops.splitkv.paged_attention with a meta "
        "lse among real tensors (torch routes the call to the op's fake implementation)",
        ValueError,
        _P + "lse device mismatch: expected {device} (q's device), got meta; move lse to "
        "{device}",
        lambda p, ws, d: _raw_paged_op(p, ws, lse=torch.empty(p.q.shape[:2], device="meta"))),
]


def _freed_after_caching(call, p, ws, name):
    """Two valid calls (the second takes the cached layout's path), then one whose `name`
    is a copy with its storage resized to nothing (shape kept, data_ptr() 0)."""
    call(p, ws)
    call(p, ws)
    freed = getattr(p, name).clone()
    freed.untyped_storage().resize_(0)
    return call(p, ws, **{name: freed})


def _raw_paged_op(p, ws, **changes):
    """torch.ops.splitkv.paged_attention on the valid problem, with some arguments replaced."""
    args = dict(q=p.q, k_cache=p.kv_cache, v_cache=None, block_tables=p.block_tables,
                seq_lens=p.seq_lens, workspace=ws.tensor, out=torch.empty_like(p.q), lse=None,
                cu_seqlens_q=p.cu_seqlens_q, kv_layout=p.kv_layout, sm_scale=None, causal=True,
                window_left=-1, logits_soft_cap=0.0, num_splits=None, max_q_len=None)
    args.update(changes)
    return torch.ops.splitkv.paged_attention(**args)


def _with_status_word(p, ws, word, value):
    """A paged call on `ws` after writing `value` into word `word` of its status record."""
    status = ws.counter_region()[_splitkv.kStatusOffset:].view(torch.int32)  # workspace_layout.h
    status[word] = value
    return _paged_call(p, ws)


# Rows whose refusal is not implemented yet: their tests are expected to fail (strictly),
# and the table shows their expected message. Empty now; kept for the next such row.
PENDING = set()


def expected_message(row, problem, device):
    fields = {"device": str(problem.q.device), "other": _other_device(device)}
    return row.message.format(**fields)


# ---- the docs table ----

# What errors_test.py's cases refuse, for the table (a case missing here shows its id only).
DESCRIPTIONS = {
    "workspace_too_small": "workspace smaller than the counter region (8 MiB)",
    "forced_splits_do_not_fit": "forced num_splits whose partials do not fit the workspace",
    "workspace_misaligned": "workspace base address not 256-byte aligned",
    "workspace_dtype": "workspace not uint8",
    "workspace_type": "workspace neither a Workspace nor a tensor",
    "workspace_tensor_type": "a Workspace whose tensor attribute is not a tensor",
    "workspace_device": "workspace on another device",
    "q_dtype": "q float64",
    "q_not_a_tensor": "q not a tensor",
    "kv_dtype": "kv_cache of another dtype than q",
    "k_dtype": "k of another dtype than q",
    "block_tables_device": "block_tables on another device",
    "kv_cache_device": "kv_cache on another device",
    "v_device": "v on another device",
    "heads_not_multiple": "num_qo_heads not a multiple of num_kv_heads",
    "head_dim_mismatch": "head_dim of q and of the keys differ",
    "page_id_too_large": "a block_tables entry >= num_pages",
    "page_id_negative": "a negative block_tables entry",
    "seq_len_past_capacity": "a seq_lens entry past max_pages_per_seq * page_size",
    "seq_lens_batch": "seq_lens of another length than block_tables' rows",
    "total_q_batch": "q rows other than batch_size without cu_seqlens_q",
    "cu_seqlens_q_batch": "cu_seqlens_q of the wrong length",
    "cu_seqlens_q_start": "cu_seqlens_q not starting at 0",
    "cu_seqlens_q_decreasing": "cu_seqlens_q decreasing",
    "cu_seqlens_q_end": "cu_seqlens_q not ending at q's row count",
    "max_q_len_too_small": "max_q_len below the longest query",
    "block_tables_int64": "block_tables int64",
    "seq_lens_int64": "seq_lens int64",
    "cu_seqlens_q_int64": "cu_seqlens_q int64",
    "cu_seqlens_kv_int64": "cu_seqlens_kv int64",
    "kv_layout": "an unknown kv_layout",
    "kv_layout_type": "kv_layout not a str (None, bytes, a list)",
    "block_tables_overlapping_rows": "block_tables rows that overlap (stride(0) below its width)",
    "kv_cache_rank": "kv_cache 4-D (and not a pair)",
    "kv_pair_shapes": "a (k, v) pair of different shapes",
    "kv_shapes": "k and v of different shapes",
    "kv_head_dim_stride": "kv_cache with a strided last dimension",
    "num_splits_zero": "num_splits 0",
    "num_splits_type": "num_splits not an int",
    "window_left": "window_left below -1",
    "soft_cap": "logits_soft_cap below 0",
    "causal_type": "causal not a bool",
    "out_shape": "out of another shape than q",
    "out_dtype": "out of another dtype than q",
    "cu_seqlens_kv_batch": "cu_seqlens_kv of the wrong length",
    "cu_seqlens_q_empty": "cu_seqlens_q empty",
    "cu_seqlens_kv_start": "cu_seqlens_kv not starting at 0",
    "cu_seqlens_kv_decreasing": "cu_seqlens_kv decreasing",
    "cu_seqlens_kv_end": "cu_seqlens_kv ending before the end of k and v",
    "cu_seqlens_q_2d": "cu_seqlens_q 2-D",
}


def _all_rows():
    """(kind, id, error, call, where, Row or None) of every refused input, paged first."""
    for kind, cases in (("paged", errors_test.PAGED_CASES), ("ragged", errors_test.RAGGED_CASES)):
        for case_id, error, _, call, cpu_only in cases:
            yield kind, case_id, error, call, "cpu" if cpu_only else "any", None
        for row in ROWS:
            if row.kind == kind:
                yield row.kind, row.id, row.error, row.call, row.where, row


def _message_on_cpu(kind, call):
    problem, _ = errors_test._valid("cpu", kind)
    try:
        call(problem, harness.shared_workspace("cpu"), "cpu")
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def _cell(text):
    return text.replace("|", "\\|")


def table():
    """The markdown table of every refused input, messages as raised on the CPU."""
    lines = ["| op | input (test id) | error | message | checked on |",
             "| --- | --- | --- | --- | --- |"]
    for kind, case_id, error, call, where, row in _all_rows():
        if where == "cuda":
            message = row.message
        else:
            message = _message_on_cpu(kind, call)
            if message is None:
                pending = row is not None and row.id in PENDING
                message = row.message if pending else "NOT REFUSED: " + case_id
        source = "bad_inputs_test.py" if row else "errors_test.py"
        description = row.input if row else DESCRIPTIONS.get(case_id)
        what = f"{description} (`{case_id}`)" if description else f"`{case_id}`"
        checked = {"any": "CPU, CUDA", "cpu": "CPU only", "cuda": "CUDA only"}[where]
        kind = row.op if row is not None and row.op else kind
        lines.append(f"| {kind} | {_cell(what)} | {error.__name__} | `{_cell(message)}` | "
                     f"{checked} ({source}) |")
    return "\n".join(lines)


def rewritten(text):
    """The doc's text with the table between the markers replaced."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv):
    with open(DOC) as f:
        text = f.read()
    new = rewritten(text)
    if "--check" in argv:
        if new != text:
            print(f"{DOC}: the table is stale; run python3 tests/python/bad_inputs.py")
            return 1
        return 0
    with open(DOC, "w") as f:
        f.write(new)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
