"""splitkv's operations as torch.library custom ops: torch.compile(fullgraph=True), CUDA graphs.

:func:`splitkv.paged_attention` and :func:`splitkv.ragged_attention` hand raw pointers to
the C++ launchers, which torch.compile cannot trace. The functions here take the same
arguments and return the same results, but reach the launchers through two custom ops
that the compiler treats as opaque calls with a known effect:

``torch.ops.splitkv.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, workspace,
out, lse, cu_seqlens_q, kv_layout, sm_scale, causal, window_left, logits_soft_cap,
num_splits, max_q_len, batch_invariant, sinks, k_scale, k_scales, v_scale, v_scales,
kv_offsets, full_seq_lens) -> ()``

``torch.ops.splitkv.ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, out,
lse, causal, sm_scale, window_left, logits_soft_cap, num_splits, max_q_len,
batch_invariant, sinks, k_scale, k_scales, v_scale, v_scales) -> ()``

Each op writes ``out`` (and ``lse`` when given) and declares ``workspace`` mutated too: the
split counters in its first bytes are read, modified and written back to zero, and the
softmax and scratch regions are overwritten. The compiler therefore keeps the calls in
order, and inductor passes the caller's buffers themselves (no copies) when they are the
compiled function's inputs. Functionalization without re-inplacing copies a mutated
argument instead: the ``aot_eager`` backend does for every call, and inductor for a
workspace sliced inside the compiled function; the call is then made on that copy (a
workspace's worth of copying each call), which on the CPU torch aligns to 64 bytes, so it
may be refused as misaligned. Pass the workspace (a :class:`splitkv.Workspace` or your
256-byte-aligned buffer) into the compiled function as it is. As torch requires of every
custom op, ``out`` and ``lse`` must not alias another argument under torch.compile (the
eager calls refuse it; compiled, torch may fail first with an error of its own).
``v_cache`` is None when ``k_cache`` is the whole 5-D cache. An fp8 cache's scales come as
a float (``k_scale``) or a tensor (``k_scales``), the other None.

Validation: the functions check Python types and option values (what the op schema would
otherwise refuse with a less helpful message, or convert: called directly, the raw ops
receive torch's conversions, e.g. ``causal=None`` as False, an int 1 as True, a one-element
int tensor as an int, and cannot tell them from the real values); every other check runs
inside the op, on the real tensors, through the same code as the eager functions, so errors
read the same whether compiled or not. An int or float option that torch.compile traces as a
symbol (``dynamic=True``, or a value that changed between calls, as a server's ``max_q_len``
does) is checked by the op on its real value; so is every int or float option's range
under torch.compile (Dynamo traces a symbol as an int or float, so the functions cannot tell
it from a constant, and cannot format a message from it), so such a refusal is the eager
ValueError, raised by the compiled call (an int past int64 or float64 is refused while
tracing). A refusal of the functions' own checks (types, a negated view)
is raised while Dynamo traces: without ``fullgraph`` torch then runs the call eagerly and
the ValueError / TypeError is raised as such; with ``fullgraph=True`` torch reports it as
its own ``torch._dynamo.exc.Unsupported`` ("Observed exception"), whose text holds splitkv's
message. A negated view (``x.is_neg()``) passed to the raw ops reaches their kernel for
torch's Negative dispatch key, which refuses it before anything runs (torch's fallback would
copy it, and inductor drops the bit of a graph input: the op would read -x). The fake (meta)
implementations declare that nothing new is returned, and refuse tensors on different
devices: torch sends a call with one meta tensor among real ones to them, where it would
otherwise do nothing.

CUDA graphs: a call enqueues one kernel on the current stream with no host sync or memset,
so ``torch.cuda.graph`` captures it, eagerly or compiled (new ``out`` and ``lse`` tensors
come from the graph's memory pool; pass ``out=`` to write a buffer of your own). Pass
``max_q_len`` there whenever ``cu_seqlens_q`` is given: computing it reads the index tensor
on the host, which capture forbids. ``torch.compile(mode="reduce-overhead")`` gives correct
results, but inductor does not turn a graph that mutates an input (the workspace) into a
CUDA graph of its own (seen with torch 2.11): capture with ``torch.cuda.graph`` instead.
"""

