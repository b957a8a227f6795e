"""Plan once, run per layer: paged and ragged attention with a step's fixed arguments bound.

A serving step calls attention once per layer with the same index tensors, workspace and
options, and a new q (and the layer's cache) each time. A runner holds what stays fixed, so
a :meth:`run` hashes only the tensors that change (q, the cache or k / v, out, sinks and
scales) instead of every argument, then supplies addresses to the C++ template the first
run of that layout validated (splitkv._calls: the per-call path).

Every check :func:`splitkv.paged_attention` makes still happens: options at construction,
the rest at the first run of each layout (the same full path, the same messages), and on
every run what depends on addresses (overlaps, index values on the CPU, the counter
region). Runs give bitwise the results of the one-shot functions with the same arguments.
"""

import torch
import torch.utils.weak

from splitkv import _calls
from splitkv import _checks
from splitkv import ops

# Layouts one runner remembers (q shapes x caches x out kinds): a runner lives for a step.
_MAX_RUNNER_LAYOUTS = 64


def _fixed_layout(tensors):
    """The signatures of the bound tensors present (a runner's `_present`): a run compares
    them with those its cached layout was validated with, so a tensor changed in place
    (resize_, as_strided_, set_; and torch.utils.swap_tensors or ``x.data = y``, which can
    change its dtype, device, class or neg bit too) takes the full path again."""
    return [_calls.value_signature(x) for x in tensors]


def _still_valid(entry, workspace, present, read):
    """(layout, workspace view) of a kept entry whose workspace and bound tensors are as they
    were when it was kept; None sends the run to the full path (which also says what is
    wrong with a Workspace whose tensor is no longer a tensor). A key read in C++ (`read`
    not None) holds the bound tensors' layouts already: only the workspace is compared."""
    layout, fixed_layout, workspace_signature = entry
    try:
        view = _calls.workspace_view(workspace)
    except Exception:  # noqa: BLE001
        return None
    if view[1] != workspace_signature or (read is None and _fixed_layout(present) != fixed_layout):
        return None
    return layout, view


# The workspace's place in both runners' _fixed.
_WORKSPACE = 2


class _NewBuffer:
    """A runner's workspace given as a user's uint8 tensor, in a deepcopy or pickle: made
    again as a new zeroed buffer of its shape and device, aligned as splitkv.Workspace aligns
    its own. Copied as a tensor, it landed where torch's allocator put it (64-byte aligned: the
    copy's first run was refused as misaligned, more often than not), and torch.multiprocessing
    moved the original's storage into shared memory (the sending runner refused from then on).
    The device goes as an empty tensor (workspace.device_token), so that torch.load's
    map_location moves it with the runner's other tensors."""

    __slots__ = ("nbytes", "device", "shape", "made")

    def __init__(self, nbytes, device, shape=None):
        # shape None: a pickle made before shapes were kept (a 1-D buffer).
        self.nbytes, self.device, self.shape = nbytes, device, shape
        self.made = None

    def __reduce__(self):
        from splitkv.workspace import device_token
        return (_NewBuffer, (self.nbytes, device_token(self.device), self.shape))

    def make(self):
        """The new buffer, made once: runners whose states hold this one object (a copy's
        runners that shared a buffer) share it."""
        if self.made is None:
            from splitkv.workspace import Workspace, token_device
            buffer = Workspace(self.nbytes, token_device(self.device)).tensor
            self.made = buffer if self.shape is None else buffer.view(self.shape)
        return self.made


# Per user workspace tensor, the _NewBuffer that stands for it in its runners' states: one
# object, so that runners bound to one buffer (one per layer group, say) share one new buffer
# after a deepcopy or pickle of them together (deepcopy's and pickle's memo make one object
# once), as runners bound to one Workspace do. A _NewBuffer each made as many new buffers as
# runners. Weak: the entry goes with the tensor; a tensor resized since gets another.
_new_buffers = torch.utils.weak.WeakIdKeyDictionary()


def _new_buffer(workspace):
    made = _new_buffers.get(workspace)
    shape, device = tuple(workspace.shape), str(workspace.device)
    if made is None or (made.shape, made.device) != (shape, device):
        made = _new_buffers[workspace] = _NewBuffer(workspace.numel(), device, shape)
    return made


