"""Tensors to the C++ launchers: validation, params, and a cache of validated layouts.

The shared core of :mod:`splitkv.attention` (the eager functions and the plan objects) and
:mod:`splitkv.ops` (the custom ops). Two paths reach the launchers:

- the full path (:func:`paged_params`, :func:`ragged_params`, :func:`run`): every torch-side
  check (_checks.py) and a C++ params struct filled field by field. Plans, the custom ops
  and the first call of each layout take it; every refusal's message comes from it.
- the per-call path (:func:`paged_call`, :func:`ragged_call`): a call whose layout (the
  classes, shapes, strides, dtypes and devices of its tensors, sinks, per-head scales,
  kv_offsets and full_seq_lens included, its options and its workspace's) passed the full
  path before reuses that path's params as a template (a C++ `PagedTemplate` /
  `RaggedTemplate`) and only supplies its addresses (one C++ call, the template's `launch`,
  which runs every C++ check again). The tensors' part of a layout's key is read in C++
  through torch's DLPack exchange table (tensor_reader.h: torch 2.10 and later; plain
  tensors only), else built from their Python attributes. What depends on the addresses is
  checked on every call, by that C++ call before it launches: a caller's `out` or the
  workspace sharing bytes with another tensor sends the call to the full path, which
  refuses it with its own message. Index values (CPU) and the counters are the C++
  launcher's, on every call.

Both paths launch the same work with the same params; only the host time differs.
"""

import math

import torch
from torch.autograd.graph import increment_version

from splitkv import _checks
from splitkv import _splitkv
from splitkv import workspace as workspace_module
from splitkv.workspace import Workspace
from splitkv.workspace import tensor_signature

# Keys read in C++ (python/splitkv/tensor_reader.h): the tensors' layouts as one bytes
# object, read through torch's DLPack exchange table in well under a microsecond, where the
# Python key takes several; the templates' launch asks the same table for the current
# stream. Off (None) before torch 2.10: then the Python key and torch's stream query.
_read_layouts = _splitkv.LayoutKey if _splitkv.InitTensorReader() is not None else None

PAGED = "paged_attention"
RAGGED = "ragged_attention"
KV_LAYOUTS = ("HND", "NHD")
# Axes of (page, kv head, slot) in a 4-D k or v cache of each layout.
_KV_AXES = {"HND": (0, 1, 2), "NHD": (0, 2, 1)}
_KV_SHAPES = {
    "HND": "[num_pages, num_kv_heads, page_size, head_dim]",
    "NHD": "[num_pages, page_size, num_kv_heads, head_dim]",
}



# ---- the full path: checks and params ----


def _query(op, q):
    _checks.tensor(op, "q", q)
    _checks.rank(op, "q", q, 3, "[total_q, num_qo_heads, head_dim]")
    dtype = _checks.attention_dtype(op, "q", q)
    backend = _checks.backend(op, q.device)
    _checks.inner_stride(op, "q", q)
    _checks.not_null(op, "q", q)
    return dtype, backend


def _operand(op, name, x, q, ndim, shape_doc, kv=False):
    """A tensor of q's dtype (or fp8 for K/V: `kv`) and device with a dense last dimension."""
    _checks.tensor(op, name, x)
    _checks.device(op, name, x, q.device)
    _checks.rank(op, name, x, ndim, shape_doc)
    if kv:
        _checks.kv_dtype(op, name, x, q)
    else:
        _checks.same_dtype(op, name, x, "q", q)
    _checks.inner_stride(op, name, x)
    _checks.not_null(op, name, x)


def _kv_storage(op, k, q, num_kv_heads, k_scale, v_scale):
    """The C++ KvStorage: fp8 (float8_e4m3fn) K/V with their scales, or as q."""
    storage = _splitkv.KvStorage()
    fp8 = k.dtype == torch.float8_e4m3fn
    if fp8 or k_scale is not None or v_scale is not None:
        storage.fp8_e4m3 = fp8
        storage.k_scale, storage.k_scales = _checks.kv_scale(op, "k_scale", k_scale, fp8, k.dtype,
                                                             num_kv_heads, q)
        storage.v_scale, storage.v_scales = _checks.kv_scale(op, "v_scale", v_scale, fp8, k.dtype,
                                                             num_kv_heads, q)
    return storage


def _head_dim(op, name, head_dim, q):
    if head_dim != q.shape[2]:
        _checks.fail(op, f"{name} head_dim", "mismatch", f"{q.shape[2]} (q.shape[2])", head_dim)


def _index(op, name, x, q, ndim):
    """An index tensor's checks; its device's only with q (a runner binds it before q)."""
    _checks.index_tensor(op, name, x, ndim)
    if q is not None:
        _checks.device(op, name, x, q.device)
        _checks.not_null(op, name, x)  # after the device's: a meta tensor's data_ptr() is 0


def longest(cu_seqlens):
    """The largest cu_seqlens[b + 1] - cu_seqlens[b] (0 for no requests); syncs on CUDA."""
    if cu_seqlens.numel() < 2:
        return 0
    return int((cu_seqlens[1:].to(torch.int64) - cu_seqlens[:-1].to(torch.int64)).max())


def _options(op, head_dim, causal, sm_scale, window_left, logits_soft_cap, num_splits,
             batch_invariant=False):
    options = _splitkv.AttentionOptions()
    options.causal = _checks.flag(op, "causal", causal)
    options.window_left = _checks.integer(op, "window_left", window_left, -1,
                                          "-1 (no window) or an int >= 0")
    options.logits_soft_cap = _checks.real(op, "logits_soft_cap", logits_soft_cap)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    options.sm_scale = _checks.real(op, "sm_scale", sm_scale)
    if num_splits is not None:
        options.num_splits = _checks.integer(op, "num_splits", num_splits, 1,
                                             "None (the planner chooses) or an int >= 1")
    options.batch_invariant = _checks.flag(op, "batch_invariant", batch_invariant)
    return options


