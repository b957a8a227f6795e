"""Context parallelism: one request's KV cache spread over the ranks of a process group.

Each rank holds a contiguous shard of every request's keys (its own block_tables and
seq_lens, and where the shard starts), computes attention over its shard with the LSE,
all-gathers (out, lse) over the group in one torch.distributed collective (NCCL on CUDA,
gloo on the CPU) and merges the partials with :func:`splitkv.merge_states`. No transport
of splitkv's own, no host sync of its own.

Positions: the core takes them. ``kv_offsets`` and ``full_seq_lens`` go to the local
:func:`splitkv.paged_attention`, which places request ``b``'s query ``i`` at local key
position ``full_seq_lens[b] - kv_offsets[b] - q_len + i`` (PagedAttentionParams in
cc/splitkv/params.h), so its causal mask and sliding window compare absolute positions: a
shard wholly before a query's window start contributes nothing (lse ``-inf``), a shard
past a query (causal) likewise, one that the window cuts contributes its visible part.
One launch per rank and call, the same shapes every step (graph-capturable).

Sinks enter once: only the group's rank 0 passes ``sinks`` to its local launch. Its partial
is then ``out_0 = sum_{j in K_0} e^{s_j} v_j / (e^{sink} + Z_0)`` with
``lse_0 = log(e^{sink} + Z_0)`` (``Z_r = sum_{j in K_r} e^{s_j}``), the others' plain
``out_r = sum_{j in K_r} e^{s_j} v_j / Z_r``, ``lse_r = log Z_r``. merge_states weighs each
by ``e^{lse_r}``: ``lse = log(e^{sink} + Z_0 + ... + Z_{n-1})`` and
``out = sum_r e^{lse_r} out_r / e^{lse} = sum_j e^{s_j} v_j / (e^{sink} + sum_r Z_r)``,
the single call's result; a row that sees no key on rank 0 has ``out_0 = 0`` and
``lse_0 = sink``, which adds ``e^{sink}`` to the denominator and nothing to the numerator,
as it must. fp8 caches: each rank passes its own ``k_scale``/``v_scale`` (the same scales
when the shards come from one quantised cache).

Exactness: not bitwise the single-device call in general. Each partial leaves its launch
rounded to q's dtype, and merge_states weighs partials by their LSE, while one launch
merges its splits from float32 partials and (max, sum) statistics; the shards' boundaries
need not be the single call's split boundaries either.
"""

import torch
import torch.distributed as dist

from splitkv import _checks
from splitkv.attention import paged_attention as _local_paged_attention
from splitkv.merge import merge_states

_OP = "splitkv.distributed.paged_attention"
_RECORD_ALIGN = 16  # bytes: each rank's (lse, out) record starts float32-aligned
# One all-gather into one tensor: all_gather_single since torch 2.13 (which deprecates the
# older name), all_gather_into_tensor before.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _check(q, block_tables, seq_lens, kv_offsets, full_seq_lens):
    # kv_offsets and full_seq_lens are required here (optional in paged_attention, which
    # checks them again, and their values on the CPU).
    _checks.tensor(_OP, "q", q)
    _checks.rank(_OP, "q", q, 3, "[total_q, num_qo_heads, head_dim]")  # before sinks reads q.shape[1]
    _checks.index_tensor(_OP, "block_tables", block_tables, 2)
    _checks.device(_OP, "block_tables", block_tables, q.device)
    batch_size = block_tables.shape[0]
    for name, x in (("seq_lens", seq_lens), ("kv_offsets", kv_offsets),
                    ("full_seq_lens", full_seq_lens)):
        _checks.index_tensor(_OP, name, x, 1)
        _checks.device(_OP, name, x, q.device)
        _checks.dim(_OP, name, x, 0, batch_size, "batch_size, block_tables.shape[0]")