def _getstate(runner):
    """A runner's state for deepcopy and pickle: its bound arguments, not its cached layouts
    (C++ templates, which cannot be pickled; a copy validates again at its first run). The
    workspace goes as a Workspace does: a new zeroed one; a user's tensor that the calls take
    as a workspace (_checks.workspace_tensor: uint8 and contiguous, of any rank) as a new zeroed
    aligned one of the same shape and device (_NewBuffer). A tensor that is no workspace (too
    small, another dtype, not contiguous, a device splitkv does not run on) stays, for the run
    to refuse with its message."""
    fixed = runner._fixed
    workspace = fixed[_WORKSPACE]
    if isinstance(workspace, torch.Tensor) and workspace.device.type in _checks.BACKENDS:
        from splitkv.workspace import COUNTER_REGION_BYTES
        try:
            _checks.workspace_tensor("copy", workspace)  # the calls' own rule, not a copy of it
            accepted = workspace.numel() >= COUNTER_REGION_BYTES
        except Exception:  # noqa: BLE001 - the run refuses it, with its message
            accepted = False
        if accepted:
            fixed = fixed[:_WORKSPACE] + (_new_buffer(workspace),) + fixed[_WORKSPACE + 1:]
    return fixed, runner._present, runner._options


def _setstate(runner, state):
    fixed, runner._present, runner._options = state
    if isinstance(fixed[_WORKSPACE], _NewBuffer):
        fixed = fixed[:_WORKSPACE] + (fixed[_WORKSPACE].make(),) + fixed[_WORKSPACE + 1:]
    runner._fixed = fixed
    runner._layouts = {}


def _copy(runner):
    """copy.copy: the same bound arguments (the same workspace too), no cached layouts."""
    made = runner.__class__.__new__(runner.__class__)
    _setstate(made, (runner._fixed, runner._present, runner._options))
    return made


def _keep(layouts, key, layout, present, workspace):
    """Remembers a layout the full path just validated (None: not cacheable, or the global
    cache was just emptied; the next run takes the full path again)."""
    if layout is None:
        return
    if len(layouts) >= _MAX_RUNNER_LAYOUTS:
        layouts.clear()
    layouts[key] = (layout, _fixed_layout(present), _calls.workspace_view(workspace)[1])