import inspect
from typing import Optional

import torch

from splitkv import _calls
from splitkv import _checks
from splitkv import _splitkv

_PAGED = _calls.PAGED
_RAGGED = _calls.RAGGED
_MUTATED = ("workspace", "out", "lse")


def _lse(op, lse, q):
    """The lse buffer a caller of the raw op passes: [total_q, num_qo_heads] float32."""
    _checks.tensor(op, "lse", lse)
    _checks.device(op, "lse", lse, q.device)
    if lse.dtype != torch.float32:
        _checks.fail(op, "lse", "dtype unsupported", "torch.float32", lse.dtype, error=TypeError)
    if tuple(lse.shape) != tuple(q.shape[:2]):
        _checks.fail(op, "lse", "shape mismatch",
                     f"{tuple(q.shape[:2])} ([total_q, num_qo_heads] of q)", tuple(lse.shape))
    _checks.contiguous(op, "lse", lse)
    _checks.writable_out(op, lse, "lse")


def _launch(op, launcher, params, q, lse, workspace, operands):
    """Launches a validated call; `operands`: the call's other (name, tensor or None) pairs,
    which a caller's lse must not share a byte with (the kernels write lse while reading
    them, and out's rows are written beside it)."""
    if lse is not None:
        _lse(op, lse, q)
        _checks.disjoint(op, "lse", lse, operands, "tensor", "pass an lse buffer of its own")
        _checks.workspace_disjoint(op, _checks.workspace_tensor(op, workspace), [("lse", lse)])
        params.lse = lse.data_ptr()
    _calls.run(op, launcher, params, q, workspace)


def _either(op, name, value, tensor):
    """The op's (float, tensor) pair of a scale as one argument; both given is refused."""
    if value is not None and tensor is not None:
        _checks.fail(op, name, "given twice", f"either the float {name} or the tensor {name}s",
                     f"{name}={value!r} and a {name}s tensor")
    return tensor if tensor is not None else value


def _scale_args(op, name, scale, kv):
    """A k_scale / v_scale as the op's (float, tensor) pair, one of them None. Any scale with
    a cache that is not fp8 (`kv`: k_cache, or k) is refused first, with the eager functions'
    message (before real() would refuse or convert its type)."""
    if scale is None:
        return None, None
    if kv.dtype != torch.float8_e4m3fn:
        _checks.kv_scale(op, name, scale, False, kv.dtype, None, None)
    if isinstance(scale, torch.Tensor):
        _checks.not_negated(op, name, scale)
        return None, scale
    return _checks.real(op, name, scale), None


def _paged_impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor],
              block_tables: torch.Tensor, seq_lens: torch.Tensor, workspace: torch.Tensor,
              out: torch.Tensor, lse: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
              kv_layout: str, sm_scale: Optional[float], causal: bool, window_left: int,
              logits_soft_cap: float, num_splits: Optional[int],
              max_q_len: Optional[int], batch_invariant: bool = False,
              sinks: Optional[torch.Tensor] = None,
              k_scale: Optional[float] = None, k_scales: Optional[torch.Tensor] = None,
              v_scale: Optional[float] = None, v_scales: Optional[torch.Tensor] = None,
              kv_offsets: Optional[torch.Tensor] = None,
              full_seq_lens: Optional[torch.Tensor] = None) -> None:
    _checks.tensor(_PAGED, "out", out)  # the schema lets None through; the op owns no out
    kv_cache = k_cache if v_cache is None else (k_cache, v_cache)
    params, _, _ = _calls.paged_params(
        _PAGED, q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
        sm_scale, causal, window_left, logits_soft_cap, num_splits, False, out, max_q_len,
        launch=True, batch_invariant=batch_invariant, sinks=sinks,
        k_scale=_either(_PAGED, "k_scale", k_scale, k_scales),
        v_scale=_either(_PAGED, "v_scale", v_scale, v_scales), kv_offsets=kv_offsets,
        full_seq_lens=full_seq_lens)
    _launch(_PAGED, _splitkv.LaunchPagedAttention, params, q, lse, workspace, [
        ("out", out), ("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
        ("block_tables", block_tables), ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q),
        ("sinks", sinks), ("k_scales", k_scales), ("v_scales", v_scales),
        ("kv_offsets", kv_offsets), ("full_seq_lens", full_seq_lens)])


