"""splitkv's one float64 attention reference: plain torch, for the tests and the tools.

The semantics of splitkv's operations: query i of a request with q_len queries and kv_len
keys sits at KV position kv_len - q_len + i (the queries are the last q_len tokens);
causal: it sees keys j <= that position; a window w >= 0 also needs j >= position - w; a
soft cap c > 0 maps the scaled logit s to c * tanh(s / c); LSE is the natural-log
log-sum-exp of the visible logits. A row that sees no key gets output 0 and LSE -inf,
never NaN. Sinks (sinks[h], one per qo head): one extra logit of every row of head h, not
scaled nor capped, with a zero value vector: it joins the softmax's denominator and the
LSE, so a row that sees no key gets output 0 and LSE sinks[h].

Masked keys (outside the causal mask or the window, padding past kv_len) never reach a
result, whatever their K and V hold (NaN included). A non-finite value in a visible q, k
or v propagates as IEEE arithmetic says: a NaN or +inf logit makes its row's LSE NaN or
+inf (the output then holds 0, or NaN/inf where a visible V is non-finite), a non-finite
visible V makes the output elements it enters NaN or infinite.

Everything runs in float64 on the inputs' device (callers comparing on the CPU move the
inputs first). Query heads are grouped by the kv head they read (qo head h reads kv head
h // (num_qo_heads // num_kv_heads)), so K and V are never repeated per qo head, and query
rows are processed in chunks so that the float64 scores held at once stay bounded.
"""

import torch

__all__ = ["attention", "decode_attention", "padded_attention", "ragged_attention"]

# Bound on float64 score elements held at once (rows x qo heads x keys): 256 MiB.
_MAX_SCORE_ELEMENTS = 1 << 25


def _group(op, q, k):
    num_qo_heads, num_kv_heads = q.shape[-2], k.shape[-2]
    if num_kv_heads == 0 or num_qo_heads % num_kv_heads:
        raise ValueError(f"{op}: num_qo_heads must be a multiple of num_kv_heads: expected "
                         f"num_qo_heads % num_kv_heads == 0, got {num_qo_heads} and {num_kv_heads}")
    return num_qo_heads // num_kv_heads


def _visible(keys, positions, valid, causal, window_left):
    """[..., rows, keys] bool: which keys each row sees. positions [..., rows] are the rows'
    KV positions, valid [..., rows, keys] (or broadcastable) what is neither padding nor an
    absent row."""
    positions = positions[..., None]
    visible = valid
    if causal:
        visible = visible & (keys <= positions)
    if window_left >= 0:
        visible = visible & (keys >= positions - window_left)
    return visible


class _NonfiniteValues:
    """Where V holds NaN or an infinity: v64 gets 0 there, so that the product of a masked
    key's zero weight with it stays 0; add() then puts back what the visible ones bring."""

    def __init__(self, v64):
        bad = ~torch.isfinite(v64)  # v64: [groups, keys, head_dim]
        self.any = bool(bad.any())
        if self.any:
            self.group, self.key, self.dim = bad.nonzero(as_tuple=True)
            self.values = v64[bad]
            v64.masked_fill_(bad, 0.0)

    def add(self, out, probs, visible):
        """out, probs: [groups, rows, head_dim], [groups, rows, keys]; visible broadcasts to
        probs. Adds weight * value of each non-finite element to the rows that see its key
        (0 * NaN included: a visible key whose weight underflows still spreads NaN)."""
        if not self.any:
            return
        visible = visible.expand(probs.shape)
        seen = visible[self.group, :, self.key]  # [count, rows]
        terms = torch.where(seen, probs[self.group, :, self.key] * self.values[:, None], 0.0)
        rows = torch.arange(probs.shape[1], device=probs.device)
        out.index_put_((self.group[:, None], rows[None, :], self.dim[:, None]), terms,
                       accumulate=True)


