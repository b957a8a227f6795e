"""merge_states: partial attentions over disjoint key sets, merged by their LSE.

The same merge the kernels do between splits of one launch, one level up: between launches,
devices or ranks (splitkv.distributed). float32/float16/bfloat16 run the C++ core's
MergeStates (cc/splitkv/merge_states.h: one loop on the CPU, one kernel launch on CUDA,
graph-capturable); float64 runs the same formula in torch ops, in float64. Fixed order, so
a result is bitwise the same run to run.
"""

import torch

from splitkv import _checks
from splitkv import _splitkv
from splitkv import workspace as workspace_module

_OP = "merge_states"
# A CPU-only build of the core still merges CUDA tensors, through the torch formula.
_CUDA_CORE = _splitkv.CudaBackendAvailable()


def _check(outs, lses):
    _checks.tensor(_OP, "outs", outs)
    _checks.tensor(_OP, "lses", lses)
    _checks.rank(_OP, "outs", outs, 4, "[n, total_q, num_qo_heads, head_dim]")
    _checks.rank(_OP, "lses", lses, 3, "[n, total_q, num_qo_heads]")
    _checks.floating(_OP, "outs", outs)
    _checks.dtype_is(_OP, "lses", lses, torch.float32)
    if lses.device != outs.device:
        _checks.fail(_OP, "lses device", "mismatch", f"{outs.device} (outs' device)", lses.device,
                     f"move lses to {outs.device}")
    if lses.shape != outs.shape[:3]:
        _checks.fail(_OP, "lses", "shape mismatch", f"{tuple(outs.shape[:3])} (outs.shape[:3])",
                     tuple(lses.shape))
    _checks.at_least(_OP, "outs.shape[0]", outs.shape[0], 1, "one partial per key set")
    # As the core refuses them (num_qo_heads, head_dim >= 1), for every dtype alike.
    _checks.at_least(_OP, "outs.shape[2]", outs.shape[2], 1, "num_qo_heads")
    _checks.at_least(_OP, "outs.shape[3]", outs.shape[3], 1, "head_dim")


def merge_states(outs, lses):
    """Merge partial attention outputs over disjoint key sets into one, by their LSE.

    Partial ``s`` is attention over key set ``K_s`` (its softmax normalised over ``K_s``
    alone) with ``lses[s] = log(sum_{j in K_s} exp(logit_j))``. The key sets are disjoint;
    the result is attention over their union. Per (row, head), with ``n`` partials::

        M       = max over s with lses[s] > -inf of lses[s]
        w_s     = exp(lses[s] - M)            (0 where lses[s] == -inf)
        total   = w_0 + w_1 + ... + w_{n-1}   (left to right, float32)
        out     = (w_0 / total) * outs[0] + ... + (w_{n-1} / total) * outs[n-1]
                                              (left to right, float32; a term with w_s == 0
                                               adds exactly 0, whatever outs[s] holds)
        lse     = M + log(total)

    A row whose every ``lses[s]`` is ``-inf`` (no partial saw a key) gives out 0 and lse
    ``-inf``, never NaN. A row with exactly one partial above ``-inf`` gives that partial's
    out and lse back bitwise (``w_s / total`` is exactly 1). Deterministic: the same inputs
    give bitwise the same result (fixed order, no atomics). NaN in ``lses`` or in a
    weighted ``outs[s]`` propagates; so does a ``+inf`` in ``lses`` (``exp(inf - inf)`` is
    NaN): out and lse of that row are NaN, as :func:`splitkv.paged_attention` gives for a
    ``+inf`` sink.

    Parameters
    ----------
    outs : torch.Tensor
        ``[n, total_q, num_qo_heads, head_dim]``, any floating dtype, any strides, CPU or
        CUDA; ``n >= 1`` partials.
    lses : torch.Tensor
        ``[n, total_q, num_qo_heads]`` float32 on outs' device: natural-log log-sum-exp of
        each partial's (scaled) logits, ``-inf`` for a partial that saw no key (its outs
        row is then ignored).

    Returns
    -------
    out : torch.Tensor
        ``[total_q, num_qo_heads, head_dim]``, outs' dtype, contiguous (weights and sums
        in float32; a float64 ``outs`` is merged in float64 throughout, its lses widened
        first). Forward only: no autograd graph is recorded, whatever outs.requires_grad is.
    lse : torch.Tensor
        ``[total_q, num_qo_heads]`` float32, contiguous (from float64 for a float64 outs).

    Raises
    ------
    TypeError
        outs or lses not a tensor, outs not floating point, lses not float32.
    ValueError
        A wrong rank, lses' shape other than ``outs.shape[:3]``, ``n``, num_qo_heads or
        head_dim 0, or the two on different devices.

    Example
    -------
    >>> out_a, lse_a = splitkv.paged_attention(q, kv, tables_a, lens_a, ws, return_lse=True)
    >>> out_b, lse_b = splitkv.paged_attention(q, kv, tables_b, lens_b, ws, return_lse=True)
    >>> out, lse = splitkv.merge_states(torch.stack([out_a, out_b]),
    ...                                 torch.stack([lse_a, lse_b]))
    """
    _check(outs, lses)
    if outs.dtype in _checks.DTYPE_CODES and (outs.device.type == "cpu" or
                                              (outs.device.type == "cuda" and _CUDA_CORE)):
        return _merge_core(outs, lses)
    return _merge_torch(outs, lses)