def _fake(op, signature):
    """The op's fake implementation: returns nothing, after refusing a tensor on another
    device than q's. Under torch.compile every tensor is a fake one on its real device, so
    this passes; in eager mode torch routes a call here when one argument is a meta tensor
    and the rest are real, which would otherwise silently leave out unwritten."""
    def fake(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        q = arguments["q"]
        for name, x in arguments.items():
            if isinstance(x, torch.Tensor):
                _checks.device(op, name, x, q.device)
    return fake


_paged_op = torch.library.custom_op("splitkv::paged_attention",
                                    mutates_args=_MUTATED)(_paged_impl)
_paged_op.register_fake(_fake(_PAGED, inspect.signature(_paged_impl)))


def _ragged_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_kv: torch.Tensor, workspace: torch.Tensor, out: torch.Tensor,
               lse: Optional[torch.Tensor], causal: bool, sm_scale: Optional[float],
               window_left: int, logits_soft_cap: float, num_splits: Optional[int],
               max_q_len: Optional[int], batch_invariant: bool = False,
               sinks: Optional[torch.Tensor] = None,
               k_scale: Optional[float] = None, k_scales: Optional[torch.Tensor] = None,
               v_scale: Optional[float] = None, v_scales: Optional[torch.Tensor] = None) -> None:
    _checks.tensor(_RAGGED, "out", out)  # the schema lets None through; the op owns no out
    params, _, _ = _calls.ragged_params(
        _RAGGED, q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale, window_left,
        logits_soft_cap, num_splits, False, out, max_q_len, launch=True,
        batch_invariant=batch_invariant, sinks=sinks,
        k_scale=_either(_RAGGED, "k_scale", k_scale, k_scales),
        v_scale=_either(_RAGGED, "v_scale", v_scale, v_scales))
    _launch(_RAGGED, _splitkv.LaunchRaggedAttention, params, q, lse, workspace, [
        ("out", out), ("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_kv", cu_seqlens_kv), ("sinks", sinks), ("k_scales", k_scales),
        ("v_scales", v_scales)])


_ragged_op = torch.library.custom_op("splitkv::ragged_attention",
                                     mutates_args=_MUTATED)(_ragged_impl)
_ragged_op.register_fake(_fake(_RAGGED, inspect.signature(_ragged_impl)))


def _refuse_negated(op, signature):
    """The ops' kernel for torch's Negative dispatch key, which a call reaches when any tensor
    argument is a negated view (``x.is_neg()``). Without it torch's fallback hands the op a
    resolved copy of an input (accepted where the functions refuse) and, for out or lse, writes
    them and then fails with "Expected Tensor but got None" (the ops return nothing). Refuses
    the call before anything runs, with the functions' message; under torch.compile it runs on
    the fake tensors, which keep the bit."""
    def kernel(*args, **kwargs):
        for name, x in signature.bind(*args, **kwargs).arguments.items():
            if isinstance(x, torch.Tensor):
                _checks.not_negated(op, name, x)
        raise AssertionError(f"{op}: reached the Negative kernel without a negated tensor")
    return kernel