def _workspace(op, workspace, q, operands):
    """The C++ view of the workspace, refused if it shares a byte with any of `operands`
    ((name, tensor or None) pairs): the call overwrites the bytes it plans to use."""
    buffer = _checks.workspace_tensor(op, workspace)
    _checks.device(op, "workspace", buffer, q.device)
    _checks.workspace_disjoint(op, buffer, operands)
    return workspace_module.c_workspace(workspace, buffer)


def _outputs(op, q, out, return_lse, launch):
    """out (given or new) and lse (new or None). A plan writes nothing: no allocation."""
    return_lse = _checks.flag(op, "return_lse", return_lse)
    if out is not None:
        _operand(op, "out", out, q, 3, "[total_q, num_qo_heads, head_dim]")
        _checks.same_shape(op, "out", out, "q", q)
        _checks.writable_out(op, out)
    elif launch:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = None
    if return_lse and launch:
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    return out, lse


def _fill_common(params, q, out, lse, dtype, backend, options, workspace):
    params.q = q.data_ptr()
    params.q_stride_token, params.q_stride_head = q.stride(0), q.stride(1)
    if out is not None:
        params.out = out.data_ptr()
        params.out_stride_token, params.out_stride_head = out.stride(0), out.stride(1)
    else:
        # A plan never writes: q's address stands in for out, with the strides of the
        # contiguous out a call would allocate.
        params.out = q.data_ptr()
        params.out_stride_token, params.out_stride_head = q.shape[1] * q.shape[2], q.shape[2]
    params.lse = lse.data_ptr() if lse is not None else 0
    params.total_q, params.num_qo_heads, params.head_dim = q.shape
    params.dtype = dtype
    params.backend = backend
    params.options = options
    params.workspace = workspace
    if q.device.type == "cuda":
        params.stream = torch.cuda.current_stream(q.device).cuda_stream


def run(op, launcher, params, q, workspace):
    """Calls `launcher` on `params`, holding the workspace for the call."""
    with workspace_module.exclusive(op, workspace), workspace_module.on_device(q.device):
        return launcher(params)


def plan(planner, params, q):
    """Calls `planner` on `params`. A plan reads only the workspace's size and address and
    writes nothing: it neither holds the workspace (a plan beside another thread's call on it
    is fine) nor joins its stream order."""
    with workspace_module.on_device(q.device):
        return planner(params)


# ---- paged ----


def _kv_layout_shape(op, kv_layout):
    """The 4-D shape text of a checked kv_layout."""
    if not isinstance(kv_layout, str):  # a wrong Python type is a TypeError, as everywhere
        _checks.fail(op, "kv_layout", "has the wrong type", "a str, 'HND' or 'NHD'",
                     type(kv_layout).__name__, error=TypeError)
    if kv_layout not in KV_LAYOUTS:
        _checks.fail(op, "kv_layout", "unknown", "'HND' or 'NHD'", repr(kv_layout))
    return _KV_SHAPES[kv_layout]


def _paged_kv(op, kv_cache, kv_layout, q):
    """k and v as 4-D tensors of the layout, from a 5-D cache or a (k, v) pair."""
    shape = _kv_layout_shape(op, kv_layout)
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            _checks.fail(op, "kv_cache", "has the wrong length", "a (k, v) pair of tensors",
                         f"{len(kv_cache)} items")
        (k, v), names = kv_cache, ("kv_cache[0]", "kv_cache[1]")
        for name, x in zip(names, (k, v)):
            _operand(op, name, x, q, 4, f"{shape} ({kv_layout})", kv=True)
        _checks.same_dtype(op, names[1], v, names[0], k)
        _checks.same_shape(op, names[1], v, names[0], k)
    else:
        five_d = shape.replace("[num_pages, ", "[num_pages, 2, ")
        _operand(op, "kv_cache", kv_cache, q, 5, f"{five_d} ({kv_layout})", kv=True)
        _checks.dim(op, "kv_cache", kv_cache, 1, 2, "k and v")
        k, v, names = kv_cache[:, 0], kv_cache[:, 1], ("kv_cache", "kv_cache")
    _head_dim(op, names[0], k.shape[3], q)
    return k, v


def _scales(k_scale, v_scale):
    """(name, tensor) of the per-kv-head scale tensors given, for the overlap checks (a
    float scale has no bytes)."""
    return [(name, x) for name, x in (("k_scale", k_scale), ("v_scale", v_scale))
            if isinstance(x, torch.Tensor)]


def _key_positions(op, kv_offsets, full_seq_lens, q, batch_size):
    """kv_offsets and full_seq_lens: both None, or both int32 ``[batch_size]``, contiguous,
    on q's device (their values: the C++ launcher's, on the CPU)."""
    if (kv_offsets is None) != (full_seq_lens is None):
        given = "kv_offsets" if full_seq_lens is None else "full_seq_lens"
        _checks.fail(op, "kv_offsets/full_seq_lens", "given without the other", "both or neither",
                     f"{given} only")
    if kv_offsets is None:
        return
    for name, x in (("kv_offsets", kv_offsets), ("full_seq_lens", full_seq_lens)):
        _index(op, name, x, q, 1)
        _checks.dim(op, name, x, 0, batch_size, "batch_size, block_tables.shape[0]")


