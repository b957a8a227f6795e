"""paged_attention and ragged_attention: torch tensors in, the C++ launchers underneath.

The public functions and their plans. Turning tensors into the C++ param structs, the
torch-side checks and the cache of validated layouts that keeps a call's host time low
live in _calls.py (shared with ops.py); values are validated by the C++ core, whose errors
arrive as ValueError; nothing here computes a workspace offset. The parameter
paragraphs both operations share (sinks, batch_invariant, out, ...) live in _docs.py.
"""

import dataclasses

from splitkv import _calls
from splitkv import _checks
from splitkv import _docs
from splitkv import _splitkv
from splitkv import ops
from splitkv.workspace import WorkspaceLayout

_PAGED = _calls.PAGED
_RAGGED = _calls.RAGGED


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a call runs: its split count and the workspace bytes its split partials use (not
    the 16-bit K/V copy of a one-split fp8 prefill on sm_90: see
    :func:`fp8_prefill_workspace_bytes`).

    Attributes
    ----------
    num_splits : int
        Splits of each request's KV (1: no split, the output is written directly).
    layout : WorkspaceLayout
        Byte ranges of the counter, softmax and scratch regions for this call.
    num_tiles : int
        Work tiles (request x kv head x query tile); with num_splits > 1 each owns the
        counter at index tile (bytes 4 * tile .. 4 * tile + 4).
    invariant_split_keys : int
        With ``batch_invariant``: keys per split (split s covers KV positions
        ``[s * invariant_split_keys, (s + 1) * invariant_split_keys)``); ``num_splits`` is
        then the launch's split tasks per tile (1: each tile runs its splits in one task,
        same bits). 0 otherwise.
    """

    num_splits: int
    layout: WorkspaceLayout
    num_tiles: int = 0
    invariant_split_keys: int = 0

    @classmethod
    def _from_ext(cls, plan):
        return cls(plan.num_splits, WorkspaceLayout._from_ext(plan.layout), plan.num_tiles,
                   plan.invariant_split_keys)


# ---- paged ----


@_docs.shared_params
def paged_attention(q, kv_cache, block_tables, seq_lens, workspace, *, cu_seqlens_q=None,
                    kv_layout="HND", sm_scale=None, causal=True, window_left=-1,
                    logits_soft_cap=0.0, num_splits=None, return_lse=False, out=None,
                    max_q_len=None, batch_invariant=False,
                    sinks=None, k_scale=None, v_scale=None, kv_offsets=None, full_seq_lens=None):
    """Attention of new query tokens over a paged KV cache (decode, speculative decode,
    chunked prefill), split-KV merged inside one launch.

    Request ``b`` owns the KV tokens ``0 .. seq_lens[b] - 1``, token ``j`` stored in page
    ``block_tables[b, j // page_size]`` at slot ``j % page_size``. Its queries are the last
    ``q_len`` tokens of the sequence: query ``i`` sits at position
    ``seq_lens[b] - q_len + i`` (unless ``kv_offsets`` and ``full_seq_lens`` place the
    keys inside a longer request).

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, float16 or bfloat16 (float32 too on the
        CPU), on the CPU or a CUDA device; last dimension dense. ``total_q`` is
        ``batch_size`` (one token per request) unless ``cu_seqlens_q`` is given.
    kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        q's dtype (or ``torch.float8_e4m3fn``: see ``k_scale``) and device. HND: ``[num_pages, 2, num_kv_heads, page_size, head_dim]``;
        NHD: ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (index 0 of dim 1 is
        k, 1 is v); or a ``(k, v)`` pair of ``[num_pages, num_kv_heads, page_size,
        head_dim]`` (HND) or ``[num_pages, page_size, num_kv_heads, head_dim]`` (NHD)
        tensors. Any strides (non-contiguous caches work), but ``head_dim`` must be dense
        (stride 1).
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
    @sm_scale@
    causal : bool, default True
        Query ``i`` of a request with ``q_len`` queries and ``kv_len`` keys sees keys
        ``j <= kv_len - q_len + i`` (aligned to the end of the KV; with ``kv_offsets``,
        positions in the full request).
    window_left : int, default -1
        Sliding window: a query at position ``p`` also needs ``j >= p - window_left``
        (at most ``window_left + 1`` keys with ``causal``). -1: no window.
    @logits_soft_cap@
    num_splits : int, optional
        Splits of each request's KV. Default None: the planner chooses and lowers the
        count to what the workspace holds. An int >= 1 forces it; a forced count the
        workspace cannot hold raises ValueError (see :func:`plan_paged_attention`).
    @return_lse@
    @out@
    max_q_len : int, optional
        Keyword-only upper bound on q_len over requests, an int >= 1 (0, which
        :func:`ragged_attention` takes as "no bound", is refused here; ValueError below the
        longest query on the CPU; on CUDA, which does not read cu_seqlens_q on the host,
        the rows past the bound are not computed). Default None: 1, or computed on the
        host from ``cu_seqlens_q`` (a device sync for CUDA tensors; pass it to avoid the
        sync, e.g. under CUDA graph capture).
    @batch_invariant@
    @sinks@
    k_scale, v_scale : float or torch.Tensor, optional
        Keyword-only, for an fp8 cache and required with one: K/V of dtype
        ``torch.float8_e4m3fn`` (q float16 or bfloat16; out in q's dtype) hold
        ``true value / scale``, i.e. the true value is ``stored * k_scale`` (``v_scale`` for
        V). Each a Python float of 0 or a magnitude in float32's normal range [1.2e-38,
        3.4e38], or a float32 ``[num_kv_heads]`` tensor on q's device (one scale per kv
        head; its values are checked on the CPU backend only, which refuses a non-finite
        entry). On an H100/H200 (sm_90) decode tiles at head_dim 64, 128
        and 256 over a 16-byte aligned cache with pages of 8+ slots run the sm_90 decode
        kernel, which converts the staged fp8 bytes to float16 in registers (exactly; a
        bfloat16 q is scaled per row by a power of two into float16's range). On the H200
        at head_dim 128: 0.50-0.55x the bf16 call's time at batch 64+ with 4k+ keys;
        0.56-0.66x at 1 x 32k, 1 x 128k, 4 x 8k, 16 x 4k and 16 x 8k (1 x 32k 0.66x,
        16 x 4096 0.59x); about the bf16 time with at most 4k keys at batch 1-8, where fixed
        costs dominate (docs/bench/h200-2026-12-02-grid/, docs/bench/h200-2026-12-02-fp8-kr2/).
        At head_dim 64: 0.52x at 64 x 4096, 0.80-0.98x in split grids, 1.2x at 1 x 1-4k
        (docs/bench/h200-2026-12-02-fp8-d64/). Prefill tiles (``cu_seqlens_q`` with
        ``max_q_len`` x the GQA group above 16 rows) that the sm_90 wgmma prefill would
        serve over a 16-bit cache (compute capability 9.0, one split, not
        ``batch_invariant``, pages of 8+ slots, 16-byte aligned q and cache with strides
        in multiples of 8 elements, a group dividing 128 query rows, or 192 at head_dim 64)
        copy the K/V they read into the workspace as q's dtype (exactly) and run the wgmma
        prefill over the copy when the workspace holds :func:`fp8_prefill_workspace_bytes`
        bytes (sized by ``block_tables``' width). A larger workspace also lets the planner
        split, and a split call makes no copy: pass ``num_splits=1`` to keep long chunks
        whole. Every other fp8 call runs the mma.sync kernel, which converts as it loads:
        correct, several times slower than a 16-bit cache at prefill. Nothing reports which
        kernel ran.
        Default None: K/V are q's dtype, and giving a scale then is an error.
    kv_offsets, full_seq_lens : torch.Tensor, optional
        Keyword-only, both or neither: ``[batch_size]`` int32, contiguous, on q's device.
        The call's keys are one shard of longer requests (context parallelism,
        :mod:`splitkv.distributed`): request ``b``'s ``seq_lens[b]`` keys are positions
        ``kv_offsets[b] .. kv_offsets[b] + seq_lens[b] - 1`` of a request of
        ``full_seq_lens[b]`` keys, and its ``q_len`` queries sit at positions
        ``full_seq_lens[b] - q_len + i``. ``causal`` and ``window_left`` compare those
        positions: local key ``t`` (position ``kv_offsets[b] + t``) is visible to query
        ``i`` when ``t <= s + i`` (causal) and ``t >= s + i - window_left`` (window), with
        ``s = full_seq_lens[b] - kv_offsets[b] - q_len``. A query past the shard's last key
        sees all of it the window leaves; a row that sees none of the shard gets out 0 and
        LSE ``-inf`` (``sinks[h]``), so the shards' results merge by their LSE
        (:func:`splitkv.merge_states`). Requires ``0 <= kv_offsets[b]`` and
        ``kv_offsets[b] + seq_lens[b] <= full_seq_lens[b]`` (checked on the CPU; on CUDA
        the values are not read on the host). Default None: ``kv_offsets`` 0 and
        ``full_seq_lens`` ``seq_lens`` (the queries end the call's keys).

    Returns
    -------
    out : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, q's dtype. A row that sees no key (kv_len
        0, q_len > kv_len under ``causal``, or a window that excludes all) is 0. Forward
        only: no autograd graph is recorded, whatever q.requires_grad is.
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
        fp8 format than ``float8_e4m3fn`` (e5m2), or fp8 K/V with float32 q; a sparse
        tensor; an option of the wrong type (``causal``, ``return_lse`` or
        ``batch_invariant`` not a Python bool; ``sm_scale``, ``window_left``,
        ``logits_soft_cap``, ``num_splits`` or ``max_q_len`` not a Python or numpy number,
        e.g. a tensor).
    ValueError
        Tensors on different devices, a wrong rank, shapes that disagree (head_dim,
        batch_size, ``sinks`` not ``[num_qo_heads]`` or not contiguous, a scale tensor not
        ``[num_kv_heads]``), a non-dense last dimension, a negated view (``is_neg()``), an
        ``out`` that requires grad or is an inference tensor outside inference mode, or an
        unknown kv_layout; an option out of range (``num_splits`` < 1 or >= 2**31,
        ``window_left`` < -1 or >= 2**31, ``logits_soft_cap`` negative or not finite,
        ``sm_scale`` not finite or past float32's range, ``max_q_len`` < 1 or below the
        longest query on the CPU), or a forced ``num_splits`` with more work tiles than the counter region
        counts, or with ``batch_invariant``; an fp8
        cache without ``k_scale``/``v_scale``, a scale without one, a float scale that is
        not finite or outside float32's normal range;
        ``kv_offsets`` without ``full_seq_lens`` or the reverse; and from the
        C++ core: num_qo_heads not a multiple of num_kv_heads, a page id or seq_len out
        of range, a shard outside its request (``kv_offsets[b] < 0`` or
        ``kv_offsets[b] + seq_lens[b] > full_seq_lens[b]``, CPU), cu_seqlens_q not a prefix sum from 0, a workspace too small (for the
        counter region or a forced num_splits), misaligned, its counter region corrupted,
        or in use by another thread; out overlapping an input or itself; a head_dim the
        backend does not support, float32 on CUDA, or a CUDA tensor in a CPU-only build.
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
    if _checks.traced(q):
        # Raw pointers cannot be traced: under torch.compile (or over fake tensors) take the
        # custom op instead.
        return ops.paged_attention(
            q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q=cu_seqlens_q,
            kv_layout=kv_layout, sm_scale=sm_scale, causal=causal, window_left=window_left,
            logits_soft_cap=logits_soft_cap, num_splits=num_splits, return_lse=return_lse,
            out=out, max_q_len=max_q_len, batch_invariant=batch_invariant, sinks=sinks,
            k_scale=k_scale, v_scale=v_scale, kv_offsets=kv_offsets, full_seq_lens=full_seq_lens)
    try:
        out, lse = _calls.paged_call(
            _PAGED, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
            sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out,
            max_q_len, batch_invariant, sinks, k_scale, v_scale, kv_offsets, full_seq_lens)
    except RuntimeError:  # torch's, from a tensor without storage: name a torch.func one
        _checks.not_transformed(_PAGED, q=q, kv_cache=kv_cache, block_tables=block_tables,
                                seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q, out=out,
                                sinks=sinks, kv_offsets=kv_offsets, full_seq_lens=full_seq_lens)
        raise
    return (out, lse) if return_lse else out


def plan_paged_attention(q, kv_cache, block_tables, seq_lens, workspace, *, cu_seqlens_q=None,
                         kv_layout="HND", sm_scale=None, causal=True, window_left=-1,
                         logits_soft_cap=0.0, num_splits=None, return_lse=False, out=None,
                         max_q_len=None, batch_invariant=False,
                         sinks=None, k_scale=None, v_scale=None, kv_offsets=None,
                         full_seq_lens=None):
    """The plan :func:`paged_attention` would use for these arguments, without running.

    Takes exactly :func:`paged_attention`'s arguments. Checks the tensors, shapes and
    the workspace (size, alignment, a forced num_splits), not the index values. Writes
    nothing: a plan may be made while another thread's call uses the workspace.

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
    params, _, _ = _calls.paged_params(
        _PAGED, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
        sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len,
        launch=False, batch_invariant=batch_invariant, sinks=sinks, k_scale=k_scale,
        v_scale=v_scale, kv_offsets=kv_offsets, full_seq_lens=full_seq_lens)
    return Plan._from_ext(_calls.plan(_splitkv.PlanPagedAttention, params, q))


# ---- ragged ----


@_docs.shared_params
def ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, *, causal=True,
                     sm_scale=None, window_left=-1, logits_soft_cap=0.0, num_splits=None,
                     return_lse=False, out=None, max_q_len=None, batch_invariant=False,
                     sinks=None, k_scale=None, v_scale=None):
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
    @sm_scale@
    window_left : int, default -1
        Sliding window: a query at position ``p`` also needs ``j >= p - window_left``.
        -1: no window.
    @logits_soft_cap@
    num_splits : int, optional
        Splits of each request's KV. Default None: the planner chooses and lowers the
        count to what the workspace holds. An int >= 1 forces it; a forced count the
        workspace cannot hold raises ValueError (see :func:`plan_ragged_attention`).
    @return_lse@
    @out@
    max_q_len : int, optional
        Keyword-only upper bound on q_len over requests (ValueError below the longest
        query on the CPU; on CUDA, which does not read cu_seqlens_q on the host, the rows
        past the bound are not computed). 0 means
        no bound: ``total_q`` is used (always safe; more query tiles are planned). Default
        None: computed on the host from ``cu_seqlens_q`` (a device sync for CUDA tensors;
        pass it to avoid the sync, e.g. under CUDA graph capture).
    @batch_invariant@
    @sinks@
    k_scale, v_scale : float or torch.Tensor, optional
        Keyword-only, for an fp8 cache and required with one: K/V of dtype
        ``torch.float8_e4m3fn`` (q float16 or bfloat16; out in q's dtype) hold
        ``true value / scale``, i.e. the true value is ``stored * k_scale`` (``v_scale`` for
        V). Each a Python float of 0 or a magnitude in float32's normal range [1.2e-38,
        3.4e38], or a float32 ``[num_kv_heads]`` tensor on q's device (one scale per kv
        head; its values are checked on the CPU backend only, which refuses a non-finite
        entry). A call the sm_90 wgmma prefill would serve over 16-bit k, v (compute
        capability 9.0, one split, not ``batch_invariant``, 16-byte aligned q, k, v with
        strides in multiples of 8 elements, a group dividing 128 query rows, or 192 at
        head_dim 64) copies fp8 k, v into the workspace as q's dtype (exactly) and runs the
        wgmma prefill over the copy when the workspace holds
        :func:`fp8_prefill_workspace_bytes` bytes. A larger workspace also lets the planner
        split, and a split call makes no copy (``num_splits=1`` keeps it whole). Otherwise
        fp8 k, v run the mma.sync kernel, which converts them exactly as it loads them:
        correct, several times slower than 16-bit k, v. Nothing reports which kernel ran.
        Default None: K/V are q's dtype, and giving a scale then is an error.

    Returns
    -------
    out : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, q's dtype; 0 for a row that sees no key.
        Forward only: no autograd graph is recorded, whatever q.requires_grad is.
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
        format than ``float8_e4m3fn`` (e5m2), or fp8 K/V with float32 q; a sparse
        tensor; an option of the wrong type (``causal``, ``return_lse`` or
        ``batch_invariant`` not a Python bool; ``sm_scale``, ``window_left``,
        ``logits_soft_cap``, ``num_splits`` or ``max_q_len`` not a Python or numpy number,
        e.g. a tensor).
    ValueError
        Tensors on different devices, a wrong rank, shapes that disagree (head_dim,
        batch_size, ``sinks`` not ``[num_qo_heads]`` or not contiguous, a scale tensor not
        ``[num_kv_heads]``), a non-dense last dimension, a negated view (``is_neg()``), an
        ``out`` that requires grad or is an inference tensor outside inference mode; an
        option out of range (``num_splits`` < 1 or >= 2**31, ``window_left`` < -1 or >= 2**31,
        ``logits_soft_cap`` negative or not finite, ``sm_scale`` not finite or past
        float32's range, ``max_q_len`` < 0 or below the longest query on the CPU), or a
        forced ``num_splits`` with more work tiles than the counter region counts, or with
        ``batch_invariant``; an fp8
        k/v without ``k_scale``/``v_scale``, a scale without one, a float scale that is
        not finite or outside float32's normal range; and
        from the C++ core: num_qo_heads not
        a multiple of num_kv_heads, cu_seqlens not a prefix sum from 0 or not ending at
        total_q / total_kv, a workspace too small (for the counter region or a forced
        num_splits), misaligned, its counter region corrupted, or in use by another
        thread; out overlapping an input or itself; a head_dim the backend does not
        support, float32 on CUDA, or a CUDA tensor in a CPU-only build.
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
    if _checks.traced(q):
        return ops.ragged_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal=causal, sm_scale=sm_scale,
            window_left=window_left, logits_soft_cap=logits_soft_cap, num_splits=num_splits,
            return_lse=return_lse, out=out, max_q_len=max_q_len, batch_invariant=batch_invariant,
            sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    try:
        out, lse = _calls.ragged_call(
            _RAGGED, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale,
            window_left, logits_soft_cap, num_splits, return_lse, out, max_q_len,
            batch_invariant, sinks, k_scale, v_scale)
    except RuntimeError:  # torch's, from a tensor without storage: name a torch.func one
        _checks.not_transformed(_RAGGED, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_kv=cu_seqlens_kv, out=out, sinks=sinks)
        raise
    return (out, lse) if return_lse else out


def plan_ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, *, causal=True,
                          sm_scale=None, window_left=-1, logits_soft_cap=0.0, num_splits=None,
                          return_lse=False, out=None, max_q_len=None, batch_invariant=False,
                          sinks=None, k_scale=None, v_scale=None):
    """The plan :func:`ragged_attention` would use for these arguments, without running.

    Takes exactly :func:`ragged_attention`'s arguments. Checks the tensors, shapes and
    the workspace (size, alignment, a forced num_splits), not the index values. Writes
    nothing: a plan may be made while another thread's call uses the workspace.

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
    params, _, _ = _calls.ragged_params(
        _RAGGED, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale, window_left,
        logits_soft_cap, num_splits, return_lse, out, max_q_len, launch=False,
        batch_invariant=batch_invariant, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    return Plan._from_ext(_calls.plan(_splitkv.PlanRaggedAttention, params, q))