_NEGATIVE = torch.library.Library("splitkv", "IMPL")  # kept: its registrations live with it
_NEGATIVE.impl("paged_attention", _refuse_negated(_PAGED, inspect.signature(_paged_impl)),
               "Negative")
_NEGATIVE.impl("ragged_attention", _refuse_negated(_RAGGED, inspect.signature(_ragged_impl)),
               "Negative")


# ---- the functions: eager-compatible signatures over the ops ----


def _optional_tensor(op, name, x):
    return None if x is None else _checks.tensor(op, name, x)


def _scalars(op, causal, sm_scale, window_left, logits_soft_cap, num_splits, max_q_len,
             min_q_len):
    """The scalar arguments as the op schema's types (bool, float, int), checked with the
    eager functions' messages (the op checks them again, with the rest)."""
    causal = _checks.flag(op, "causal", causal)
    if sm_scale is not None:
        sm_scale = _checks.real(op, "sm_scale", sm_scale)
    window_left = _checks.integer(op, "window_left", window_left, -1,
                                  "-1 (no window) or an int >= 0")
    logits_soft_cap = _checks.real(op, "logits_soft_cap", logits_soft_cap)
    if num_splits is not None:
        num_splits = _checks.integer(op, "num_splits", num_splits, 1,
                                     "None (the planner chooses) or an int >= 1")
    if max_q_len is not None:
        max_q_len = _checks.integer(op, "max_q_len", max_q_len, min_q_len,
                                    f"an int >= {min_q_len}")
    return causal, sm_scale, window_left, logits_soft_cap, num_splits, max_q_len


def _on_q_device(op, q, named_tensors):
    """Refuses, before dispatch, a q that is on neither a CPU nor a CUDA device and a tensor
    on another device than q's, with the eager functions' messages: torch would send a call
    with a meta tensor among its arguments to the op's fake implementation, which checks and
    computes nothing."""
    _checks.backend(op, q.device)
    for name, x in named_tensors:
        if x is not None:
            _checks.device(op, name, x, q.device)


def _buffers(op, q, out, return_lse):
    """out (the caller's or new) and lse (new, or None)."""
    return_lse = _checks.flag(op, "return_lse", return_lse)
    _optional_tensor(op, "out", out)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = None
    if return_lse:
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    return out, lse