def _paged_indices(op, block_tables, seq_lens, cu_seqlens_q, kv_offsets, full_seq_lens, q):
    """paged_params' checks of the index tensors (q None: all but their devices'); returns
    (batch_size, max_pages_per_seq)."""
    _index(op, "block_tables", block_tables, q, 2)
    _index(op, "seq_lens", seq_lens, q, 1)
    batch_size, max_pages_per_seq = block_tables.shape
    if batch_size > 1 and 0 != block_tables.stride(0) < max_pages_per_seq:
        # Named as the caller knows it (the C++ core refuses the same as block_tables_stride).
        _checks.fail(op, "block_tables.stride(0)", "out of range",
                     f"0 (one row for every request) or >= max_pages_per_seq = "
                     f"{max_pages_per_seq} (rows that do not overlap)", block_tables.stride(0))
    _checks.dim(op, "seq_lens", seq_lens, 0, batch_size, "batch_size, block_tables.shape[0]")
    if cu_seqlens_q is not None:
        _index(op, "cu_seqlens_q", cu_seqlens_q, q, 1)
        _checks.dim(op, "cu_seqlens_q", cu_seqlens_q, 0, batch_size + 1,
                    "batch_size + 1, block_tables.shape[0] + 1")
    _key_positions(op, kv_offsets, full_seq_lens, q, batch_size)
    return batch_size, max_pages_per_seq


def check_paged_binding(block_tables, seq_lens, cu_seqlens_q, kv_offsets, full_seq_lens,
                        kv_layout, max_q_len, causal, sm_scale, window_left, logits_soft_cap,
                        num_splits, batch_invariant, return_lse):
    """paged_params' checks that need no q, cache or out, in its order and with its messages,
    the C++ option checks last as in the launchers: a PagedAttentionRunner's construction."""
    _kv_layout_shape(PAGED, kv_layout)
    _paged_indices(PAGED, block_tables, seq_lens, cu_seqlens_q, kv_offsets, full_seq_lens, None)
    _check_binding_tail(PAGED, max_q_len, 1, causal, sm_scale, window_left, logits_soft_cap,
                        num_splits, batch_invariant, return_lse)


def _check_binding_tail(op, max_q_len, min_q_len, causal, sm_scale, window_left,
                        logits_soft_cap, num_splits, batch_invariant, return_lse):
    if max_q_len is not None:
        _checks.integer(op, "max_q_len", max_q_len, min_q_len, f"an int >= {min_q_len}")
    options = _options(op, 1, causal, sm_scale, window_left, logits_soft_cap, num_splits,
                       batch_invariant)
    _checks.flag(op, "return_lse", return_lse)
    if sm_scale is None:  # the default needs q's head_dim; any finite value passes
        options.sm_scale = 1.0
    _splitkv.CheckOptions(op, options)


def paged_params(op, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
                  sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out,
                  max_q_len, launch, batch_invariant=False, sinks=None, k_scale=None, v_scale=None,
                  kv_offsets=None, full_seq_lens=None):
    dtype, backend = _query(op, q)
    k, v = _paged_kv(op, kv_cache, kv_layout, q)
    batch_size, max_pages_per_seq = _paged_indices(op, block_tables, seq_lens, cu_seqlens_q,
                                                   kv_offsets, full_seq_lens, q)
    if max_q_len is None:
        max_q_len = max(1, longest(cu_seqlens_q)) if cu_seqlens_q is not None else 1
    else:
        max_q_len = _checks.integer(op, "max_q_len", max_q_len, 1, "an int >= 1")
    options = _options(op, q.shape[2], causal, sm_scale, window_left, logits_soft_cap, num_splits,
                       batch_invariant)
    options.sinks = _checks.sinks(op, sinks, q)
    out, lse = _outputs(op, q, out, return_lse, launch)
    scales = _scales(k_scale, v_scale)
    # Index tensors too: the kernels read them while other tasks write out (an out over
    # seq_lens could send a later read past the cache).
    _checks.disjoint(op, "out", out, [("q", q), ("kv_cache", k), ("kv_cache", v),
                                      ("sinks", sinks), ("block_tables", block_tables),
                                      ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q),
                                      ("kv_offsets", kv_offsets),
                                      ("full_seq_lens", full_seq_lens)] + scales,
                     "tensor", "attention is not computed in place")
    ws = _workspace(op, workspace, q, [
        ("q", q), ("kv_cache", k), ("kv_cache", v), ("block_tables", block_tables),
        ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q), ("out", out), ("lse", lse),
        ("sinks", sinks), ("kv_offsets", kv_offsets), ("full_seq_lens", full_seq_lens)] + scales)

    params = _splitkv.PagedAttentionParams()
    _fill_common(params, q, out, lse, dtype, backend, options, ws)
    page_axis, head_axis, slot_axis = _KV_AXES[kv_layout]
    params.k_cache, params.v_cache = k.data_ptr(), v.data_ptr()
    params.k_stride_page, params.k_stride_head, params.k_stride_slot = (
        k.stride(page_axis), k.stride(head_axis), k.stride(slot_axis))
    params.v_stride_page, params.v_stride_head, params.v_stride_slot = (
        v.stride(page_axis), v.stride(head_axis), v.stride(slot_axis))
    params.num_pages, params.num_kv_heads, params.page_size = (
        k.shape[page_axis], k.shape[head_axis], k.shape[slot_axis])
    params.kv_storage = _kv_storage(op, k, q, params.num_kv_heads, k_scale, v_scale)
    params.block_tables = block_tables.data_ptr()
    # One row: its stride is meaningless to torch (may be anything), not to the kernels.
    params.block_tables_stride = block_tables.stride(0) if batch_size > 1 else max_pages_per_seq
    params.seq_lens = seq_lens.data_ptr()
    params.cu_seqlens_q = cu_seqlens_q.data_ptr() if cu_seqlens_q is not None else 0
    if kv_offsets is not None:
        params.kv_offsets, params.full_seq_lens = kv_offsets.data_ptr(), full_seq_lens.data_ptr()
    params.batch_size = batch_size
    params.max_pages_per_seq = max_pages_per_seq
    params.max_q_len = max_q_len
    if q.device.type == "cpu" and batch_size > 0:
        # The split heuristic's bound on keys; free to read on the host (0: the capacity).
        capacity = max_pages_per_seq * params.page_size
        params.max_kv_len = max(0, min(int(seq_lens.max()), capacity))
    return params, out, lse