def _all_gather(out, lse, group):
    """[world, total_q, num_qo_heads, head_dim] outs and [world, total_q, num_qo_heads] lses
    of every rank, in rank order, through one all_gather of a byte record per rank."""
    world = dist.get_world_size(group)
    lse_bytes = lse.numel() * 4
    out_bytes = out.numel() * out.element_size()
    record = -(-(lse_bytes + out_bytes) // _RECORD_ALIGN) * _RECORD_ALIGN
    send = torch.empty(record, dtype=torch.uint8, device=out.device)
    send[:lse_bytes].view(torch.float32).view(lse.shape).copy_(lse)
    send[lse_bytes:lse_bytes + out_bytes].view(out.dtype).view(out.shape).copy_(out)
    gathered = torch.empty(world * record, dtype=torch.uint8, device=out.device)
    _ALL_GATHER(gathered, send, group=group)
    rows = gathered.view(world, record)
    lses = rows[:, :lse_bytes].view(torch.float32).view(world, *lse.shape)
    outs = rows[:, lse_bytes:lse_bytes + out_bytes].view(out.dtype).view(world, *out.shape)
    return outs, lses


def paged_attention(q, kv_cache, block_tables, seq_lens, kv_offsets, full_seq_lens, workspace, *,
                    group=None, cu_seqlens_q=None, kv_layout="HND", sm_scale=None, causal=True,
                    window_left=-1, logits_soft_cap=0.0, num_splits=None, return_lse=False,
                    max_q_len=None, sinks=None, k_scale=None, v_scale=None, batch_invariant=False):
    """Paged attention (decode, chunked prefill) with each request's keys sharded over the
    ranks of a process group; every rank gets the whole result.

    Every rank calls this with the same ``q`` (and ``cu_seqlens_q``, options) and its own
    shard: request ``b``'s keys at absolute positions ``kv_offsets[b] ..
    kv_offsets[b] + seq_lens[b] - 1`` of its ``full_seq_lens[b]`` keys, local key ``t`` in
    page ``block_tables[b, t // page_size]`` at slot ``t % page_size`` of this rank's
    ``kv_cache``. The shards of a request are disjoint and together cover
    ``0 .. full_seq_lens[b] - 1`` (a rank may hold none: ``seq_lens[b] = 0``). Query ``i``
    of ``q_len`` sits at absolute position ``full_seq_lens[b] - q_len + i``; the causal
    mask and the sliding window compare absolute positions. The result is
    :func:`splitkv.paged_attention` over the union of the shards: each rank makes one
    launch, :func:`splitkv.paged_attention` with ``kv_offsets``, ``full_seq_lens`` and
    ``return_lse=True``; one all-gather over ``group`` collects every rank's (out, lse) as
    one byte record per rank, and :func:`splitkv.merge_states` merges them in rank order.

    Exactness: the merge is deterministic, so a call is bitwise the same run to run, and
    every rank gets bitwise the same result. A row whose keys all lie on one rank (the
    others contribute lse ``-inf``; without sinks, or with that rank the group's rank 0),
    and any call on a group of one rank, gives bitwise that rank's
    :func:`splitkv.paged_attention` result. Otherwise the result matches the single-device
    call within the dtype's rounding, NOT bitwise: each partial is rounded to q's dtype
    before the merge and merged by its LSE (one launch merges its splits from float32
    partials and (max, sum) statistics), and the shards' boundaries need not fall on the
    single call's split boundaries. With ``batch_invariant=True`` a request's result is
    bitwise the same whatever other requests share the call (each rank's partial is, the
    gather moves bytes, and the merge works row by row in rank order), though still not
    bitwise the single-device call's.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, the same on every rank; as
        :func:`splitkv.paged_attention`.
    kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        This rank's pages; as :func:`splitkv.paged_attention` (fp8 with ``k_scale`` and
        ``v_scale``).
    block_tables : torch.Tensor
        ``[batch_size, max_pages_per_seq]`` int32: this rank's pages of each request, in
        key order.
    seq_lens : torch.Tensor
        ``[batch_size]`` int32: keys of each request on this rank (0 for none).
    kv_offsets : torch.Tensor
        ``[batch_size]`` int32, contiguous, q's device: absolute position of this rank's
        first key of each request.
    full_seq_lens : torch.Tensor
        ``[batch_size]`` int32, contiguous, q's device: keys of each request over all ranks
        (``0 <= kv_offsets`` and ``kv_offsets + seq_lens <= full_seq_lens``; checked on the
        CPU only, like the core's index values).
    workspace : Workspace or torch.Tensor
        This rank's workspace; as :func:`splitkv.paged_attention`.
    group : torch.distributed.ProcessGroup, optional
        The ranks sharing the keys (default: the default group). NCCL for CUDA tensors,
        gloo for CPU tensors; every rank of it must make the call.
    cu_seqlens_q : torch.Tensor, optional
        ``[batch_size + 1]`` int32: several query tokens per request (chunked prefill).
    kv_layout, sm_scale, causal, logits_soft_cap, num_splits, max_q_len
        As :func:`splitkv.paged_attention`, for this rank's launch.
    window_left : int, default -1
        Sliding window over absolute positions: a query at position ``p`` sees keys
        ``>= p - window_left``; -1: none. A rank whose shard lies wholly outside a row's
        window contributes nothing to it.
    sinks : torch.Tensor, optional
        ``[num_qo_heads]`` float32 on q's device, the same on every rank; as
        :func:`splitkv.paged_attention`. Passed to the group's rank 0 launch only, so each
        row's sink enters the merged softmax once (module docstring: the merge's math); a
        row that sees no key on any rank gets out 0 and lse ``sinks[h]``.
    k_scale, v_scale : float or torch.Tensor, optional
        This rank's fp8 cache scales; as :func:`splitkv.paged_attention`.
    return_lse : bool, default False
        Also return the merged log-sum-exp.
    batch_invariant : bool, default False
        Each rank's launch as :func:`splitkv.paged_attention` with ``batch_invariant``: a
        request's merged out and lse then depend on its own queries and shards only.

    Returns
    -------
    out : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, q's dtype, contiguous; 0 for a row that
        sees no key on any rank.
    lse : torch.Tensor
        Only with ``return_lse``: ``[total_q, num_qo_heads]`` float32, natural log;
        ``-inf`` (``sinks[h]``) for a row that sees no key on any rank.

    Raises
    ------
    TypeError, ValueError
        group neither None nor a ProcessGroup (TypeError), or ``new_group``'s
        ``NON_GROUP_MEMBER`` on a rank outside that group (ValueError);
        block_tables, seq_lens, kv_offsets or full_seq_lens not int32 ``[batch_size]`` on
        q's device (before any launch); then as :func:`splitkv.paged_attention` for this
        rank's arguments, including, on the CPU, a shard outside its request
        (``kv_offsets[b] < 0`` or ``kv_offsets[b] + seq_lens[b] > full_seq_lens[b]``).
        A refusal on one rank comes before its collective: the other ranks then wait in
        theirs (torch.distributed's timeout).
    RuntimeError
        From torch.distributed (no default group, a backend that does not support the
        tensors' device). Nothing checks that the ranks agree (that would take a host
        sync): ranks whose q differs in shape or dtype make the all-gather records differ
        in size, which gloo answers by aborting the process (seen with torch 2.13) and
        NCCL may answer with a hang or garbage; ranks whose q differ in shape but not in
        bytes (``[8, 32, 128]`` beside ``[16, 16, 128]``) gather without error and merge
        rows of other tokens or heads: the output is wrong, silently. A rank with
        ``total_q = 0`` while others
        have rows makes no collective, so the others wait or fail when it exits.

    Example
    -------
    >>> # rank r of 2 holds keys [r * 64, r * 64 + 64) of each 128-key request
    >>> out = splitkv.distributed.paged_attention(
    ...     q, kv_cache, block_tables, seq_lens, kv_offsets, full_seq_lens, workspace,
    ...     window_left=127, sinks=sinks)
    """
    _check(q, block_tables, seq_lens, kv_offsets, full_seq_lens)
    non_member = getattr(dist.GroupMember, "NON_GROUP_MEMBER", None)
    if (group is not None and non_member is not None and type(group) is type(non_member)
            and group == non_member):
        # What dist.new_group returns on a rank outside the new group (-100 in torch 2.13).
        _checks.fail(_OP, "group", "does not hold this rank",
                     "a group this rank belongs to (every rank of it must make the call)",
                     "dist.GroupMember.NON_GROUP_MEMBER (new_group's value on a rank outside it)")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        _checks.fail(_OP, "group", "has the wrong type",
                     "None (the default group) or a torch.distributed.ProcessGroup",
                     type(group).__name__, error=TypeError)
    return_lse = _checks.flag(_OP, "return_lse", return_lse)  # the local call always returns it
    if sinks is not None:
        _checks.sinks(_OP, sinks, q)  # on every rank, though only rank 0 passes them on
        if dist.get_rank(group) != 0:
            sinks = None  # the sink enters once: through rank 0's partial
    out, lse = _local_paged_attention(
        q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q=cu_seqlens_q,
        kv_layout=kv_layout, sm_scale=sm_scale, causal=causal, window_left=window_left,
        logits_soft_cap=logits_soft_cap, num_splits=num_splits, return_lse=True,
        max_q_len=max_q_len, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
        kv_offsets=kv_offsets, full_seq_lens=full_seq_lens, batch_invariant=batch_invariant)
    if out.numel() == 0:
        merged_out, merged_lse = out, lse
    else:
        outs, lses = _all_gather(out, lse, group)
        merged_out, merged_lse = merge_states(outs, lses)
    return (merged_out, merged_lse) if return_lse else merged_out
