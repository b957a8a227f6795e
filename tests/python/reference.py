"""The float64 reference for splitkv's tests: plain torch, one request at a time.

Semantics of ../shared/DESIGN.md: query i of a request with q_len queries and kv_len keys
sits at position kv_len - q_len + i; causal: it sees keys j <= that position; a window
w >= 0 also needs j >= position - w; a soft cap c > 0 maps the scaled logit s to
c * tanh(s / c); LSE is the natural-log log-sum-exp of the visible logits. A row that sees
no key gets output 0 and LSE -inf.
"""

import torch


def attention(q, k, v, *, causal=True, sm_scale=None, window_left=-1, logits_soft_cap=0.0):
    """One request's attention in float64.

    Parameters
    ----------
    q : [q_len, num_qo_heads, head_dim]; k, v : [kv_len, num_kv_heads, head_dim]
        Any float dtype (converted to float64), on any device (moved to the CPU).

    Returns
    -------
    out : [q_len, num_qo_heads, head_dim] float64
    lse : [q_len, num_qo_heads] float64
    """
    q, k, v = (x.detach().cpu().to(torch.float64) for x in (q, k, v))
    q_len, num_qo_heads, head_dim = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_qo_heads // num_kv_heads
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    # qo head h reads kv head h // group.
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if logits_soft_cap > 0:
        logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
    position = torch.arange(q_len, dtype=torch.int64)[:, None] + (kv_len - q_len)
    key = torch.arange(kv_len, dtype=torch.int64)[None, :]
    visible = torch.ones(q_len, kv_len, dtype=torch.bool)
    if causal:
        visible &= key <= position
    if window_left >= 0:
        visible &= key >= position - window_left
    logits = logits.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [h, q]; -inf for empty rows
    weights = torch.exp(logits - lse[..., None])
    weights = torch.nan_to_num(weights, nan=0.0)  # empty rows: exp(-inf - -inf)
    out = torch.einsum("hqk,khd->qhd", weights, v)
    return out, lse.transpose(0, 1).contiguous()


def ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, **options):
    """Packed requests: q [total_q, ...], k, v [total_kv, ...]; returns (out, lse) float64."""
    cu_q = [int(x) for x in cu_seqlens_q.cpu()]
    cu_kv = [int(x) for x in cu_seqlens_kv.cpu()]
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        out, lse = attention(q[cu_q[b]:cu_q[b + 1]], k[cu_kv[b]:cu_kv[b + 1]],
                             v[cu_kv[b]:cu_kv[b + 1]], **options)
        outs.append(out)
        lses.append(lse)
    num_qo_heads, head_dim = q.shape[1:]
    if not outs:
        return (torch.zeros(0, num_qo_heads, head_dim, dtype=torch.float64),
                torch.zeros(0, num_qo_heads, dtype=torch.float64))
    return torch.cat(outs), torch.cat(lses)