# ---- ragged ----


def _ragged_indices(op, cu_seqlens_q, cu_seqlens_kv, q):
    """ragged_params' checks of cu_seqlens_q / cu_seqlens_kv (q None: all but their
    devices'); returns batch_size."""
    _index(op, "cu_seqlens_q", cu_seqlens_q, q, 1)
    _index(op, "cu_seqlens_kv", cu_seqlens_kv, q, 1)
    if cu_seqlens_q.numel() < 1:
        _checks.fail(op, "cu_seqlens_q", "is empty", "[batch_size + 1] prefix sums from 0",
                     "shape (0,)")
    batch_size = cu_seqlens_q.numel() - 1
    _checks.dim(op, "cu_seqlens_kv", cu_seqlens_kv, 0, batch_size + 1,
                "batch_size + 1, cu_seqlens_q.shape[0]")
    return batch_size


def check_ragged_binding(cu_seqlens_q, cu_seqlens_kv, max_q_len, causal, sm_scale, window_left,
                         logits_soft_cap, num_splits, batch_invariant, return_lse):
    """As check_paged_binding, for a RaggedAttentionRunner."""
    _ragged_indices(RAGGED, cu_seqlens_q, cu_seqlens_kv, None)
    _check_binding_tail(RAGGED, max_q_len, 0, causal, sm_scale, window_left, logits_soft_cap,
                        num_splits, batch_invariant, return_lse)


def ragged_params(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale,
                   window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len, launch,
                   batch_invariant=False, sinks=None, k_scale=None, v_scale=None):
    dtype, backend = _query(op, q)
    kv_shape = "[total_kv, num_kv_heads, head_dim]"
    _operand(op, "k", k, q, 3, kv_shape, kv=True)
    _operand(op, "v", v, q, 3, kv_shape, kv=True)
    _checks.same_dtype(op, "v", v, "k", k)
    _checks.same_shape(op, "v", v, "k", k)
    _head_dim(op, "k", k.shape[2], q)
    batch_size = _ragged_indices(op, cu_seqlens_q, cu_seqlens_kv, q)
    if max_q_len is None:
        max_q_len = longest(cu_seqlens_q)
    else:
        max_q_len = _checks.integer(op, "max_q_len", max_q_len, 0, "an int >= 0")
    options = _options(op, q.shape[2], causal, sm_scale, window_left, logits_soft_cap, num_splits,
                       batch_invariant)
    options.sinks = _checks.sinks(op, sinks, q)
    out, lse = _outputs(op, q, out, return_lse, launch)
    scales = _scales(k_scale, v_scale)
    _checks.disjoint(op, "out", out, [("q", q), ("k", k), ("v", v), ("sinks", sinks),
                                      ("cu_seqlens_q", cu_seqlens_q),
                                      ("cu_seqlens_kv", cu_seqlens_kv)]
                     + scales, "tensor", "attention is not computed in place")
    ws = _workspace(op, workspace, q, [
        ("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_kv", cu_seqlens_kv), ("out", out), ("lse", lse), ("sinks", sinks)] + scales)

    params = _splitkv.RaggedAttentionParams()
    _fill_common(params, q, out, lse, dtype, backend, options, ws)
    params.k, params.v = k.data_ptr(), v.data_ptr()
    params.k_stride_token, params.k_stride_head = k.stride(0), k.stride(1)
    params.v_stride_token, params.v_stride_head = v.stride(0), v.stride(1)
    params.cu_seqlens_q = cu_seqlens_q.data_ptr()
    params.cu_seqlens_kv = cu_seqlens_kv.data_ptr()
    params.batch_size = batch_size
    params.total_kv, params.num_kv_heads = k.shape[0], k.shape[1]
    params.kv_storage = _kv_storage(op, k, q, k.shape[1], k_scale, v_scale)
    params.max_q_len = max_q_len
    if q.device.type == "cpu":
        # The split heuristic's bound on keys; free to read on the host (0: total_kv).
        params.max_kv_len = max(0, min(longest(cu_seqlens_kv), k.shape[0]))
    return params, out, lse


# ---- the per-call path: a cache of validated layouts ----

# Layouts that passed the full path, by key (_paged_key, _ragged_key). Bounded: a process
# that keeps making new shapes (every batch size of a server) forgets them all at once and
# starts over, which costs one full-path call per layout.
# A template's launch from a LayoutKey result: raw C++ functions (pybind11's dispatch of a
# method would cost ~0.5 us a call).
_READ_LAUNCHES = {_splitkv.PagedTemplate: _splitkv.LaunchPagedRead,
                  _splitkv.RaggedTemplate: _splitkv.LaunchRaggedRead}
_MAX_LAYOUTS = 1024
_layouts = {}


def _extent(x):
    """Bytes from x's first to its last element (0 if absent or empty): the span _checks
    compares."""
    if x is None or x.numel() == 0:
        return 0
    begin, end = _checks._byte_span(x)
    return end - begin