class PagedAttentionRunner:
    """:func:`splitkv.paged_attention` with the workspace, the step's index tensors and the
    options bound: ``run(q, kv_cache)`` once per layer.

    Takes :func:`splitkv.paged_attention`'s arguments except those :meth:`run` takes (q,
    kv_cache, out, sinks, k_scale, v_scale), with the same meanings and defaults, the
    workspace first (``paged_attention`` takes it after ``seq_lens``). Make one per serving
    step and run it for every layer of the step. The
    runner keeps references to the tensors; their values (page ids, lengths) may change
    between runs (each run's kernels read them), their shapes, strides and storage too (a
    run that sees a change validates again). ``copy``, ``deepcopy`` and ``pickle`` keep the
    bound arguments (a deep copy's workspace is a new zeroed one, as for
    :class:`splitkv.Workspace`; a user's uint8 workspace tensor, of any rank, comes back as a
    new zeroed ``WORKSPACE_ALIGNMENT``-aligned tensor of its shape and device, one for all
    the runners bound to it that are copied together) and validate again at their first run.

    Raises
    ------
    TypeError, ValueError
        At construction, what :func:`splitkv.paged_attention` checks without q, the cache
        or out, in its order and with its message: kv_layout, the index tensors (dtype,
        rank, contiguity, batch sizes that agree, kv_offsets and full_seq_lens both or
        neither), max_q_len, the options and their ranges. Everything else (devices, shapes
        against q, the workspace) is checked by the first :meth:`run` of each layout.

    Example
    -------
    >>> runner = splitkv.PagedAttentionRunner(workspace, block_tables, seq_lens)
    >>> for layer in range(num_layers):
    ...     out = runner.run(q[layer], kv_caches[layer])
    """

    __slots__ = ("_fixed", "_present", "_options", "_layouts")

    def __init__(self, workspace, block_tables, seq_lens, *, cu_seqlens_q=None, kv_layout="HND",
                 sm_scale=None, causal=True, window_left=-1, logits_soft_cap=0.0,
                 num_splits=None, return_lse=False, max_q_len=None, batch_invariant=False,
                 kv_offsets=None, full_seq_lens=None):
        _calls.check_paged_binding(block_tables, seq_lens, cu_seqlens_q, kv_offsets,
                                   full_seq_lens, kv_layout, max_q_len, causal, sm_scale,
                                   window_left, logits_soft_cap, num_splits, batch_invariant,
                                   return_lse)
        self._fixed = (block_tables, seq_lens, workspace, cu_seqlens_q, kv_offsets, full_seq_lens)
        self._present = [x for x in (block_tables, seq_lens, cu_seqlens_q, kv_offsets,
                                     full_seq_lens) if x is not None]
        self._options = (kv_layout, sm_scale, causal, window_left, logits_soft_cap, num_splits,
                         return_lse, max_q_len, batch_invariant)
        self._layouts = {}

    __getstate__ = _getstate
    __setstate__ = _setstate
    __copy__ = _copy

    def run(self, q, kv_cache, *, out=None, sinks=None, k_scale=None, v_scale=None):
        """:func:`splitkv.paged_attention` of ``q`` over ``kv_cache`` with the bound
        arguments; same shapes, dtypes, results, errors and return value (``out``, or
        ``(out, lse)`` with ``return_lse``)."""
        block_tables, seq_lens, workspace, cu_seqlens_q, kv_offsets, full_seq_lens = self._fixed
        (kv_layout, sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse,
         max_q_len, batch_invariant) = self._options
        if _checks.traced(q):
            return ops.paged_attention(
                q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q=cu_seqlens_q,
                kv_layout=kv_layout, sm_scale=sm_scale, causal=causal, window_left=window_left,
                logits_soft_cap=logits_soft_cap, num_splits=num_splits, return_lse=return_lse,
                out=out, max_q_len=max_q_len, batch_invariant=batch_invariant, sinks=sinks,
                k_scale=k_scale, v_scale=v_scale, kv_offsets=kv_offsets,
                full_seq_lens=full_seq_lens)
        try:
            # A key read in C++ (_calls.paged_read_key) holds the bound tensors' layouts too;
            # the Python one only the run's own tensors (_still_valid compares the bound).
            key, read = _calls.paged_read_key(q, kv_cache, block_tables, seq_lens, None,
                                              cu_seqlens_q, out, (), sinks, k_scale, v_scale,
                                              kv_offsets, full_seq_lens) or (None, None)
            if key is None:
                key = (q.__class__, q.shape, q.stride(), q.dtype, q.device, q.is_neg(),
                       _calls.kv_cache_key(kv_cache), _calls.out_key(out),
                       _calls.extras(sinks, k_scale, v_scale))
            entry = self._layouts.get(key)
        except Exception:  # noqa: BLE001 - the full path says what is wrong
            key = entry = read = None
        try:
            hit = None if entry is None else _still_valid(entry, workspace, self._present, read)
            if hit is not None:
                ran = (_calls.launch_read(*hit, read, q, workspace, return_lse, out,
                                          cu_seqlens_q, True) if read is not None else
                       _calls.launch_paged_layout(*hit, q, kv_cache, block_tables, seq_lens,
                                                  workspace, cu_seqlens_q, return_lse, out, sinks,
                                                  k_scale, v_scale, kv_offsets, full_seq_lens))
                if ran is not None:
                    return ran if return_lse else ran[0]
            args = (q, kv_cache, block_tables, seq_lens, workspace, cu_seqlens_q, kv_layout,
                    sm_scale, causal, window_left, logits_soft_cap, num_splits, return_lse, out,
                    max_q_len, batch_invariant, sinks, k_scale, v_scale, kv_offsets,
                    full_seq_lens)
            result, lse = _calls.paged_call(_calls.PAGED, *args)
        except RuntimeError:  # torch's, from a tensor without storage: name a torch.func one
            _checks.not_transformed(_calls.PAGED, q=q, kv_cache=kv_cache, out=out, sinks=sinks)
            raise
        if key is not None:
            _keep(self._layouts, key, _calls.paged_layout(*args), self._present, workspace)
        return (result, lse) if return_lse else result


