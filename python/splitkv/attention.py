"""paged_attention and ragged_attention: torch tensors in, the C++ launchers underneath.

This module turns tensors into the C++ param structs (pointers, shapes, strides in
elements, dtype codes, a stream handle), applies defaults, and checks what only the torch
side can see (_checks.py). Values are validated by the C++ core, whose errors arrive as
ValueError; nothing here computes a workspace offset.
"""

import contextlib
import dataclasses
import math

import torch

from splitkv import _checks
from splitkv import _splitkv
from splitkv.workspace import WorkspaceLayout, exclusive, status_host_address

_PAGED = "paged_attention"
_RAGGED = "ragged_attention"
_KV_LAYOUTS = ("HND", "NHD")
# Axes of (page, kv head, slot) in a 4-D k or v cache of each layout.
_KV_AXES = {"HND": (0, 1, 2), "NHD": (0, 2, 1)}
_KV_SHAPES = {
    "HND": "[num_pages, num_kv_heads, page_size, head_dim]",
    "NHD": "[num_pages, page_size, num_kv_heads, head_dim]",
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a call runs: its split count and the workspace bytes it uses.

    Attributes
    ----------
    num_splits : int
        Splits of each request's KV (1: no split, the output is written directly).
    layout : WorkspaceLayout
        Byte ranges of the counter, softmax and scratch regions for this call.
    num_tiles : int
        Work tiles (request x kv head x query tile); with num_splits > 1 each owns the
        counter at index tile (bytes 4 * tile .. 4 * tile + 4).
    """

    num_splits: int
    layout: WorkspaceLayout
    num_tiles: int = 0

    @classmethod
    def _from_ext(cls, plan):
        return cls(plan.num_splits, WorkspaceLayout._from_ext(plan.layout), plan.num_tiles)


# ---- shared pieces ----


def _query(op, q):
    _checks.tensor(op, "q", q)
    _checks.rank(op, "q", q, 3, "[total_q, num_qo_heads, head_dim]")
    dtype = _checks.attention_dtype(op, "q", q)
    backend = _checks.backend(op, q.device)
    _checks.inner_stride(op, "q", q)
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
    _checks.index_tensor(op, name, x, ndim)
    _checks.device(op, name, x, q.device)


def _longest(cu_seqlens):
    """The largest cu_seqlens[b + 1] - cu_seqlens[b] (0 for no requests); syncs on CUDA."""
    if cu_seqlens.numel() < 2:
        return 0
    return int((cu_seqlens[1:].to(torch.int64) - cu_seqlens[:-1].to(torch.int64)).max())


def _options(op, head_dim, causal, sm_scale, window_left, logits_soft_cap, num_splits):
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
    return options


def _workspace(op, workspace, q, operands):
    """The C++ view of the workspace, refused if it shares a byte with any of `operands`
    ((name, tensor or None) pairs): the call overwrites the bytes it plans to use."""
    buffer = _checks.workspace_tensor(op, workspace)
    _checks.device(op, "workspace", buffer, q.device)
    _checks.workspace_disjoint(op, buffer, operands)
    result = _splitkv.WorkspaceBuffer()
    result.data = buffer.data_ptr()
    result.bytes = buffer.numel()
    result.status_host = status_host_address(workspace, buffer)
    return result


def _outputs(op, q, out, return_lse, launch):
    """out (given or new) and lse (new or None). A plan writes nothing: no allocation."""
    if out is not None:
        _operand(op, "out", out, q, 3, "[total_q, num_qo_heads, head_dim]")
        _checks.same_shape(op, "out", out, "q", q)
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


def _on_device(device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _run(op, launcher, params, q, workspace):
    with exclusive(op, workspace), _on_device(q.device):
        return launcher(params)


# ---- paged ----


def _paged_kv(op, kv_cache, kv_layout, q):
    """k and v as 4-D tensors of the layout, from a 5-D cache or a (k, v) pair."""
    if kv_layout not in _KV_LAYOUTS:
        _checks.fail(op, "kv_layout", "unknown", "'HND' or 'NHD'", repr(kv_layout))
    shape = _KV_SHAPES[kv_layout]
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


def _paged_params(op, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
                  sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out,
                  max_q_len, launch, sinks=None, k_scale=None, v_scale=None):
    dtype, backend = _query(op, q)
    k, v = _paged_kv(op, kv_cache, kv_layout, q)
    _index(op, "block_tables", block_tables, q, 2)
    _index(op, "seq_lens", seq_lens, q, 1)
    batch_size, max_pages_per_seq = block_tables.shape
    _checks.dim(op, "seq_lens", seq_lens, 0, batch_size, "batch_size, block_tables.shape[0]")
    if cu_seqlens_q is not None:
        _index(op, "cu_seqlens_q", cu_seqlens_q, q, 1)
        _checks.dim(op, "cu_seqlens_q", cu_seqlens_q, 0, batch_size + 1,
                    "batch_size + 1, block_tables.shape[0] + 1")
    if max_q_len is None:
        max_q_len = max(1, _longest(cu_seqlens_q)) if cu_seqlens_q is not None else 1
    else:
        max_q_len = _checks.integer(op, "max_q_len", max_q_len, 1, "an int >= 1")
    options = _options(op, q.shape[2], causal, sm_scale, window_left, logits_soft_cap, num_splits)
    options.sinks = _checks.sinks(op, sinks, q)
    out, lse = _outputs(op, q, out, return_lse, launch)
    _checks.disjoint(op, "out", out, [("q", q), ("kv_cache", k), ("kv_cache", v),
                                      ("sinks", sinks)], "tensor",
                     "attention is not computed in place")
    ws = _workspace(op, workspace, q, [
        ("q", q), ("kv_cache", k), ("kv_cache", v), ("block_tables", block_tables),
        ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q), ("out", out), ("lse", lse),
        ("sinks", sinks)])

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
    params.batch_size = batch_size
    params.max_pages_per_seq = max_pages_per_seq
    params.max_q_len = max_q_len
    if q.device.type == "cpu" and batch_size > 0:
        # The split heuristic's bound on keys; free to read on the host (0: the capacity).
        capacity = max_pages_per_seq * params.page_size
        params.max_kv_len = max(0, min(int(seq_lens.max()), capacity))
    return params, out, lse


def paged_attention(q, kv_cache, block_tables, seq_lens, workspace, *, cu_seqlens_q=None,
                    kv_layout="HND", sm_scale=None, causal=True, window_left=-1,
                    logits_soft_cap=0.0, num_splits=None, return_lse=False, out=None,
                    max_q_len=None, sinks=None, k_scale=None,
                    v_scale=None):
    """Attention of new query tokens over a paged KV cache (decode, speculative decode,
    chunked prefill), split-KV merged inside one launch.

    Request ``b`` owns the KV tokens ``0 .. seq_lens[b] - 1``, token ``j`` stored in page
    ``block_tables[b, j // page_size]`` at slot ``j % page_size``. Its queries are the last
    ``q_len`` tokens of the sequence: query ``i`` sits at position
    ``seq_lens[b] - q_len + i``.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, float16 or bfloat16 (float32 too on the
        CPU), on the CPU or a CUDA device; last dimension dense. ``total_q`` is
        ``batch_size`` (one token per request) unless ``cu_seqlens_q`` is given.
    kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        q's dtype (or ``torch.float8_e4m3fn``: see ``k_scale``) and device. HND:
        ``[num_pages, 2, num_kv_heads, page_size, head_dim]``;
        NHD: ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (index 0 of dim 1 is
        k, 1 is v); or a ``(k, v)`` pair of ``[num_pages, num_kv_heads, page_size,
        head_dim]`` (HND) or ``[num_pages, page_size, num_kv_heads, head_dim]`` (NHD)
        tensors. Any strides (non-contiguous caches work) except a dense ``head_dim``.
        Slots past a request's length, and pages it does not list, are never read into a
        result (they may hold NaN). ``num_qo_heads`` must be a multiple of
        ``num_kv_heads`` (GQA/MQA); head_dim 64, 128 or 256 on CUDA.
    block_tables : torch.Tensor
        ``[batch_size, max_pages_per_seq]`` int32 page ids in ``[0, num_pages)``, last
        dimension dense. Entries past ``ceil(seq_lens[b] / page_size)`` are ignored.
    seq_lens : torch.Tensor
        ``[batch_size]`` int32, contiguous: KV length of each request in tokens (including
        its new queries), in ``[0, max_pages_per_seq * page_size]``.
    workspace : Workspace or torch.Tensor
        uint8 on q's device, 256-byte aligned, zeroed once when made. Bytes
        ``[0, COUNTER_REGION_BYTES)`` are split counters, zero again when the call returns;
        later bytes may hold anything. One call at a time per workspace.
    cu_seqlens_q : torch.Tensor, optional
        ``[batch_size + 1]`` int32, contiguous: prefix sums of q_len from 0, ending at
        ``total_q``, for several query tokens per request. Default None: one per request.
    kv_layout : {"HND", "NHD"}, default "HND"
        Layout of ``kv_cache``.
    sm_scale : float, optional
        Scale of q.k before the softmax. Default ``1 / sqrt(head_dim)``.
    causal : bool, default True
        Query ``i`` of a request with ``q_len`` queries and ``kv_len`` keys sees keys
        ``j <= kv_len - q_len + i`` (aligned to the end of the KV).
    window_left : int, default -1
        Sliding window: a query at position ``p`` also needs ``j >= p - window_left``
        (at most ``window_left + 1`` keys with ``causal``). -1: no window.
    logits_soft_cap : float, default 0.0
        ``c > 0`` turns each scaled logit ``s`` into ``c * tanh(s / c)``; 0 disables it.
    num_splits : int, optional
        Splits of each request's KV. Default None: the planner chooses and lowers the
        count to what the workspace holds. An int >= 1 forces it; a forced count the
        workspace cannot hold raises ValueError (see :func:`plan_paged_attention`).
    return_lse : bool, default False
        Also return the log-sum-exp.
    out : torch.Tensor, optional
        ``[total_q, num_qo_heads, head_dim]``, q's dtype and device, last dimension dense:
        written in place and returned. Default: a new tensor.
    max_q_len : int, optional
        Keyword-only upper bound on q_len over requests. Default None: 1, or computed on
        the host from ``cu_seqlens_q`` (a device sync for CUDA tensors; pass it to avoid
        the sync, e.g. under CUDA graph capture).
    sinks : torch.Tensor, optional
        Keyword-only attention sinks: ``[num_qo_heads]`` float32, contiguous, on q's
        device. ``sinks[h]`` is one extra logit of every row of qo head ``h`` (natural-log
        units, not multiplied by ``sm_scale`` nor soft-capped) whose value is zero:
        ``p_j = exp(s_j) / (exp(sinks[h]) + sum_k exp(s_k))``, and the LSE becomes
        ``log(exp(sinks[h]) + sum_k exp(s_k))``; a row that sees no key gets out 0 and LSE
        ``sinks[h]``. Entered once per row whatever ``num_splits`` is. ``-inf`` means no
        sink for that head. Default None: no sinks.
    k_scale, v_scale : float or torch.Tensor, optional
        Keyword-only, for an fp8 cache and required with one: K/V of dtype
        ``torch.float8_e4m3fn`` (q float16 or bfloat16; out in q's dtype) hold
        ``true value / scale``, i.e. the true value is ``stored * k_scale`` (``v_scale`` for
        V). Each a finite Python float, or a float32 ``[num_kv_heads]`` tensor on q's device
        (one scale per kv head). CPU backend only for now: CUDA refuses an fp8 cache.
        Default None: K/V are q's dtype, and giving a scale then is an error.

    Returns
    -------
    out : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, q's dtype. A row that sees no key (kv_len
        0, q_len > kv_len under ``causal``, or a window that excludes all) is 0.
    lse : torch.Tensor
        Only with ``return_lse``: ``[total_q, num_qo_heads]`` float32, contiguous, the
        natural-log ``log(sum_j exp(logit_j))`` over the visible keys (scaled and capped
        logits, plus the sink when given); ``-inf`` (``sinks[h]``) for a row that sees no
        key.

    Raises
    ------
    TypeError
        A tensor argument is not a tensor; q's dtype is unsupported or another tensor's
        differs; an index tensor is not int32 (int64 is refused, not converted); the
        workspace is not uint8; ``sinks`` or a scale tensor is not float32; K/V of another
        fp8 format than ``float8_e4m3fn`` (e5m2), or fp8 K/V with float32 q.
    ValueError
        Tensors on different devices, a wrong rank, shapes that disagree (head_dim,
        batch_size, ``sinks`` not ``[num_qo_heads]`` or not contiguous, a scale tensor not
        ``[num_kv_heads]``), a non-dense last dimension, or an unknown kv_layout; an fp8
        cache without ``k_scale``/``v_scale``, a scale without one, a non-finite scale; and from the
        C++ core: num_qo_heads not a multiple of num_kv_heads, a page id or seq_len out
        of range, cu_seqlens_q not a prefix sum from 0, a workspace too small (for the
        counter region or a forced num_splits), misaligned, its counter region corrupted,
        or in use by another thread; out overlapping an input or itself; a head_dim the
        backend does not support, float32 or an fp8 cache on CUDA, or a CUDA tensor in a
        CPU-only build.
    RuntimeError
        A CUDA call failed.

    Example
    -------
    >>> num_pages, page_size, num_kv_heads, head_dim = 64, 16, 8, 128
    >>> kv_cache = torch.randn(num_pages, 2, num_kv_heads, page_size, head_dim,
    ...                        dtype=torch.bfloat16)
    >>> q = torch.randn(2, 32, head_dim, dtype=torch.bfloat16)   # 2 requests, 32 qo heads
    >>> block_tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    >>> seq_lens = torch.tensor([40, 17], dtype=torch.int32)
    >>> workspace = splitkv.Workspace(64 << 20, "cpu")
    >>> out, lse = splitkv.paged_attention(q, kv_cache, block_tables, seq_lens, workspace,
    ...                                    return_lse=True)
    """
    if torch.compiler.is_compiling():
        # Raw pointers cannot be traced: under torch.compile take the custom op instead.
        from splitkv import ops
        return ops.paged_attention(
            q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q=cu_seqlens_q,
            kv_layout=kv_layout, sm_scale=sm_scale, causal=causal, window_left=window_left,
            logits_soft_cap=logits_soft_cap, num_splits=num_splits, return_lse=return_lse,
            out=out, max_q_len=max_q_len, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    params, out, lse = _paged_params(
        _PAGED, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
        sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len,
        launch=True, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    _run(_PAGED, _splitkv.LaunchPagedAttention, params, q, workspace)
    return (out, lse) if return_lse else out


def plan_paged_attention(q, kv_cache, block_tables, seq_lens, workspace, *, cu_seqlens_q=None,
                         kv_layout="HND", sm_scale=None, causal=True, window_left=-1,
                         logits_soft_cap=0.0, num_splits=None, return_lse=False, out=None,
                         max_q_len=None, sinks=None, k_scale=None,
                         v_scale=None):
    """The plan :func:`paged_attention` would use for these arguments, without running.

    Takes exactly :func:`paged_attention`'s arguments. Checks the tensors, shapes and
    the workspace (size, alignment, a forced num_splits), not the index values.

    Returns
    -------
    Plan
        ``num_splits`` chosen (or forced), ``num_tiles``, and ``layout``: the byte ranges
        of the counter, softmax and scratch regions this call uses in ``workspace``.

    Raises
    ------
    TypeError, ValueError
        As :func:`paged_attention`, except for checks of index values.

    Example
    -------
    >>> plan = splitkv.plan_paged_attention(q, kv_cache, block_tables, seq_lens, workspace)
    >>> plan.num_splits, plan.layout.regions()
    """
    params, _, _ = _paged_params(
        _PAGED, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
        sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len,
        launch=False, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    return Plan._from_ext(_run(_PAGED, _splitkv.PlanPagedAttention, params, q, workspace))


# ---- ragged ----


def _ragged_params(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale,
                   window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len, launch,
                   sinks=None, k_scale=None, v_scale=None):
    dtype, backend = _query(op, q)
    kv_shape = "[total_kv, num_kv_heads, head_dim]"
    _operand(op, "k", k, q, 3, kv_shape, kv=True)
    _operand(op, "v", v, q, 3, kv_shape, kv=True)
    _checks.same_dtype(op, "v", v, "k", k)
    _checks.same_shape(op, "v", v, "k", k)
    _head_dim(op, "k", k.shape[2], q)
    _index(op, "cu_seqlens_q", cu_seqlens_q, q, 1)
    _index(op, "cu_seqlens_kv", cu_seqlens_kv, q, 1)
    if cu_seqlens_q.numel() < 1:
        _checks.fail(op, "cu_seqlens_q", "is empty", "[batch_size + 1] prefix sums from 0",
                     "shape (0,)")
    batch_size = cu_seqlens_q.numel() - 1
    _checks.dim(op, "cu_seqlens_kv", cu_seqlens_kv, 0, batch_size + 1,
                "batch_size + 1, cu_seqlens_q.shape[0]")
    if max_q_len is None:
        max_q_len = _longest(cu_seqlens_q)
    else:
        max_q_len = _checks.integer(op, "max_q_len", max_q_len, 0, "an int >= 0")
    options = _options(op, q.shape[2], causal, sm_scale, window_left, logits_soft_cap, num_splits)
    options.sinks = _checks.sinks(op, sinks, q)
    out, lse = _outputs(op, q, out, return_lse, launch)
    _checks.disjoint(op, "out", out, [("q", q), ("k", k), ("v", v), ("sinks", sinks)], "tensor",
                     "attention is not computed in place")
    ws = _workspace(op, workspace, q, [
        ("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_kv", cu_seqlens_kv), ("out", out), ("lse", lse), ("sinks", sinks)])

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
        params.max_kv_len = max(0, min(_longest(cu_seqlens_kv), k.shape[0]))
    return params, out, lse


def ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, *, causal=True,
                     sm_scale=None, window_left=-1, logits_soft_cap=0.0, num_splits=None,
                     return_lse=False, out=None, max_q_len=None, sinks=None, k_scale=None,
                     v_scale=None):
    """Attention over ragged (packed, variable-length) q, k, v: prefill of a batch of
    requests, split-KV merged inside one launch.

    Request ``b`` owns query rows ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1`` and key
    rows ``cu_seqlens_kv[b] .. cu_seqlens_kv[b + 1] - 1``; its queries are the last
    ``q_len`` tokens of its ``kv_len``: query ``i`` sits at position ``kv_len - q_len + i``.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, float16 or bfloat16 (float32 too on the
        CPU), on the CPU or a CUDA device; last dimension dense.
    k, v : torch.Tensor
        ``[total_kv, num_kv_heads, head_dim]``, q's dtype (or ``torch.float8_e4m3fn``: see
        ``k_scale``) and device, any strides with a
        dense last dimension. ``num_qo_heads`` must be a multiple of ``num_kv_heads``;
        head_dim 64, 128 or 256 on CUDA.
    cu_seqlens_q, cu_seqlens_kv : torch.Tensor
        ``[batch_size + 1]`` int32, contiguous: prefix sums of q_len and kv_len, from 0,
        ending at ``total_q`` and ``total_kv``. Empty requests (length 0) are allowed.
    workspace : Workspace or torch.Tensor
        uint8 on q's device, 256-byte aligned, zeroed once when made. Bytes
        ``[0, COUNTER_REGION_BYTES)`` are split counters, zero again when the call returns;
        later bytes may hold anything. One call at a time per workspace.
    causal : bool, default True
        Query ``i`` sees keys ``j <= kv_len - q_len + i`` (aligned to the end of the KV).
    sm_scale : float, optional
        Scale of q.k before the softmax. Default ``1 / sqrt(head_dim)``.
    window_left : int, default -1
        Sliding window: a query at position ``p`` also needs ``j >= p - window_left``.
        -1: no window.
    logits_soft_cap : float, default 0.0
        ``c > 0`` turns each scaled logit ``s`` into ``c * tanh(s / c)``; 0 disables it.
    num_splits : int, optional
        Splits of each request's KV. Default None: the planner chooses and lowers the
        count to what the workspace holds. An int >= 1 forces it; a forced count the
        workspace cannot hold raises ValueError (see :func:`plan_ragged_attention`).
    return_lse : bool, default False
        Also return the log-sum-exp.
    out : torch.Tensor, optional
        ``[total_q, num_qo_heads, head_dim]``, q's dtype and device, last dimension dense:
        written in place and returned. Default: a new tensor.
    max_q_len : int, optional
        Keyword-only upper bound on q_len over requests. Default None: computed on the
        host from ``cu_seqlens_q`` (a device sync for CUDA tensors; pass it to avoid the
        sync, e.g. under CUDA graph capture).
    sinks : torch.Tensor, optional
        Keyword-only attention sinks: ``[num_qo_heads]`` float32, contiguous, on q's
        device. ``sinks[h]`` is one extra logit of every row of qo head ``h`` (natural-log
        units, not multiplied by ``sm_scale`` nor soft-capped) whose value is zero:
        ``p_j = exp(s_j) / (exp(sinks[h]) + sum_k exp(s_k))``, and the LSE becomes
        ``log(exp(sinks[h]) + sum_k exp(s_k))``; a row that sees no key gets out 0 and LSE
        ``sinks[h]``. Entered once per row whatever ``num_splits`` is. ``-inf`` means no
        sink for that head. Default None: no sinks.
    k_scale, v_scale : float or torch.Tensor, optional
        Keyword-only, for an fp8 cache and required with one: K/V of dtype
        ``torch.float8_e4m3fn`` (q float16 or bfloat16; out in q's dtype) hold
        ``true value / scale``, i.e. the true value is ``stored * k_scale`` (``v_scale`` for
        V). Each a finite Python float, or a float32 ``[num_kv_heads]`` tensor on q's device
        (one scale per kv head). CPU backend only for now: CUDA refuses an fp8 cache.
        Default None: K/V are q's dtype, and giving a scale then is an error.

    Returns
    -------
    out : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, q's dtype; 0 for a row that sees no key.
    lse : torch.Tensor
        Only with ``return_lse``: ``[total_q, num_qo_heads]`` float32, natural-log
        log-sum-exp of the visible (scaled, capped) logits and the sink when given;
        ``-inf`` (``sinks[h]``) for a row with none.

    Raises
    ------
    TypeError
        A tensor argument is not a tensor; q's dtype is unsupported or another tensor's
        differs; cu_seqlens are not int32 (int64 is refused, not converted); the workspace
        is not uint8; ``sinks`` or a scale tensor is not float32; K/V of another fp8
        format than ``float8_e4m3fn`` (e5m2), or fp8 K/V with float32 q.
    ValueError
        Tensors on different devices, a wrong rank, shapes that disagree (head_dim,
        batch_size, ``sinks`` not ``[num_qo_heads]`` or not contiguous, a scale tensor not
        ``[num_kv_heads]``), a non-dense last dimension; an fp8 k/v without
        ``k_scale``/``v_scale``, a scale without one, a non-finite scale; and from the C++ core: num_qo_heads not
        a multiple of num_kv_heads, cu_seqlens not a prefix sum from 0 or not ending at
        total_q / total_kv, a workspace too small (for the counter region or a forced
        num_splits), misaligned, its counter region corrupted, or in use by another
        thread; out overlapping an input or itself; a head_dim the backend does not
        support, float32 or fp8 k/v on CUDA, or a CUDA tensor in a CPU-only build.
    RuntimeError
        A CUDA call failed.

    Example
    -------
    >>> cu_seqlens = torch.tensor([0, 100, 100, 350], dtype=torch.int32)  # one empty
    >>> q = torch.randn(350, 32, 128, dtype=torch.float16)
    >>> k = torch.randn(350, 8, 128, dtype=torch.float16)
    >>> v = torch.randn(350, 8, 128, dtype=torch.float16)
    >>> workspace = splitkv.Workspace(64 << 20, "cpu")
    >>> out = splitkv.ragged_attention(q, k, v, cu_seqlens, cu_seqlens, workspace)
    """
    if torch.compiler.is_compiling():
        from splitkv import ops
        return ops.ragged_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal=causal, sm_scale=sm_scale,
            window_left=window_left, logits_soft_cap=logits_soft_cap, num_splits=num_splits,
            return_lse=return_lse, out=out, max_q_len=max_q_len, sinks=sinks, k_scale=k_scale,
            v_scale=v_scale)
    params, out, lse = _ragged_params(
        _RAGGED, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale, window_left,
        logits_soft_cap, num_splits, return_lse, out, max_q_len, launch=True, sinks=sinks,
        k_scale=k_scale, v_scale=v_scale)
    _run(_RAGGED, _splitkv.LaunchRaggedAttention, params, q, workspace)
    return (out, lse) if return_lse else out


def plan_ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, *, causal=True,
                          sm_scale=None, window_left=-1, logits_soft_cap=0.0, num_splits=None,
                          return_lse=False, out=None, max_q_len=None, sinks=None, k_scale=None,
                          v_scale=None):
    """The plan :func:`ragged_attention` would use for these arguments, without running.

    Takes exactly :func:`ragged_attention`'s arguments. Checks the tensors, shapes and
    the workspace (size, alignment, a forced num_splits), not the index values.

    Returns
    -------
    Plan
        ``num_splits`` chosen (or forced), ``num_tiles``, and ``layout``: the byte ranges
        of the counter, softmax and scratch regions this call uses in ``workspace``.

    Raises
    ------
    TypeError, ValueError
        As :func:`ragged_attention`, except for checks of index values.

    Example
    -------
    >>> plan = splitkv.plan_ragged_attention(q, k, v, cu_seqlens, cu_seqlens, workspace,
    ...                                      num_splits=4)
    >>> plan.layout.required_bytes
    """
    params, _, _ = _ragged_params(
        _RAGGED, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale, window_left,
        logits_soft_cap, num_splits, return_lse, out, max_q_len, launch=False, sinks=sinks,
        k_scale=k_scale, v_scale=v_scale)
    return Plan._from_ext(_run(_RAGGED, _splitkv.PlanRaggedAttention, params, q, workspace))