class _Layout:
    """A validated layout: the C++ template (the full path's params and the byte extents of
    the call's tensors, for the overlap checks; `launch` is its bound launch), and what a call
    of this layout needs besides addresses (the shapes of new outputs, where the work runs)."""

    __slots__ = ("template", "launch", "launch_read", "max_q_len", "out_shape", "lse_shape", "cuda", "device",
                 "v_offset", "host_max_q_len", "q_contiguous", "plain_q", "index", "read_stream")

    def __init__(self, template, params, q, operands, max_q_len, cu_seqlens_q, v_offset=None):
        # Extents in the order the call passes the addresses: the inputs, then out.
        self.template = template(params, [_extent(x) for x in operands], v_offset)
        self.launch = self.template.launch
        self.launch_read = _READ_LAUNCHES[template]
        self.max_q_len = params.max_q_len
        self.out_shape = tuple(q.shape)
        # A new out is contiguous (the template's out strides): empty_like(q) makes one
        # when q's strides are exactly those (and costs less than new_empty); a contiguous q
        # may have other strides on a dimension of size 1, which empty_like would copy.
        self.q_contiguous = q.stride() == torch.empty(q.shape, device="meta").stride()
        self.plain_q = q.__class__ is torch.Tensor
        self.lse_shape = tuple(q.shape[:2])
        self.device = q.device
        self.cuda = q.device.type == "cuda"
        # The launches' device and stream: on CUDA the device's index and None (the C++ call
        # asks torch's DLPack table for the current stream), on the CPU -1 and 0.
        self.index = q.device.index if self.cuda else -1
        self.read_stream = None if self.cuda else 0
        self.v_offset = v_offset
        # max_q_len left to the call: computed from cu_seqlens_q on the host (by the C++
        # binding on the CPU, where it is free; with a sync on CUDA, as the full path does).
        self.host_max_q_len = max_q_len is None and cu_seqlens_q is not None


def _remember(key, layout):
    if len(_layouts) >= _MAX_LAYOUTS:
        _layouts.clear()
    _layouts[key] = layout


def workspace_view(workspace):
    """(buffer, signature, C++ view, busy key, stream order, address) of a workspace, cached
    by a Workspace (Workspace._launch_view)."""
    if workspace.__class__ is Workspace:
        return workspace._launch_view()
    return (workspace, tensor_signature(workspace), None, None, None, None)


def _user_view(workspace, buffer):
    """(C++ view, busy key, stream order) of a workspace given as a user's tensor (a Workspace
    caches them in its _launch_view)."""
    busy = workspace_module.busy_key(buffer)
    return (workspace_module.c_workspace(workspace, buffer), busy,
            workspace_module.stream_order(busy, buffer.device))


def launch_layout(layout, addresses, workspace, view, max_q_len, k_scale, v_scale):
    """Launches a call of `layout` from its addresses (the inputs, out, lse), holding the
    workspace (the per-call path of a call keyed in Python; launch_read is the C++ key's).
    False, having launched nothing, when a tensor's storage was freed (a null address), out
    or the workspace shares bytes with another tensor of the call, or another call holds the
    workspace: the full path then refuses it with its message, in its order."""
    if workspace_module.CHECK_EVERY_CALL:
        # SPLITKV_CHECK_WORKSPACE=1 (a debugging mode): the full path, whose scans of the
        # counter region come after its own checks (an overlap is named first there).
        return False
    buffer, _, c_workspace, busy, order, _ = view
    if c_workspace is None:
        c_workspace, busy, order = _user_view(workspace, buffer)
    scales = (_NO_SCALES if k_scale is None and v_scale is None
              else _scale_addresses(k_scale, v_scale))
    if not workspace_module.claim(busy):
        # Held by another call: the full path refuses it, after its own checks (an overlap
        # is named first there), so both paths give one message.
        return False
    try:
        # On CUDA the C++ call makes the tensors' device current for the launch (and back),
        # and runs the stream order (wait for the workspace's last launch on another stream,
        # record this one) around it; stream None: it asks torch's DLPack table for the
        # current one. On the CPU index is -1, stream 0 and order None.
        stream = (workspace_module.current_raw_stream(layout.index)
                  if layout.cuda and _read_layouts is None else layout.read_stream)
        return layout.launch(*addresses, c_workspace, stream, layout.index, max_q_len, *scales,
                             order)
    finally:
        workspace_module.release(busy)


def launch_read(layout, view, read, q, workspace, return_lse, out, cu_seqlens_q, paged):
    """A call of `layout` from LayoutKey's result `read` (the inputs' addresses came with the
    key), holding the workspace: (out, lse), or None, having launched nothing, when `out` is
    not writable in place, or as launch_layout (the full path then refuses it with its
    message). The per-call path of every call keyed in C++ (paged_call, ragged_call, the
    runners), written as one function: a Python call costs a few tenths of a microsecond,
    and this path is most of a call's host time (launch_layout is the same for addresses)."""
    if workspace_module.CHECK_EVERY_CALL or (out is not None and not _checks.out_writable(out)):
        return None  # the full path: as in launch_layout; for out, it says why
    if out is None or return_lse:
        result, lse = new_outputs(layout, q, out, return_lse)
    else:
        result, lse = out, None
    buffer, _, c_workspace, busy, order, _ = view
    if c_workspace is None:
        c_workspace, busy, order = _user_view(workspace, buffer)
    if not workspace_module.claim(busy):
        return None  # as in launch_layout
    try:
        # As launch_layout's.
        if not layout.launch_read(layout.template, read, result.data_ptr(),
                                  0 if lse is None else lse.data_ptr(), c_workspace,
                                  layout.read_stream, layout.index,
                                  call_max_q_len(layout, cu_seqlens_q, paged)
                                  if layout.host_max_q_len else layout.max_q_len, order):
            return None
    finally:
        workspace_module.release(busy)
    if out is not None:
        increment_version(out)  # as written()
    return result, lse


