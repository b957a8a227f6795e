"""Float64 attention of one request, the replay's reference (DESIGN.md semantics, causal, GQA)."""

import torch

# Bound on float64 score elements held at once (rows x heads x keys): 256 MiB.
_MAX_SCORE_ELEMENTS = 1 << 25


def attention_reference(q, k, v, sm_scale, causal=True):
    """Attention of one request in float64.

    Parameters
    ----------
    q : torch.Tensor
        [q_len, num_qo_heads, head_dim]; the queries are the last q_len of the kv_len tokens.
    k, v : torch.Tensor
        [kv_len, num_kv_heads, head_dim]; num_qo_heads a multiple of num_kv_heads.
    sm_scale : float
    causal : bool, default True
        Query i sees keys j <= kv_len - q_len + i.

    Returns
    -------
    (out, lse) : float64 tensors [q_len, num_qo_heads, head_dim] and [q_len, num_qo_heads];
        lse is the natural-log log-sum-exp of the scaled logits; a row with no visible key
        gets out 0 and lse -inf.
    """
    q_len, num_qo_heads, head_dim = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_qo_heads // num_kv_heads
    # Heads grouped by the kv head they share: [num_kv_heads, head_dim, kv_len] keys against
    # [num_kv_heads, rows * group, head_dim] queries, so K/V are never repeated per qo head.
    # Keys are made contiguous as bmm's right operand: a transposed view is ~100x slower on CPU.
    k64_t = k.to(torch.float64).permute(1, 2, 0).contiguous()
    v64 = v.to(torch.float64).transpose(0, 1).contiguous()
    out = torch.zeros((q_len, num_qo_heads, head_dim), dtype=torch.float64, device=q.device)
    lse = torch.full((q_len, num_qo_heads), float("-inf"), dtype=torch.float64, device=q.device)
    keys = torch.arange(kv_len, device=q.device)
    rows = max(1, _MAX_SCORE_ELEMENTS // max(1, num_qo_heads * kv_len))
    for begin in range(0, q_len, rows):
        end = min(q_len, begin + rows)
        n = end - begin
        q64 = q[begin:end].to(torch.float64).reshape(n, num_kv_heads, group, head_dim)
        q64 = q64.transpose(0, 1).reshape(num_kv_heads, n * group, head_dim)
        logits = torch.bmm(q64, k64_t) * sm_scale  # [kv heads, rows * group, kv_len]
        if causal:
            positions = (kv_len - q_len + torch.arange(begin, end, device=q.device)).repeat_interleave(group)
            logits.masked_fill_(keys[None, :] > positions[:, None], float("-inf"))
        row_lse = torch.logsumexp(logits, dim=-1)  # [kv heads, rows * group]
        visible = torch.isfinite(row_lse)
        probs = torch.exp(logits - torch.where(visible, row_lse, 0.0)[..., None])
        probs = torch.where(visible[..., None], probs, 0.0)
        chunk = torch.bmm(probs, v64)  # [kv heads, rows * group, head_dim]
        chunk = chunk.reshape(num_kv_heads, n, group, head_dim).transpose(0, 1)
        out[begin:end] = chunk.reshape(n, num_qo_heads, head_dim)
        lse[begin:end] = row_lse.reshape(num_kv_heads, n, group).transpose(0, 1).reshape(n, num_qo_heads)
    return out, lse


def decode_reference(q, k, v, kv_lens, sm_scale):
    """Attention of one query token per request over padded keys, in float64 (a batch of decodes).

    Parameters
    ----------
    q : torch.Tensor
        [batch, num_qo_heads, head_dim]; request b's query sits at position kv_lens[b] - 1.
    k, v : torch.Tensor
        [batch, max_kv_len, num_kv_heads, head_dim]; keys at j >= kv_lens[b] are padding and
        may hold anything (NaN included): they are never read into a result.
    kv_lens : torch.Tensor
        [batch] int, each >= 1.
    sm_scale : float

    Returns
    -------
    (out, lse) : float64 tensors [batch, num_qo_heads, head_dim] and [batch, num_qo_heads].
    """
    batch, num_qo_heads, head_dim = q.shape
    _, max_kv_len, num_kv_heads, _ = k.shape
    group = num_qo_heads // num_kv_heads
    valid = torch.arange(max_kv_len, device=q.device)[None, :] < kv_lens.to(q.device)[:, None]  # [batch, max_kv_len]
    # Padding zeroed before the softmax weights meet it (0 * NaN would be NaN); the float64
    # copies come out contiguous in the layout bmm wants.
    k = k.masked_fill(~valid[:, :, None, None], 0)
    v = v.masked_fill(~valid[:, :, None, None], 0)
    contiguous = torch.contiguous_format
    k64_t = k.permute(0, 2, 3, 1).to(torch.float64, memory_format=contiguous)
    k64_t = k64_t.reshape(batch * num_kv_heads, head_dim, max_kv_len)
    v64 = v.permute(0, 2, 1, 3).to(torch.float64, memory_format=contiguous)
    v64 = v64.reshape(batch * num_kv_heads, max_kv_len, head_dim)
    q64 = q.to(torch.float64).reshape(batch * num_kv_heads, group, head_dim)
    logits = torch.bmm(q64, k64_t) * sm_scale  # [batch * kv heads, group, max_kv_len]
    hidden = ~valid.repeat_interleave(num_kv_heads, dim=0)[:, None, :]
    logits.masked_fill_(hidden, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.bmm(torch.exp(logits - lse[..., None]), v64)
    return out.reshape(batch, num_qo_heads, head_dim), lse.reshape(batch, num_qo_heads)
