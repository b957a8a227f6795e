"""Context parallelism: one request's KV cache spread over the ranks of a process group.

Each rank holds a contiguous shard of every request's keys (its own block_tables and
seq_lens, and where the shard starts), computes attention over its shard with the LSE,
all-gathers (out, lse) over the group in one torch.distributed collective (NCCL on CUDA,
gloo on the CPU) and merges the partials with :func:`splitkv.merge_states`. No transport
of splitkv's own, no host sync of its own.

Absolute positions without a core parameter: the core places query ``i`` of a request with
``q_len`` queries at ``seq_len - q_len + i`` of its (local) keys. A shard ending
``g = full_seq_len - kv_offset - seq_len`` keys before the request's end must place it ``g``
later. Rows whose true position lies within the shard (the first ``q_len - g``) get that
from a causal call over those rows alone; the rest lie past the shard's last key, so they
see all of it: a non-causal call. Both calls keep static shapes (each request becomes two
sub-requests, one of them empty in each call), so nothing is read back to the host.
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


def _check(q, block_tables, seq_lens, kv_offsets, full_seq_lens, window_left):
    # The index tensors are used here before paged_attention checks them again.
    _checks.tensor(_OP, "q", q)
    _checks.index_tensor(_OP, "block_tables", block_tables, 2)
    _checks.device(_OP, "block_tables", block_tables, q.device)
    batch_size = block_tables.shape[0]
    for name, x in (("seq_lens", seq_lens), ("kv_offsets", kv_offsets),
                    ("full_seq_lens", full_seq_lens)):
        _checks.index_tensor(_OP, name, x, 1)
        _checks.device(_OP, name, x, q.device)
        _checks.dim(_OP, name, x, 0, batch_size, "batch_size, block_tables.shape[0]")
    if window_left != -1:
        _checks.fail(_OP, "window_left", "unsupported", "-1 (no window)", window_left,
                     "sliding windows across shards need per-request positions in the core "
                     "(README: Context parallelism)")
    if q.device.type == "cpu":
        # Free on the host (the core reads CPU index values too); on CUDA they stay unread.
        bad = (kv_offsets < 0) | (kv_offsets.to(torch.int64) + seq_lens > full_seq_lens)
        if bool(bad.any()):
            b = int(bad.nonzero()[0, 0])
            _checks.fail(_OP, f"kv_offsets[{b}]", "out of range",
                         "0 <= kv_offsets[b] and kv_offsets[b] + seq_lens[b] <= full_seq_lens[b]",
                         f"kv_offsets {int(kv_offsets[b])}, seq_lens {int(seq_lens[b])}, "
                         f"full_seq_lens {int(full_seq_lens[b])}")


def _local_prefill(q, kv_cache, block_tables, seq_lens, kv_offsets, full_seq_lens, workspace,
                   cu_seqlens_q, options):
    """This shard's partial of a causal call with several queries per request."""
    batch_size = block_tables.shape[0]
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    after = full_seq_lens - kv_offsets - seq_lens          # keys of the request past the shard
    inside = torch.clamp(q_lens - after, min=0)
    inside = torch.minimum(inside, q_lens)                  # rows at positions <= the shard's end
    # Sub-request 2b: request b's first `inside` rows; 2b + 1: its other rows.
    sub_cu = torch.empty(2 * batch_size + 1, dtype=torch.int32, device=q.device)
    sub_cu[0::2] = cu_seqlens_q
    sub_cu[1::2] = cu_seqlens_q[:-1] + inside
    sub_tables = block_tables.repeat_interleave(2, dim=0)
    zeros = torch.zeros_like(seq_lens)
    lens_inside = torch.stack([seq_lens, zeros], 1).flatten()
    lens_past = torch.stack([zeros, seq_lens], 1).flatten()
    out_a, lse_a = _local_paged_attention(q, kv_cache, sub_tables, lens_inside, workspace,
                                          cu_seqlens_q=sub_cu, causal=True, return_lse=True,
                                          **options)
    out_b, lse_b = _local_paged_attention(q, kv_cache, sub_tables, lens_past, workspace,
                                          cu_seqlens_q=sub_cu, causal=False, return_lse=True,
                                          **options)
    # Every row is empty (out exactly 0, lse -inf) in one of the two calls: the sum and the
    # max are exact.
    return out_a + out_b, torch.maximum(lse_a, lse_b)


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
                    max_q_len=None):
    """Paged attention (decode, chunked prefill) with each request's keys sharded over the
    ranks of a process group; every rank gets the whole result.

    Every rank calls this with the same ``q`` (and ``cu_seqlens_q``, options) and its own
    shard: request ``b``'s keys at absolute positions ``kv_offsets[b] ..
    kv_offsets[b] + seq_lens[b] - 1`` of its ``full_seq_lens[b]`` keys, local key ``t`` in
    page ``block_tables[b, t // page_size]`` at slot ``t % page_size`` of this rank's
    ``kv_cache``. The shards of a request are disjoint and together cover
    ``0 .. full_seq_lens[b] - 1`` (a rank may hold none: ``seq_lens[b] = 0``). Query ``i``
    of ``q_len`` sits at absolute position ``full_seq_lens[b] - q_len + i``; the causal
    mask compares absolute positions. The result is :func:`splitkv.paged_attention` over
    the union of the shards: each rank computes its partial with ``return_lse=True``, one
    all-gather over ``group`` collects every rank's (out, lse) as one byte record per rank,
    and :func:`splitkv.merge_states` merges them in rank order.

    Exactness: the merge is deterministic, so a call is bitwise the same run to run, and
    every rank gets bitwise the same result. A row whose keys all lie on one rank (the
    others contribute lse ``-inf``), and any call on a group of one rank, gives bitwise that
    rank's :func:`splitkv.paged_attention` result. Otherwise the result matches the
    single-device call within the dtype's rounding, not bitwise: each partial is rounded to
    q's dtype before the merge (the in-kernel merge keeps float32 partials), and the
    shards' boundaries need not fall on the single call's split boundaries.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, the same on every rank; as
        :func:`splitkv.paged_attention`.
    kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        This rank's pages; as :func:`splitkv.paged_attention`.
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
        (``kv_offsets + seq_lens <= full_seq_lens``; checked on the CPU only, like the
        core's index values).
    workspace : Workspace or torch.Tensor
        This rank's workspace; as :func:`splitkv.paged_attention`. A causal call with
        ``cu_seqlens_q`` makes two launches on it, one after the other.
    group : torch.distributed.ProcessGroup, optional
        The ranks sharing the keys (default: the default group). NCCL for CUDA tensors,
        gloo for CPU tensors; every rank of it must make the call.
    cu_seqlens_q : torch.Tensor, optional
        ``[batch_size + 1]`` int32: several query tokens per request (chunked prefill).
    kv_layout, sm_scale, causal, logits_soft_cap, num_splits, max_q_len
        As :func:`splitkv.paged_attention`, for this rank's launches.
    window_left : int, default -1
        Only -1: a sliding window is refused (see Raises).
    return_lse : bool, default False
        Also return the merged log-sum-exp.

    Returns
    -------
    out : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, q's dtype, contiguous; 0 for a row that
        sees no key on any rank.
    lse : torch.Tensor
        Only with ``return_lse``: ``[total_q, num_qo_heads]`` float32, natural log;
        ``-inf`` for a row that sees no key on any rank.

    Raises
    ------
    TypeError, ValueError
        As :func:`splitkv.paged_attention` for this rank's arguments (in a causal call with
        ``cu_seqlens_q``, index values are checked by its launches, where request ``b``
        appears as sub-requests ``2b`` and ``2b + 1``); block_tables, seq_lens, kv_offsets
        or full_seq_lens not int32 ``[batch_size]`` on q's device; on the CPU, a shard outside
        its request (``kv_offsets[b] < 0`` or past ``full_seq_lens[b]``); ``window_left``
        other than -1 (shards past a query would need the window placed at an absolute
        position the core cannot be told yet).
    RuntimeError
        From torch.distributed (no default group, a backend that does not support the
        tensors' device).

    Example
    -------
    >>> # rank r of 2 holds keys [r * 64, r * 64 + 64) of each 128-key request
    >>> out = splitkv.distributed.paged_attention(
    ...     q, kv_cache, block_tables, seq_lens, kv_offsets, full_seq_lens, workspace)
    """
    _check(q, block_tables, seq_lens, kv_offsets, full_seq_lens, window_left)
    options = dict(kv_layout=kv_layout, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                   num_splits=num_splits, max_q_len=max_q_len)
    if cu_seqlens_q is not None and causal is True:
        # Checked here: the sub-request arithmetic below reads it before the core does.
        _checks.index_tensor(_OP, "cu_seqlens_q", cu_seqlens_q, 1)
        _checks.dim(_OP, "cu_seqlens_q", cu_seqlens_q, 0, block_tables.shape[0] + 1,
                    "batch_size + 1, block_tables.shape[0] + 1")
        out, lse = _local_prefill(q, kv_cache, block_tables, seq_lens, kv_offsets,
                                  full_seq_lens, workspace, cu_seqlens_q, options)
    else:
        # One query per request (it sits past or at the shard's last key, so it sees the
        # whole shard, as the core's end-aligned mask gives), or no mask at all.
        out, lse = _local_paged_attention(q, kv_cache, block_tables, seq_lens, workspace,
                                          cu_seqlens_q=cu_seqlens_q, causal=causal,
                                          return_lse=True, **options)
    if out.numel() == 0:
        merged_out, merged_lse = out, lse
    else:
        outs, lses = _all_gather(out, lse, group)
        merged_out, merged_lse = merge_states(outs, lses)
    return (merged_out, merged_lse) if return_lse else merged_out