class RaggedAttentionRunner:
    """:func:`splitkv.ragged_attention` with the workspace, ``cu_seqlens_q`` /
    ``cu_seqlens_kv`` and the options bound: ``run(q, k, v)`` once per layer.

    Takes :func:`splitkv.ragged_attention`'s arguments except those :meth:`run` takes (q,
    k, v, out, sinks, k_scale, v_scale); the bound tensors, and copies, as in
    :class:`PagedAttentionRunner`.

    Raises
    ------
    TypeError, ValueError
        As :class:`PagedAttentionRunner`.

    Example
    -------
    >>> runner = splitkv.RaggedAttentionRunner(workspace, cu_seqlens, cu_seqlens,
    ...                                        max_q_len=max_len)
    >>> out = runner.run(q, k, v)
    """

    __slots__ = ("_fixed", "_present", "_options", "_layouts")

    def __init__(self, workspace, cu_seqlens_q, cu_seqlens_kv, *, causal=True, sm_scale=None,
                 window_left=-1, logits_soft_cap=0.0, num_splits=None, return_lse=False,
                 max_q_len=None, batch_invariant=False):
        _calls.check_ragged_binding(cu_seqlens_q, cu_seqlens_kv, max_q_len, causal, sm_scale,
                                    window_left, logits_soft_cap, num_splits, batch_invariant,
                                    return_lse)
        self._fixed = (cu_seqlens_q, cu_seqlens_kv, workspace)
        self._present = [x for x in (cu_seqlens_q, cu_seqlens_kv) if x is not None]
        self._options = (causal, sm_scale, window_left, logits_soft_cap, num_splits, return_lse,
                         max_q_len, batch_invariant)
        self._layouts = {}

    __getstate__ = _getstate
    __setstate__ = _setstate
    __copy__ = _copy

    def run(self, q, k, v, *, out=None, sinks=None, k_scale=None, v_scale=None):
        """:func:`splitkv.ragged_attention` of ``q``, ``k``, ``v`` with the bound
        arguments; same shapes, dtypes, results, errors and return value."""
        cu_seqlens_q, cu_seqlens_kv, workspace = self._fixed
        (causal, sm_scale, window_left, logits_soft_cap, num_splits, return_lse, max_q_len,
         batch_invariant) = self._options
        if _checks.traced(q):
            return ops.ragged_attention(
                q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal=causal,
                sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap,
                num_splits=num_splits, return_lse=return_lse, out=out, max_q_len=max_q_len,
                batch_invariant=batch_invariant, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
        try:
            key, read = _calls.ragged_read_key(q, k, v, cu_seqlens_q, cu_seqlens_kv, None, out,
                                               (), sinks, k_scale, v_scale) or (None, None)
            if key is None:  # as in PagedAttentionRunner.run
                key = (q.__class__, q.shape, q.stride(), q.dtype, q.device, q.is_neg(),
                       _calls.value_signature(k), _calls.value_signature(v), _calls.out_key(out),
                       _calls.extras(sinks, k_scale, v_scale))
            entry = self._layouts.get(key)
        except Exception:  # noqa: BLE001 - the full path says what is wrong
            key = entry = read = None
        try:
            hit = None if entry is None else _still_valid(entry, workspace, self._present, read)
            if hit is not None:
                ran = (_calls.launch_read(*hit, read, q, workspace, return_lse, out,
                                          cu_seqlens_q, False) if read is not None else
                       _calls.launch_ragged_layout(*hit, q, k, v, cu_seqlens_q, cu_seqlens_kv,
                                                   workspace, return_lse, out, sinks, k_scale,
                                                   v_scale))
                if ran is not None:
                    return ran if return_lse else ran[0]
            args = (q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, causal, sm_scale, window_left,
                    logits_soft_cap, num_splits, return_lse, out, max_q_len, batch_invariant, sinks,
                    k_scale, v_scale)
            result, lse = _calls.ragged_call(_calls.RAGGED, *args)
        except RuntimeError:  # torch's, from a tensor without storage: name a torch.func one
            _checks.not_transformed(_calls.RAGGED, q=q, k=k, v=v, out=out, sinks=sinks)
            raise
        if key is not None:
            _keep(self._layouts, key, _calls.ragged_layout(*args), self._present, workspace)
        return (result, lse) if return_lse else result