def _merge_core(outs, lses):
    """The C++ core's MergeStates: any strides of lses, outs' head_dim contiguous."""
    if outs.stride(3) != 1:
        outs = outs.contiguous()  # the core reads a head's elements as one run
    n, total_q, num_qo_heads, head_dim = outs.shape
    out = outs.new_empty((total_q, num_qo_heads, head_dim))
    lse = lses.new_empty((total_q, num_qo_heads))
    device = outs.device
    with workspace_module.on_device(device):
        stream = workspace_module.current_raw_stream(device.index) if device.type == "cuda" else 0
        _splitkv.MergeStates(
            outs.data_ptr(), outs.stride(0), outs.stride(1), outs.stride(2),
            lses.data_ptr(), lses.stride(0), lses.stride(1), lses.stride(2),
            out.data_ptr(), out.stride(0), out.stride(1),
            lse.data_ptr(), lse.stride(0), lse.stride(1),
            n, total_q, num_qo_heads, head_dim,
            _checks.DTYPE_CODES[outs.dtype], _checks.BACKENDS[device.type], stream)
    return out, lse


@torch.no_grad()  # forward only, as the core's path
def _merge_torch(outs, lses):
    """The same formula in torch ops (float64, or a device the core does not run on)."""
    acc_dtype = torch.float64 if outs.dtype == torch.float64 else torch.float32
    lses = lses.to(acc_dtype)  # float64: weights, total and lse in float64 too
    empty = lses == float("-inf")
    m = lses.amax(dim=0)
    # Rows with no key anywhere: M is -inf; 0 keeps exp() away from -inf - -inf = NaN.
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    weights = torch.where(empty, torch.zeros_like(lses), torch.exp(lses - m))
    total = weights[0].clone()
    for s in range(1, weights.shape[0]):
        total = total + weights[s]
    # total is 0 only where every partial is empty: scale 0 there (not 0 / 0).
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    out = torch.zeros(outs.shape[1:], dtype=acc_dtype, device=outs.device)
    for s in range(weights.shape[0]):
        scale = (weights[s] / safe_total).unsqueeze(-1)
        term = scale.to(acc_dtype) * outs[s].to(acc_dtype)
        # An empty partial adds exactly 0 even where its outs hold NaN (0 * NaN would not);
        # a NaN weight (NaN in lses) is not 0, so it propagates.
        out = out + torch.where(weights[s].unsqueeze(-1) != 0, term, torch.zeros_like(term))
    lse = m + torch.log(total)
    return out.to(outs.dtype), lse.to(torch.float32)