def _softmax_product(q64, k64_t, v64, visible, nonfinite, sm_scale, logits_soft_cap,
                     row_sinks=None):
    """q64 [groups, rows, head_dim] against k64_t [groups, head_dim, keys] and v64 [groups,
    keys, head_dim] (non-finite elements zeroed, listed in nonfinite); visible broadcasts to
    [groups, rows, keys]; row_sinks (float64, broadcasting to [groups, rows]) or None.
    Returns out [groups, rows, head_dim] and lse [groups, rows]."""
    logits = torch.bmm(q64, k64_t).mul_(sm_scale)
    if logits_soft_cap > 0:
        logits = torch.tanh(logits.div_(logits_soft_cap)).mul_(logits_soft_cap)
    # Filled, not added: a NaN logit of a masked key must vanish too.
    logits.masked_fill_(~visible, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # -inf for a row that sees no key
    if row_sinks is not None:
        # The sink's logit joins the denominator; its value vector is zero.
        lse = torch.logaddexp(lse, row_sinks.expand(lse.shape))
    # A row whose LSE is not finite (none visible, or a NaN / +inf logit) gets weights 0.
    finite = torch.isfinite(lse)
    probs = torch.exp(logits.sub_(torch.where(finite, lse, 0.0)[..., None]))
    probs.masked_fill_(~finite[..., None], 0.0)
    out = torch.bmm(probs, v64)
    nonfinite.add(out, probs, visible)
    return out, lse


def attention(q, k, v, *, causal=True, sm_scale=None, window_left=-1, logits_soft_cap=0.0,
              positions=None, sinks=None):
    """One request's attention in float64, on q's device.

    Parameters
    ----------
    q : torch.Tensor
        [q_len, num_qo_heads, head_dim], any float dtype, any strides.
    k, v : torch.Tensor
        [kv_len, num_kv_heads, head_dim], on q's device; num_qo_heads a multiple of
        num_kv_heads.
    causal : bool, default True
        Query i sees keys j <= its position.
    sm_scale : float, default 1 / sqrt(head_dim)
        Scale of q . k before the soft cap and the softmax.
    window_left : int, default -1
        w >= 0: query i also needs j >= its position - w; -1: no window.
    logits_soft_cap : float, default 0.0
        c > 0: logits become c * tanh(logits / c); 0: no cap.
    positions : sequence of int or torch.Tensor, optional
        [q_len] KV position of each query row; default kv_len - q_len + i (the queries are
        the request's last q_len tokens). Lets a caller check a few sampled rows alone.
    sinks : torch.Tensor, optional
        [num_qo_heads] sink logits (any float dtype, any device); None: no sinks.

    Returns
    -------
    out : torch.Tensor
        [q_len, num_qo_heads, head_dim] float64; 0 in rows that see no key.
    lse : torch.Tensor
        [q_len, num_qo_heads] float64, natural log; -inf (sinks[h]) in rows that see no
        key.

    Raises
    ------
    ValueError
        num_qo_heads not a multiple of num_kv_heads.

    Example
    -------
    >>> q, k, v = torch.randn(3, 8, 64), torch.randn(10, 2, 64), torch.randn(10, 2, 64)
    >>> out, lse = attention(q, k, v, window_left=4)  # rows at positions 7, 8, 9
    """
    group = _group("attention", q, k)
    q_len, num_qo_heads, head_dim = q.shape
    kv_len, num_kv_heads, _ = k.shape
    device = q.device
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    if positions is None:
        positions = torch.arange(kv_len - q_len, kv_len, device=device)
    else:
        positions = torch.as_tensor(positions, dtype=torch.int64, device=device)
    # Contiguous float64 copies in the layout bmm wants, K transposed: a transposed view as
    # bmm's right operand is ~100x slower on the CPU.
    k64_t = k.to(torch.float64).permute(1, 2, 0).contiguous()  # [num_kv_heads, head_dim, kv_len]
    # [num_kv_heads, kv_len, head_dim], a copy even of float64 input: it gets zeroed in places.
    v64 = v.transpose(0, 1).to(torch.float64, memory_format=torch.contiguous_format, copy=True)
    nonfinite = _NonfiniteValues(v64)
    keys = torch.arange(kv_len, device=device)
    every_key = torch.ones((), dtype=torch.bool, device=device)  # no padding, no absent row
    out = torch.empty((q_len, num_qo_heads, head_dim), dtype=torch.float64, device=device)
    lse = torch.empty((q_len, num_qo_heads), dtype=torch.float64, device=device)
    # Sinks per (kv head, row of a chunk): rows run (query, group member).
    head_sinks = None if sinks is None else \
        sinks.to(device, torch.float64).reshape(num_kv_heads, 1, group)
    rows = max(1, _MAX_SCORE_ELEMENTS // max(1, num_qo_heads * kv_len))
    for begin in range(0, q_len, rows):
        end = min(q_len, begin + rows)
        n = end - begin
        # Rows of a chunk ordered (query, group member) within each kv head.
        q64 = q[begin:end].to(torch.float64).reshape(n, num_kv_heads, group, head_dim)
        q64 = q64.transpose(0, 1).reshape(num_kv_heads, n * group, head_dim)
        row_positions = positions[begin:end].repeat_interleave(group)
        visible = _visible(keys, row_positions, every_key, causal, window_left)[None]
        row_sinks = None if sinks is None else \
            head_sinks.expand(num_kv_heads, n, group).reshape(num_kv_heads, n * group)
        chunk_out, chunk_lse = _softmax_product(q64, k64_t, v64, visible, nonfinite, sm_scale,
                                                logits_soft_cap, row_sinks)
        out[begin:end] = chunk_out.reshape(num_kv_heads, n, group, head_dim).transpose(0, 1) \
            .reshape(n, num_qo_heads, head_dim)
        lse[begin:end] = chunk_lse.reshape(num_kv_heads, n, group).transpose(0, 1) \
            .reshape(n, num_qo_heads)
    return out, lse


def ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, **options):
    """Packed requests, each through attention() with the same options.

    Parameters
    ----------
    q : torch.Tensor
        [total_q, num_qo_heads, head_dim]; request b's queries are rows
        cu_seqlens_q[b] .. cu_seqlens_q[b + 1].
    k, v : torch.Tensor
        [total_kv, num_kv_heads, head_dim]; request b's keys likewise by cu_seqlens_kv.
    cu_seqlens_q, cu_seqlens_kv : torch.Tensor
        [batch_size + 1] int, on any device.
    **options
        causal, sm_scale, window_left, logits_soft_cap, sinks: as attention().

    Returns
    -------
    (out, lse) : float64 tensors [total_q, num_qo_heads, head_dim] and
        [total_q, num_qo_heads] on q's device.
    """
    cu_q = [int(x) for x in cu_seqlens_q.cpu()]
    cu_kv = [int(x) for x in cu_seqlens_kv.cpu()]
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        out, lse = attention(q[cu_q[b]:cu_q[b + 1]], k[cu_kv[b]:cu_kv[b + 1]],
                             v[cu_kv[b]:cu_kv[b + 1]], **options)
        outs.append(out)
        lses.append(lse)
    if not outs:
        num_qo_heads, head_dim = q.shape[1:]
        return (torch.zeros((0, num_qo_heads, head_dim), dtype=torch.float64, device=q.device),
                torch.zeros((0, num_qo_heads), dtype=torch.float64, device=q.device))
    return torch.cat(outs), torch.cat(lses)


def padded_attention(q, k, v, q_lens, kv_lens, *, causal=True, sm_scale=None, window_left=-1,
                     logits_soft_cap=0.0, sinks=None):
    """A batch of requests padded to common lengths, in float64 on q's device.

    Parameters
    ----------
    q : torch.Tensor
        [batch_size, max_q_len, num_qo_heads, head_dim]; request b's queries are its first
        q_lens[b] rows, at KV positions kv_lens[b] - q_lens[b] + i.
    k, v : torch.Tensor
        [batch_size, max_kv_len, num_kv_heads, head_dim]; keys at j >= kv_lens[b] are
        padding and may hold anything (NaN included): they never reach a result.
    q_lens, kv_lens : torch.Tensor
        [batch_size] int, on any device.
    causal, sm_scale, window_left, logits_soft_cap, sinks
        As attention().

    Returns
    -------
    out : torch.Tensor
        [batch_size, max_q_len, num_qo_heads, head_dim] float64; 0 in rows past q_len.
    lse : torch.Tensor
        [batch_size, max_q_len, num_qo_heads] float64; -inf (sinks[h]) in rows past q_len.
    """
    group = _group("padded_attention", q, k)
    batch, max_q_len, num_qo_heads, head_dim = q.shape
    _, max_kv_len, num_kv_heads, _ = k.shape
    device = q.device
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    q_lens, kv_lens = q_lens.to(device, torch.int64), kv_lens.to(device, torch.int64)
    out = torch.empty(q.shape, dtype=torch.float64, device=device)
    lse = torch.empty(q.shape[:3], dtype=torch.float64, device=device)
    keys = torch.arange(max_kv_len, device=device)
    query_rows = torch.arange(max_q_len, device=device)
    # Sinks per (request x kv head, row): rows run (query, group member).
    head_sinks = None if sinks is None else \
        sinks.to(device, torch.float64).reshape(1, num_kv_heads, 1, group)
    step = max(1, _MAX_SCORE_ELEMENTS // max(1, max_q_len * num_qo_heads * max_kv_len))
    for begin in range(0, batch, step):
        end = min(batch, begin + step)
        n = end - begin
        present = keys[None, :] < kv_lens[begin:end, None]  # [n, max_kv_len]
        absent = ~present[:, :, None, None]
        # Padding zeroed in the float64 copies, so that it never reaches the non-finite list
        # (its zero weights then meet zeros).
        k64_t = k[begin:end].to(torch.float64, copy=True).masked_fill_(absent, 0.0) \
            .permute(0, 2, 3, 1).reshape(n * num_kv_heads, head_dim, max_kv_len).contiguous()
        v64 = v[begin:end].to(torch.float64, copy=True).masked_fill_(absent, 0.0) \
            .permute(0, 2, 1, 3).reshape(n * num_kv_heads, max_kv_len, head_dim)
        nonfinite = _NonfiniteValues(v64)
        q64 = q[begin:end].to(torch.float64).reshape(n, max_q_len, num_kv_heads, group, head_dim)
        q64 = q64.permute(0, 2, 1, 3, 4).reshape(n * num_kv_heads, max_q_len * group, head_dim)
        positions = query_rows[None, :] + (kv_lens - q_lens)[begin:end, None]  # [n, max_q_len]
        valid = present[:, None, :] & (query_rows[None, :] < q_lens[begin:end, None])[:, :, None]
        visible = _visible(keys, positions, valid, causal, window_left)  # [n, max_q_len, keys]
        visible = visible.repeat_interleave(group, dim=1)[:, None] \
            .expand(n, num_kv_heads, max_q_len * group, max_kv_len) \
            .reshape(n * num_kv_heads, max_q_len * group, max_kv_len)
        row_sinks = None if sinks is None else head_sinks.expand(
            n, num_kv_heads, max_q_len, group).reshape(n * num_kv_heads, max_q_len * group)
        chunk_out, chunk_lse = _softmax_product(q64, k64_t, v64, visible, nonfinite, sm_scale,
                                                logits_soft_cap, row_sinks)
        out[begin:end] = chunk_out.reshape(n, num_kv_heads, max_q_len, group, head_dim) \
            .permute(0, 2, 1, 3, 4).reshape(n, max_q_len, num_qo_heads, head_dim)
        lse[begin:end] = chunk_lse.reshape(n, num_kv_heads, max_q_len, group) \
            .permute(0, 2, 1, 3).reshape(n, max_q_len, num_qo_heads)
    return out, lse


def decode_attention(q, k, v, kv_lens, **options):
    """One query per request over padded keys (a batch of decodes), in float64 on q's device.

    Parameters
    ----------
    q : torch.Tensor
        [batch_size, num_qo_heads, head_dim]; request b's query sits at KV position
        kv_lens[b] - 1, so it sees all of its keys (but for a window).
    k, v : torch.Tensor
        [batch_size, max_kv_len, num_kv_heads, head_dim]; keys at j >= kv_lens[b] are
        padding and may hold anything (NaN included): they never reach a result.
    kv_lens : torch.Tensor
        [batch_size] int, on any device; a request with kv_len 0 gets out 0, lse -inf.
    **options
        sm_scale, window_left, logits_soft_cap, sinks: as attention().

    Returns
    -------
    (out, lse) : float64 tensors [batch_size, num_qo_heads, head_dim] and
        [batch_size, num_qo_heads] on q's device.
    """
    q_lens = torch.ones_like(kv_lens)
    out, lse = padded_attention(q[:, None], k, v, q_lens, kv_lens, **options)
    return out[:, 0], lse[:, 0]
