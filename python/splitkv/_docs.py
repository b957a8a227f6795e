"""The parameter paragraphs several public functions share (paged_attention and
ragged_attention; the workspace entry points), in one place, so the semantics, guarantees
and measured costs they state cannot drift apart.

A docstring names a paragraph by a line holding only ``@name@`` at its parameters'
indentation; :func:`shared_params` puts the paragraph there.
"""

import textwrap

_PARAGRAPHS = {
    "sm_scale": """\
sm_scale : float, optional
    Scale of q.k before the softmax. Default ``1 / sqrt(head_dim)``. The scaled logits
    are float32 and unchecked: one past float32's range (3.4e38) becomes an infinity; a
    +inf logit gives its row NaN, and a row whose logits are all -inf reads as a row that
    sees no key (out 0, LSE -inf).
""",
    "logits_soft_cap": """\
logits_soft_cap : float, default 0.0
    ``c > 0`` turns each scaled logit ``s`` into ``c * tanh(s / c)``; 0 disables it.
""",
    "return_lse": """\
return_lse : bool, default False
    Also return the log-sum-exp.
""",
    "out": """\
out : torch.Tensor, optional
    ``[total_q, num_qo_heads, head_dim]``, q's dtype and device, last dimension dense:
    written in place and returned; its version counter moves, as with torch's own out=
    ops. Not one that requires grad, nor an inference tensor outside inference mode.
    Default: a new tensor.
""",
    "batch_invariant": """\
batch_invariant : bool, default False
    Keyword-only. True: each request's ``out`` and ``lse`` are bitwise the same whatever
    batch it runs in (other requests, their count and order), whatever the workspace
    size and CPU thread count, however its prefill is chunked, and whether a token is
    computed in a prefill or a decode (same backend, build and CPU instruction set).
    Split-KV stays on: splits are cut at absolute KV positions (1024 keys on the
    CPU, 2048 on CUDA: the plan's ``invariant_split_keys``). Bits differ
    from the default mode's. ``num_splits`` must then be None (ValueError otherwise).
    On CUDA (sm_90, 16-bit K/V, head_dim 64/128, up to 16 qo heads per kv head)
    prefill-sized calls run the wgmma prefill where it serves them, and decode tiles
    (and what it declines) a decode-kernel path that reduces rows in its order (the
    same bits); head_dim 256 runs 16-row decode tiles, and fp8 K/V, wider groups or
    other GPUs the mma.sync kernel's prefill tiles. On the H200 (2026-12-06 kernels) that
    costs head_dim 128 decode +0.6 to +7.4 % (1 x 32768 +7.4 %, 12 x 8192 +5.3 %), head_dim
    64 decode up to +20-27 % (1 x 32768, 8 x 4096), prefill +0.5 to +4 %, and most for
    short requests at small batch (1 x 2048: +232 %, one CTA per kv head) against the
    default (README "Batch invariance" has the tables); invariance holds among calls
    whose K/V rows share one 16-byte alignment. The workspace must hold every split's partials,
    ``ceil(max_kv_len / invariant_split_keys)`` of them (ValueError otherwise), except
    where a tile runs its splits in one task: the CPU when they do not fit, and on CUDA
    the calls the wgmma prefill serves (its CTAs fold the splits), which need only the
    counter region.
""",
    "workspace_buffer": """\
workspace : Workspace or torch.Tensor
    A Workspace, or a user's uint8 buffer of at least ``COUNTER_REGION_BYTES`` bytes.
""",
    "sinks": """\
sinks : torch.Tensor, optional
    Keyword-only attention sinks: ``[num_qo_heads]`` float32, contiguous, on q's
    device. ``sinks[h]`` is one extra logit of every row of qo head ``h`` (natural-log
    units, not multiplied by ``sm_scale`` nor soft-capped) whose value is zero:
    ``p_j = exp(s_j) / (exp(sinks[h]) + sum_k exp(s_k))``, and the LSE becomes
    ``log(exp(sinks[h]) + sum_k exp(s_k))``; a row that sees no key gets out 0 and LSE
    ``sinks[h]``. Entered once per row whatever ``num_splits`` is. ``-inf`` means no
    sink for that head. Default None: no sinks. Sinks and per-head scale tensors
    enter the cache of validated layouts by their layout, not their values: each
    layer's own tensors take the per-call path.
""",
}


def shared_params(func):
    """Fills ``func``'s ``@name@`` lines with the shared paragraphs; refuses an unknown name."""
    doc = func.__doc__
    if doc is None:  # python -OO drops docstrings
        return func
    for name, text in _PARAGRAPHS.items():
        doc = doc.replace(f"    @{name}@\n", textwrap.indent(text, "    "))
    if "    @" in doc:
        raise AssertionError(f"{func.__name__}: a docstring marker names no shared paragraph")
    func.__doc__ = doc
    return func