def call_max_q_len(layout, cu_seqlens_q, paged):
    """max_q_len for the C++ binding: the validated one of the layout (given, or 1 for paged
    calls without cu_seqlens_q), -1 (computed there from host memory, CPU), or from
    cu_seqlens_q with a device sync (CUDA), exactly as the full path computes it."""
    if not layout.host_max_q_len:
        return layout.max_q_len
    if not layout.cuda:
        return -1
    return max(1, longest(cu_seqlens_q)) if paged else longest(cu_seqlens_q)


def new_outputs(layout, q, out, return_lse):
    if not layout.plain_q:
        # q a torch.Tensor subclass: plain tensors, as the full path (_outputs) makes them
        # (empty_like / new_empty would return q's class through its __torch_function__).
        if out is None:
            out = torch.empty(layout.out_shape, dtype=q.dtype, device=q.device)
        lse = (torch.empty(layout.lse_shape, dtype=torch.float32, device=q.device)
               if return_lse else None)
        return out, lse
    if out is None:
        out = torch.empty_like(q) if layout.q_contiguous else q.new_empty(layout.out_shape)
    lse = q.new_empty(layout.lse_shape, dtype=torch.float32) if return_lse else None
    return out, lse


def _option_key(*options):
    """The options part of a layout key: the values, and their types (True == 1 and
    hash(True) == hash(1), yet the full path refuses a bool where it wants an int)."""
    return options, tuple(map(type, options))


def value_signature(x):
    """tensor_signature of a tensor whose values the call reads or writes, with its neg bit
    (a negated view has the layout of any other tensor; the full path refuses it)."""
    return tensor_signature(x), x.is_neg()


def out_key(out):
    """The key's part for a caller's out; raises (sending the call to the full path, which
    refuses it) for an out torch forbids writing in place."""
    if out is None:
        return None
    writable(out)
    return value_signature(out)


def writable(out):
    """Raises for a caller's out torch forbids writing in place: no key, so the call takes
    the full path, which refuses it with its message."""
    if out is not None and not _checks.out_writable(out):
        raise ValueError("out not writable in place")


def written(out):
    """Marks a caller's out as written in place (its version counter, as torch's own out=
    ops do), so autograd refuses a graph that saved its old values."""
    if out is not None:
        increment_version(out)


def extras(sinks, k_scale, v_scale, kv_offsets=None, full_seq_lens=None):
    """The key's part for sinks, scales, kv_offsets and full_seq_lens: None without any (the
    usual case, and cheap); else their layouts (tensor_signature) or values and types, never
    a tensor's identity or values (both change from call to call)."""
    if (sinks is None and k_scale is None and v_scale is None and kv_offsets is None
            and full_seq_lens is None):
        return None
    return (None if sinks is None else value_signature(sinks),
            _tensor_or_value(k_scale), k_scale.__class__,
            _tensor_or_value(v_scale), v_scale.__class__,
            None if kv_offsets is None else value_signature(kv_offsets),
            None if full_seq_lens is None else value_signature(full_seq_lens))


def kv_cache_key(kv_cache):
    """The key's part for a paged call's kv_cache (a 5-D tensor or a (k, v) pair)."""
    if kv_cache.__class__ is tuple or kv_cache.__class__ is list:
        return (len(kv_cache),) + tuple(value_signature(x) for x in kv_cache)
    return (kv_cache.__class__, kv_cache.shape, kv_cache.stride(), kv_cache.dtype,
            kv_cache.device, kv_cache.is_neg())


def _split_scales(k_scale, v_scale):
    """(k_scale, v_scale) split for LayoutKey: the per-head scale tensors (among its tensors)
    and the float scales (among its option values), None for what is not there."""
    k_tensor, v_tensor = _scale_tensors(k_scale, v_scale)
    return (k_tensor, v_tensor, None if k_tensor is not None else k_scale,
            None if v_tensor is not None else v_scale)


# A paged call's kv_cache form, an option value of its key (a pair's tensors read the same as
# a tuple or a list; the full path checks the container too).
_KV_FORMS = {tuple: 1, list: 2}


def paged_read_key(q, kv_cache, block_tables, seq_lens, workspace_signature, cu_seqlens_q, out,
                   options, sinks, k_scale, v_scale, kv_offsets, full_seq_lens):
    """(the paged key from LayoutKey, LayoutKey's result), or None when it cannot read every
    tensor or option value (a subclass, a negated view, ...: the Python key then holds what
    the full path must see). `options`: a tuple of the call's option values. The tensors go
    in the template's input order, out last (launch_read)."""
    if _read_layouts is None:
        return None
    form = _KV_FORMS.get(kv_cache.__class__, 0)
    if form:
        k, v = kv_cache
    else:
        k, v = kv_cache, None  # a 5-D cache
    if k_scale is None and v_scale is None:  # the usual case, without a call
        k_tensor = v_tensor = k_value = v_value = None
    else:
        k_tensor, v_tensor, k_value, v_value = _split_scales(k_scale, v_scale)
    read = _read_layouts((PAGED, form, k_value, v_value, *options), q, k, v, sinks, block_tables,
                         seq_lens, cu_seqlens_q, kv_offsets, full_seq_lens, k_tensor, v_tensor,
                         out)
    if read is None:
        return None
    return (read[0], workspace_signature), read


def ragged_read_key(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace_signature, out, options,
                    sinks, k_scale, v_scale):
    """As paged_read_key, for a ragged call."""
    if _read_layouts is None:
        return None
    if k_scale is None and v_scale is None:
        k_tensor = v_tensor = k_value = v_value = None
    else:
        k_tensor, v_tensor, k_value, v_value = _split_scales(k_scale, v_scale)
    read = _read_layouts((RAGGED, k_value, v_value, *options), q, k, v, sinks, cu_seqlens_q,
                         cu_seqlens_kv, k_tensor, v_tensor, out)
    if read is None:
        return None
    return (read[0], workspace_signature), read