def paged_attention(q, kv_cache, block_tables, seq_lens, workspace, *, cu_seqlens_q=None,
                    kv_layout="HND", sm_scale=None, causal=True, window_left=-1,
                    logits_soft_cap=0.0, num_splits=None, return_lse=False, out=None,
                    max_q_len=None, batch_invariant=False, sinks=None, k_scale=None,
                    v_scale=None, kv_offsets=None, full_seq_lens=None):
    """:func:`splitkv.paged_attention` through the custom op ``splitkv::paged_attention``.

    Same parameters, results and errors as :func:`splitkv.paged_attention`; usable inside
    ``torch.compile(fullgraph=True)`` and CUDA graph capture (pass ``max_q_len`` with
    ``cu_seqlens_q`` there).

    Example
    -------
    >>> @torch.compile(fullgraph=True)
    ... def decode(q, kv_cache, block_tables, seq_lens, workspace):
    ...     return splitkv.ops.paged_attention(q, kv_cache, block_tables, seq_lens, workspace)
    """
    op = _PAGED
    _checks.tensor(op, "q", q)
    if isinstance(kv_cache, (tuple, list)) and len(kv_cache) == 2:
        k_cache = _checks.tensor(op, "kv_cache[0]", kv_cache[0])
        v_cache = _checks.tensor(op, "kv_cache[1]", kv_cache[1])
    elif isinstance(kv_cache, (tuple, list)):
        _checks.fail(op, "kv_cache", "has the wrong length", "a (k, v) pair of tensors",
                     f"{len(kv_cache)} items")
    else:
        k_cache, v_cache = _checks.tensor(op, "kv_cache", kv_cache), None
    _checks.tensor(op, "block_tables", block_tables)
    _checks.tensor(op, "seq_lens", seq_lens)
    _optional_tensor(op, "cu_seqlens_q", cu_seqlens_q)
    _calls._kv_layout_shape(op, kv_layout)  # a non-str is a TypeError, as eagerly
    buffer = _checks.workspace_tensor(op, workspace)
    causal, sm_scale, window_left, logits_soft_cap, num_splits, max_q_len = _scalars(
        op, causal, sm_scale, window_left, logits_soft_cap, num_splits, max_q_len, 1)
    sinks = _optional_tensor(op, "sinks", sinks)
    kv_offsets = _optional_tensor(op, "kv_offsets", kv_offsets)
    full_seq_lens = _optional_tensor(op, "full_seq_lens", full_seq_lens)
    _optional_tensor(op, "out", out)  # before _on_q_device reads out.device
    _on_q_device(op, q, [("kv_cache", k_cache), ("kv_cache", v_cache), ("block_tables", block_tables),
                         ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q), ("workspace", buffer),
                         ("out", out), ("sinks", sinks), ("kv_offsets", kv_offsets),
                         ("full_seq_lens", full_seq_lens)] + _calls._scales(k_scale, v_scale))
    out, lse = _buffers(op, q, out, return_lse)
    torch.ops.splitkv.paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, buffer, out, lse, cu_seqlens_q, kv_layout,
        sm_scale, causal, window_left, logits_soft_cap, num_splits, max_q_len,
        _checks.flag(op, "batch_invariant", batch_invariant), sinks,
        *_scale_args(op, "k_scale", k_scale, k_cache),
        *_scale_args(op, "v_scale", v_scale, k_cache), kv_offsets, full_seq_lens)
    return (out, lse) if return_lse else out


def ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, *, causal=True,
                     sm_scale=None, window_left=-1, logits_soft_cap=0.0, num_splits=None,
                     return_lse=False, out=None, max_q_len=None, batch_invariant=False,
                     sinks=None, k_scale=None, v_scale=None):
    """:func:`splitkv.ragged_attention` through the custom op ``splitkv::ragged_attention``.

    Same parameters, results and errors as :func:`splitkv.ragged_attention`; usable inside
    ``torch.compile(fullgraph=True)`` and CUDA graph capture (pass ``max_q_len`` there).

    Example
    -------
    >>> @torch.compile(fullgraph=True)
    ... def prefill(q, k, v, cu_seqlens, workspace):
    ...     return splitkv.ops.ragged_attention(q, k, v, cu_seqlens, cu_seqlens, workspace)
    """
    op = _RAGGED
    for name, x in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_kv", cu_seqlens_kv)):
        _checks.tensor(op, name, x)
    buffer = _checks.workspace_tensor(op, workspace)
    causal, sm_scale, window_left, logits_soft_cap, num_splits, max_q_len = _scalars(
        op, causal, sm_scale, window_left, logits_soft_cap, num_splits, max_q_len, 0)
    sinks = _optional_tensor(op, "sinks", sinks)
    _optional_tensor(op, "out", out)  # before _on_q_device reads out.device
    _on_q_device(op, q, [("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                         ("cu_seqlens_kv", cu_seqlens_kv), ("workspace", buffer), ("out", out),
                         ("sinks", sinks)] + _calls._scales(k_scale, v_scale))
    out, lse = _buffers(op, q, out, return_lse)
    torch.ops.splitkv.ragged_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_kv, buffer, out, lse, causal, sm_scale, window_left,
        logits_soft_cap, num_splits, max_q_len, _checks.flag(op, "batch_invariant", batch_invariant),
        sinks, *_scale_args(op, "k_scale", k_scale, k),
        *_scale_args(op, "v_scale", v_scale, k))
    return (out, lse) if return_lse else out
