"""The replay's batch-invariance check (--batch_invariant): sampled requests of a call are run
again alone, through the same operation on the same cache and workspace, and their out and
lse must be bitwise those they got inside the batch."""

import dataclasses

import torch

import splitkv


@dataclasses.dataclass
class InvarianceStats:
    compared: dict = dataclasses.field(default_factory=lambda: {"prefill": 0, "decode": 0})
    differed: int = 0
    failures: list = dataclasses.field(default_factory=list)


def _same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                                              b.view(torch.int16 if b.element_size() == 2 else torch.int32))


def _record(stats, kind, step, seq, got, alone, tag):
    stats.compared[kind] += 1
    if _same(got[0], alone[0]) and _same(got[1], alone[1]):
        return
    stats.differed += 1
    stats.failures.append(f"batch invariance: {kind} step {step} request {seq.request.index}{tag}: out or lse "
                          f"differs from the request run alone (max abs out difference "
                          f"{float((got[0].float() - alone[0].float()).abs().max()):.3g})")


def decode_sample(n):
    """Which requests of a decode batch of n are re-run: the first, the middle and the last."""
    return sorted({0, n // 2, n - 1}) if n > 0 else []


def check_prefill(step, seqs, out, lse, stats, alone, tag=""):
    """Re-runs each request of a prefill alone: alone(seq, rows, n) gives (out, lse) of the
    request whose n tokens are the batch's rows (ragged_alone, or the runner's sharded call
    under --context_parallel); tag: the layer, in messages."""
    offset = 0
    for seq in seqs:
        n = seq.request.context_tokens
        rows = slice(offset, offset + n)
        _record(stats, "prefill", step, seq, (out[rows], lse[rows]), alone(seq, rows, n), tag)
        offset += n


def check_decode(step, seqs, out, lse, stats, alone, tag=""):
    """Re-runs sampled requests of a decode alone: alone(i) gives (out, lse) of the batch's
    request i by itself (paged_alone, or the runner's sharded call); tag as in check_prefill."""
    for i in decode_sample(len(seqs)):
        _record(stats, "decode", step, seqs[i], (out[i:i + 1], lse[i:i + 1]), alone(i), tag)


def ragged_alone(q, k, v, workspace, sm_scale, options):
    """check_prefill's alone: the request's own ragged call (options: the layer's window,
    sinks, fp8 scales, as in the batched call)."""
    def alone(seq, rows, n):
        cu = torch.tensor([0, n], dtype=torch.int32, device=q.device)
        return splitkv.ragged_attention(q[rows], k[rows], v[rows], cu, cu, workspace, causal=True,
                                        sm_scale=sm_scale, max_q_len=n, return_lse=True, batch_invariant=True,
                                        **options)
    return alone


def paged_alone(q, kv_cache, block_tables, seq_lens, workspace, kv_layout, sm_scale, options):
    """check_decode's alone: a one-row paged call (the request's block-table row and length)."""
    def alone(i):
        return splitkv.paged_attention(q[i:i + 1], kv_cache, block_tables[i:i + 1], seq_lens[i:i + 1],
                                       workspace, kv_layout=kv_layout, causal=True, sm_scale=sm_scale,
                                       max_q_len=1, return_lse=True, batch_invariant=True, **options)
    return alone


def workspace_bytes_needed(requests, shape, max_prefill_tokens, max_batch_size, max_pages_per_seq):
    """Bytes an invariant replay needs on CUDA, where every split's partials must fit the
    workspace: the largest prefill step (max_prefill_tokens, or one longer prompt) at
    ceil(its keys / 1024) splits, or the largest decode batch at the cache's capacity. 1024:
    the smallest invariant split of any backend (CUDA's is 2048), so an upper bound."""
    split_keys = 1024
    prefill = max([max_prefill_tokens] + [r.context_tokens for r in requests])
    capacity = max_pages_per_seq * shape.page_size
    return max(
        splitkv.required_workspace_bytes(prefill, shape.num_qo_heads, shape.head_dim, -(-prefill // split_keys)),
        splitkv.required_workspace_bytes(max_batch_size, shape.num_qo_heads, shape.head_dim,
                                         max(1, -(-capacity // split_keys))))