def _paged_key(q, kv_cache, block_tables, seq_lens, workspace_signature, cu_seqlens_q, out,
               options, extras):
    # tensor_signature of each tensor, written out flat: one call fewer per tensor.
    return (PAGED, q.__class__, q.shape, q.stride(), q.dtype, q.device, q.is_neg(),
            kv_cache_key(kv_cache),
            block_tables.__class__, block_tables.shape, block_tables.stride(), block_tables.dtype,
            block_tables.device, block_tables.is_neg(), seq_lens.__class__, seq_lens.shape,
            seq_lens.stride(), seq_lens.dtype, seq_lens.device, seq_lens.is_neg(),
            None if cu_seqlens_q is None else value_signature(cu_seqlens_q),
            out_key(out), workspace_signature, options, extras)


def _tensor_or_value(x):
    """A hashable stand-in for an option that may be a tensor (a per-head scale): its
    layout, never its identity or values (both change from call to call)."""
    return ("tensor",) + value_signature(x) if isinstance(x, torch.Tensor) else x


def _scale_tensors(k_scale, v_scale):
    """The per-head scale tensors among a layout's inputs (None for a float or None: the
    template holds the float), for their extents."""
    return tuple(s if isinstance(s, torch.Tensor) else None for s in (k_scale, v_scale))


_NO_SCALES = (0, 0)


def _scale_addresses(k_scale, v_scale):
    """(k_scales, v_scales) addresses for the templates' launch: a per-head scale tensor's,
    0 for a float or None (the template holds the float)."""
    return (k_scale.data_ptr() if isinstance(k_scale, torch.Tensor) else 0,
            v_scale.data_ptr() if isinstance(v_scale, torch.Tensor) else 0)


def _paged_lookup(q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
                  sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out,
                  max_q_len, batch_invariant, sinks, k_scale, v_scale, kv_offsets, full_seq_lens):
    """(workspace view, key, cached layout or None, LayoutKey's result or None) of a paged
    call; key None when the arguments cannot make one."""
    # Every argument the full path's checks read, except tensor addresses and index values.
    # Sinks, per-head scales, kv_offsets and full_seq_lens enter by their layout
    # (tensor_signature), their addresses per call.
    try:
        view = (workspace._launch_view() if workspace.__class__ is Workspace
                else workspace_view(workspace))  # workspace_view, a call fewer
        options = (kv_layout, sm_scale, causal, window_left, logits_soft_cap, num_splits,
                   return_lse, max_q_len, batch_invariant)
        key_read = paged_read_key(q, kv_cache, block_tables, seq_lens, view[1], cu_seqlens_q,
                                  out, options, sinks, k_scale, v_scale, kv_offsets,
                                  full_seq_lens)
        if key_read is None:
            key_read = (_paged_key(q, kv_cache, block_tables, seq_lens, view[1], cu_seqlens_q,
                                   out, _option_key(*options),
                                   extras(sinks, k_scale, v_scale, kv_offsets, full_seq_lens)),
                        None)
        return view, key_read[0], _layouts.get(key_read[0]), key_read[1]
    except Exception:  # noqa: BLE001 - not tensors, sparse ones, unhashable options: the
        return None, None, None, None  # full path checks them and says what is wrong


def paged_layout(*args):
    """The validated layout a paged call of these arguments (paged_call's, from q on) left
    in the cache, or None: what splitkv.runners keeps after a run took the full path."""
    return _paged_lookup(*args)[2]


def launch_paged_layout(layout, view, q, kv_cache, block_tables, seq_lens, workspace,
                        cu_seqlens_q, return_lse, out, sinks, k_scale, v_scale, kv_offsets,
                        full_seq_lens):
    """A paged call of a validated `layout` from its tensors' addresses (the per-call path of
    a call keyed in Python, in paged_call and a PagedAttentionRunner's run; launch_read is
    the C++ key's): (out, lse), or None, having launched nothing, as launch_layout."""
    if layout.v_offset is None:
        k_address, v_address = kv_cache[0].data_ptr(), kv_cache[1].data_ptr()
    else:
        k_address = kv_cache.data_ptr()
        v_address = k_address + layout.v_offset
    result, lse = new_outputs(layout, q, out, return_lse)
    addresses = (q.data_ptr(), k_address, v_address, 0 if sinks is None else sinks.data_ptr(),
                 block_tables.data_ptr(), seq_lens.data_ptr(),
                 0 if cu_seqlens_q is None else cu_seqlens_q.data_ptr(),
                 0 if kv_offsets is None else kv_offsets.data_ptr(),
                 0 if full_seq_lens is None else full_seq_lens.data_ptr(), result.data_ptr(),
                 0 if lse is None else lse.data_ptr())
    if not launch_layout(layout, addresses, workspace, view,
                         call_max_q_len(layout, cu_seqlens_q, True), k_scale, v_scale):
        return None
    written(out)
    return result, lse


def paged_call(op, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
               sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out,
               max_q_len, batch_invariant=False, sinks=None, k_scale=None, v_scale=None,
               kv_offsets=None, full_seq_lens=None):
    """Runs paged attention; returns (out, lse). The per-call path when the layout is
    known, else (and to refuse) the full path, which then remembers the layout."""
    view, key, layout, read = _paged_lookup(q, kv_cache, block_tables, seq_lens, workspace,
                                            cu_seqlens_q, kv_layout, sm_scale, causal,
                                            window_left, logits_soft_cap, num_splits, return_lse,
                                            out, max_q_len, batch_invariant, sinks, k_scale,
                                            v_scale, kv_offsets, full_seq_lens)
    if layout is not None:
        ran = (launch_read(layout, view, read, q, workspace, return_lse, out, cu_seqlens_q,
                           True) if read is not None else
               launch_paged_layout(layout, view, q, kv_cache, block_tables, seq_lens,
                                   workspace, cu_seqlens_q, return_lse, out, sinks, k_scale,
                                   v_scale, kv_offsets, full_seq_lens))
        if ran is not None:
            return ran
    params, new_out, lse = paged_params(
        op, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout, sm_scale,
        causal, window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len,
        launch=True, batch_invariant=batch_invariant, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
        kv_offsets=kv_offsets, full_seq_lens=full_seq_lens)
    if key is not None and layout is None:
        _remember(key, _paged_layout(params, q, kv_cache, block_tables, seq_lens, cu_seqlens_q,
                                     out, max_q_len, sinks, kv_offsets, full_seq_lens, k_scale,
                                     v_scale))
    run(op, _splitkv.LaunchPagedAttention, params, q, workspace)
    written(out)
    return new_out, lse


def _paged_layout(params, q, kv_cache, block_tables, seq_lens, cu_seqlens_q, out, max_q_len, sinks,
                  kv_offsets, full_seq_lens, k_scale, v_scale):
    if isinstance(kv_cache, (tuple, list)):
        k, v = kv_cache
        v_offset = None
    else:
        k, v = kv_cache[:, 0], kv_cache[:, 1]
        v_offset = v.data_ptr() - k.data_ptr()
    layout = _Layout(_splitkv.PagedTemplate, params, q,
                     (q, k, v, sinks, block_tables, seq_lens, cu_seqlens_q, kv_offsets,
                      full_seq_lens, *_scale_tensors(k_scale, v_scale), out), max_q_len,
                     cu_seqlens_q, v_offset)
    return layout


def _ragged_key(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace_signature, out, options, extras):
    return (RAGGED, q.__class__, q.shape, q.stride(), q.dtype, q.device, q.is_neg(),
            k.__class__, k.shape, k.stride(), k.dtype, k.device, k.is_neg(),
            v.__class__, v.shape, v.stride(), v.dtype, v.device, v.is_neg(),
            cu_seqlens_q.__class__, cu_seqlens_q.shape, cu_seqlens_q.stride(), cu_seqlens_q.dtype,
            cu_seqlens_q.device, cu_seqlens_q.is_neg(), cu_seqlens_kv.__class__, cu_seqlens_kv.shape,
            cu_seqlens_kv.stride(), cu_seqlens_kv.dtype, cu_seqlens_kv.device, cu_seqlens_kv.is_neg(),
            out_key(out), workspace_signature, options, extras)


def _ragged_lookup(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale,
                   window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len,
                   batch_invariant, sinks, k_scale, v_scale):
    """As _paged_lookup, for a ragged call."""
    try:
        view = (workspace._launch_view() if workspace.__class__ is Workspace
                else workspace_view(workspace))  # workspace_view, a call fewer
        options = (causal, sm_scale, window_left, logits_soft_cap, num_splits, return_lse,
                   max_q_len, batch_invariant)
        key_read = ragged_read_key(q, k, v, cu_seqlens_q, cu_seqlens_kv, view[1], out, options,
                                   sinks, k_scale, v_scale)
        if key_read is None:
            key_read = (_ragged_key(q, k, v, cu_seqlens_q, cu_seqlens_kv, view[1], out,
                                    _option_key(*options), extras(sinks, k_scale, v_scale)),
                        None)
        return view, key_read[0], _layouts.get(key_read[0]), key_read[1]
    except Exception:  # noqa: BLE001 - as in _paged_lookup
        return None, None, None, None


def ragged_layout(*args):
    """As paged_layout, for ragged_call's arguments from q on."""
    return _ragged_lookup(*args)[2]


def launch_ragged_layout(layout, view, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace,
                         return_lse, out, sinks, k_scale, v_scale):
    """As launch_paged_layout, for a ragged layout."""
    result, lse = new_outputs(layout, q, out, return_lse)
    addresses = (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                 0 if sinks is None else sinks.data_ptr(), cu_seqlens_q.data_ptr(),
                 cu_seqlens_kv.data_ptr(), result.data_ptr(), 0 if lse is None else lse.data_ptr())
    if not launch_layout(layout, addresses, workspace, view,
                         call_max_q_len(layout, cu_seqlens_q, False), k_scale, v_scale):
        return None
    written(out)
    return result, lse


def ragged_call(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale,
                window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len,
                batch_invariant=False, sinks=None, k_scale=None, v_scale=None):
    """Runs ragged attention; returns (out, lse). Paths as :func:`paged_call`."""
    view, key, layout, read = _ragged_lookup(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace,
                                             causal, sm_scale, window_left, logits_soft_cap,
                                             num_splits, return_lse, out, max_q_len,
                                             batch_invariant, sinks, k_scale, v_scale)
    if layout is not None:
        ran = (launch_read(layout, view, read, q, workspace, return_lse, out, cu_seqlens_q,
                           False) if read is not None else
               launch_ragged_layout(layout, view, q, k, v, cu_seqlens_q, cu_seqlens_kv,
                                    workspace, return_lse, out, sinks, k_scale, v_scale))
        if ran is not None:
            return ran
    params, new_out, lse = ragged_params(
        op, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale, window_left,
        logits_soft_cap, num_splits, return_lse, out, max_q_len, launch=True,
        batch_invariant=batch_invariant, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    if key is not None and layout is None:
        _remember(key, _Layout(_splitkv.RaggedTemplate, params, q,
                               (q, k, v, sinks, cu_seqlens_q, cu_seqlens_kv,
                                *_scale_tensors(k_scale, v_scale), out), max_q_len,
                               cu_seqlens_q))
    run(op, _splitkv.LaunchRaggedAttention, params, q, workspace)
    written(out)
    return new_out, lse
