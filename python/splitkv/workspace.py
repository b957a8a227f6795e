"""The caller-owned workspace: a uint8 buffer zeroed once, and the report of its layout.

Every byte offset comes from the C++ core (cc/splitkv/workspace_layout.h); this module
only allocates, aligns and reports.
"""

import contextlib
import copyreg
import dataclasses
import os

import torch

from splitkv import _checks
from splitkv import _docs
from splitkv import _splitkv

COUNTER_REGION_BYTES = _splitkv.kCounterRegionBytes
"""Bytes [0, COUNTER_REGION_BYTES) of every workspace hold the split counters (8 MiB)."""

WORKSPACE_ALIGNMENT = _splitkv.kWorkspaceAlignment
"""Required alignment of a workspace's base address and of each region, in bytes (256)."""

# SPLITKV_CHECK_WORKSPACE=1: every call checks the whole counter region before and after it
# runs (a host sync each time), for users chasing a fault. Read once, at import.
CHECK_EVERY_CALL = os.environ.get("SPLITKV_CHECK_WORKSPACE", "") == "1"

# Products of the layout are int64 in C++: refuse inputs whose scratch bytes would not fit.
_MAX_LAYOUT_BYTES = 2**62


@dataclasses.dataclass(frozen=True)
class WorkspaceLayout:
    """Byte ranges of the three workspace regions for one call (offsets from the base).

    Attributes
    ----------
    counter_offset, counter_bytes : int
        The counter region, always ``0`` and ``COUNTER_REGION_BYTES``: uint32 split
        counters, zero whenever no call is running.
    softmax_offset, softmax_bytes : int
        Softmax stats (float32 max and sum of exponentials) per (split, q token, qo head),
        the split index fastest; ``softmax_bytes`` is 0 with one split.
    scratch_offset, scratch_bytes : int
        float32 partial outputs per (split, q token, qo head, head_dim element), the split
        index fastest after head_dim; 0 bytes with one split.
    required_bytes : int
        Bytes the call needs: the end of the last region, rounded up to
        ``WORKSPACE_ALIGNMENT``.
    """

    counter_offset: int
    counter_bytes: int
    softmax_offset: int
    softmax_bytes: int
    scratch_offset: int
    scratch_bytes: int
    required_bytes: int

    @classmethod
    def _from_ext(cls, layout):
        return cls(**{field.name: getattr(layout, field.name) for field in dataclasses.fields(cls)})

    def regions(self):
        """The regions as ``{"counter" | "softmax" | "scratch": (begin, end)}``, end exclusive."""
        return {
            "counter": (self.counter_offset, self.counter_offset + self.counter_bytes),
            "softmax": (self.softmax_offset, self.softmax_offset + self.softmax_bytes),
            "scratch": (self.scratch_offset, self.scratch_offset + self.scratch_bytes),
        }


def workspace_layout(total_q, num_qo_heads, head_dim, num_splits):
    """The workspace layout of a call with ``num_splits`` splits.

    Parameters
    ----------
    total_q : int
        Query tokens in the call (sum of q_len over requests), >= 0.
    num_qo_heads : int
        Query/output heads, >= 1.
    head_dim : int
        Elements per head, >= 1.
    num_splits : int
        Splits of each request's KV, >= 1. One split needs only the counter region.

    Returns
    -------
    WorkspaceLayout
        Byte ranges of the counter, softmax and scratch regions.

    Raises
    ------
    TypeError
        An argument is not an int.
    ValueError
        An argument is out of range, or the sizes overflow 64-bit byte counts.

    Example
    -------
    >>> layout = splitkv.workspace_layout(total_q=8, num_qo_heads=32, head_dim=128, num_splits=4)
    >>> layout.regions()["counter"]
    (0, 8388608)
    """
    op = "workspace_layout"
    total_q = _checks.integer(op, "total_q", total_q, 0, ">= 0")
    num_qo_heads = _checks.integer(op, "num_qo_heads", num_qo_heads, 1, ">= 1")
    head_dim = _checks.integer(op, "head_dim", head_dim, 1, ">= 1")
    num_splits = _checks.integer(op, "num_splits", num_splits, 1, ">= 1")
    # The partials' bytes, exactly (Python ints), so that ComputeWorkspaceLayout's int64 sums
    # (these, the counter region and alignment) cannot overflow: the softmax stats count too,
    # which at head_dim 1 or 2 are as large as the scratch. One split: the counter region only.
    partials = num_splits * total_q * num_qo_heads if num_splits > 1 else 0
    split_bytes = partials * (_splitkv.kSoftmaxStatBytes + head_dim * _splitkv.kScratchElementBytes)
    if split_bytes >= _MAX_LAYOUT_BYTES:
        _checks.fail(op, "sizes", "too large", "softmax and scratch bytes below 2**62", split_bytes)
    shape = _splitkv.LayoutShape(total_q, num_qo_heads, head_dim)
    return WorkspaceLayout._from_ext(_splitkv.ComputeWorkspaceLayout(shape, num_splits))


def required_workspace_bytes(total_q, num_qo_heads, head_dim, num_splits):
    """Bytes of workspace a call with ``num_splits`` splits needs, counter region included.

    Parameters are those of :func:`workspace_layout`.

    Returns
    -------
    int
        ``COUNTER_REGION_BYTES`` for one split; more, growing with ``num_splits``, above.

    Raises
    ------
    TypeError, ValueError
        As :func:`workspace_layout`.

    Example
    -------
    >>> nbytes = splitkv.required_workspace_bytes(total_q=64, num_qo_heads=32, head_dim=128,
    ...                                           num_splits=8)
    >>> workspace = splitkv.Workspace(nbytes, "cpu")
    """
    return workspace_layout(total_q, num_qo_heads, head_dim, num_splits).required_bytes


def fp8_prefill_workspace_bytes(num_kv_heads, head_dim, *, total_kv=None, batch_size=None,
                                max_pages_per_seq=None, page_size=None):
    """Workspace bytes with which an fp8 prefill call runs the 16-bit prefill kernel.

    On a compute capability 9.0 GPU, a prefill call over fp8 (e4m3) K/V that the wgmma
    prefill would serve over 16-bit K/V (ragged, or paged with ``cu_seqlens_q`` and prefill
    tiles; one split, not ``batch_invariant``, aligned tensors: see ``k_scale`` in
    :func:`paged_attention` and :func:`ragged_attention`) first writes a 16-bit copy (q's
    dtype) of the K/V it reads into the workspace, past the counter region,
    then runs the wgmma kernel over the copy (the copy holds the stored values exactly; the
    kernel applies ``k_scale`` and ``v_scale``). A workspace shorter than this runs the call
    on the fp8 kernel instead: same results within tolerance, several times slower. A call
    the planner splits (a short chunk over long KV at a small batch: pass ``num_splits=1``
    to keep it whole) and other calls make no copy. Give ``total_kv`` (ragged calls), or ``batch_size``,
    ``max_pages_per_seq`` (the columns of ``block_tables``) and ``page_size`` (paged calls:
    the copy has room for every page of every row of ``block_tables``, since the host does not
    read ``seq_lens``).

    Parameters
    ----------
    num_kv_heads, head_dim : int
        The call's K/V heads and elements per head, >= 1.
    total_kv : int, optional
        Rows of the ragged call's ``k`` and ``v``, >= 0.
    batch_size, max_pages_per_seq, page_size : int, optional
        The paged call's requests (>= 0), ``block_tables`` columns (>= 1) and slots per page
        (>= 1).

    Returns
    -------
    int
        Bytes, counter region included, a multiple of ``WORKSPACE_ALIGNMENT``.

    Raises
    ------
    TypeError
        An argument is not an int.
    ValueError
        An argument is out of range, both forms or neither are given, or the size overflows
        64-bit byte counts.

    Example
    -------
    >>> nbytes = splitkv.fp8_prefill_workspace_bytes(8, 128, total_kv=16384)
    >>> nbytes - splitkv.COUNTER_REGION_BYTES  # K and V, 2 bytes an element
    67108864
    >>> splitkv.fp8_prefill_workspace_bytes(8, 128, batch_size=4, max_pages_per_seq=256,
    ...                                     page_size=16) - splitkv.COUNTER_REGION_BYTES
    67112960
    >>> # block_tables as wide as a 128k context at batch 64: a 32 GiB copy (too large to use)
    >>> splitkv.fp8_prefill_workspace_bytes(8, 128, batch_size=64, max_pages_per_seq=8192,
    ...                                     page_size=16) >> 30
    32
    """
    op = "fp8_prefill_workspace_bytes"
    num_kv_heads = _checks.integer(op, "num_kv_heads", num_kv_heads, 1, ">= 1")
    head_dim = _checks.integer(op, "head_dim", head_dim, 1, ">= 1")
    paged = (batch_size, max_pages_per_seq, page_size)
    if (total_kv is None) == all(x is None for x in paged) or (total_kv is None and None in paged):
        _checks.fail(op, "arguments", "not one form", "total_kv alone, or batch_size, max_pages_per_seq "
                     "and page_size together",
                     dict(total_kv=total_kv, batch_size=batch_size, max_pages_per_seq=max_pages_per_seq,
                          page_size=page_size))
    if total_kv is not None:
        rows = _checks.integer(op, "total_kv", total_kv, 0, ">= 0")
        table_entries = 0
    else:
        pages = (_checks.integer(op, "batch_size", batch_size, 0, ">= 0") *
                 _checks.integer(op, "max_pages_per_seq", max_pages_per_seq, 1, ">= 1"))
        rows = pages * _checks.integer(op, "page_size", page_size, 1, ">= 1")
        table_entries = pages
    row_bytes = num_kv_heads * head_dim * 2
    copy_bytes = 2 * rows * row_bytes + 4 * table_entries  # K, V and the paged copy's table
    if copy_bytes >= _MAX_LAYOUT_BYTES:
        _checks.fail(op, "sizes", "too large", "bytes below 2**62", copy_bytes)
    return _splitkv.ComputeStagedKvLayout(rows, row_bytes, table_entries).required_bytes


def c_workspace(workspace, buffer):
    """The C++ view (``_splitkv.WorkspaceBuffer``) of ``workspace`` (a Workspace or a user's
    tensor) whose bytes are ``buffer``: the one place that builds it."""
    result = _splitkv.WorkspaceBuffer()
    result.data = buffer.data_ptr()
    result.bytes = buffer.numel()
    result.status_host = status_host_address(workspace, buffer)
    return result


def tensor_signature(x):
    """What a call's validation of tensor ``x`` depends on, besides its address: class,
    shape, strides, dtype, device (raises AttributeError for what is not a tensor)."""
    return (x.__class__, x.shape, x.stride(), x.dtype, x.device)


_MAX_WORKSPACE_BYTES = 2**63 - WORKSPACE_ALIGNMENT


def checked_nbytes(op, name, nbytes):
    """A workspace size as an int in [COUNTER_REGION_BYTES, 2**63 - WORKSPACE_ALIGNMENT]
    (anything with __index__ but a bool, a tensor or an array), or TypeError / ValueError
    naming ``name``: the Workspace's check, and that of whoever sizes one for later."""
    # As the options refuse them (_checks.integer): a tensor or array has __index__ too, which
    # reads a 0-d int one silently (torch.tensor(True) as 1) and raises torch's or numpy's
    # own TypeError, naming no argument, for a float or multi-element one.
    if _checks._not_a_number(nbytes) or not hasattr(nbytes, "__index__"):
        _checks.fail(op, name, "has the wrong type", "an int", _checks._type_text(nbytes),
                     error=TypeError)
    nbytes = nbytes.__index__()
    if nbytes < COUNTER_REGION_BYTES:
        _checks.fail(op, name, "too small", f">= {COUNTER_REGION_BYTES} (the counter region)", nbytes)
    # The allocation adds WORKSPACE_ALIGNMENT - 1 bytes and torch sizes are int64: past
    # this, torch's own error (an overflow with its C++ backtrace) would name no argument.
    if nbytes > _MAX_WORKSPACE_BYTES:
        _checks.fail(op, name, "too large", f"<= {_MAX_WORKSPACE_BYTES} (2**63 - "
                     f"{WORKSPACE_ALIGNMENT}: torch sizes are int64)", nbytes)
    return nbytes


class Workspace:
    """A workspace buffer for splitkv's operations, zeroed once when made.

    One workspace serves any number of paged and ragged calls on its device, one call
    at a time: every call leaves the counter region zero, so it is never zeroed again.
    Use one workspace per CUDA stream (or per thread on the CPU); a call that finds this
    workspace's memory in use by another thread's call raises ValueError (a user's own
    uint8 tensor is tracked the same way). On CUDA, launches on one workspace from
    different streams are serialized on the GPU: each waits (an event, no host sync) for
    the previous launch on that memory. Inside CUDA graph capture this ordering is the
    caller's: capture one workspace per stream. ``copy.copy``, ``copy.deepcopy`` and
    ``pickle`` (sending a workspace to another process too) make a new zeroed workspace of
    the same size and device: the bytes are scratch and are not copied (a subclass keeps its
    class and attributes, ``__slots__`` too; one that is a view of ``tensor`` becomes the same
    view of the new buffer). ``torch.load`` of a
    saved one does too, on the device its ``map_location`` maps the saved device to, as for a
    tensor (``map_location="cpu"`` loads one saved on CUDA on a CPU-only machine); it needs
    ``weights_only=False``, as any object that is not tensors and containers does.

    Parameters
    ----------
    nbytes : int
        Size in bytes, >= ``COUNTER_REGION_BYTES`` (8 MiB). A call whose planned splits do
        not fit uses fewer (see :func:`required_workspace_bytes`).
    device : torch.device, str or int, default "cpu"
        Where the buffer lives: the device of the tensors it will serve. An int N is
        CUDA device N (``"cuda:N"``).

    Attributes
    ----------
    tensor : torch.Tensor
        ``[nbytes]`` uint8, contiguous, base address aligned to ``WORKSPACE_ALIGNMENT``
        (256) bytes. Bytes ``[0, COUNTER_REGION_BYTES)`` are split counters, zero when no
        call runs; later bytes may hold anything.
    nbytes : int
    device : torch.device

    Raises
    ------
    TypeError
        nbytes is not an int; device is not a torch.device, str or int.
    ValueError
        nbytes is below ``COUNTER_REGION_BYTES`` or above 2**63 - 256; device does not
        parse, is neither a CPU nor a CUDA device, or names a CUDA device this process does
        not have.

    Example
    -------
    >>> workspace = splitkv.Workspace(64 << 20, "cpu")
    >>> out = splitkv.paged_attention(q, kv_cache, block_tables, seq_lens, workspace)
    >>> workspace.check_counter_region()  # raises ValueError if a counter is nonzero
    """

    def __init__(self, nbytes, device="cpu"):
        op = "Workspace"
        nbytes = checked_nbytes(op, "nbytes", nbytes)
        device = _checks.workspace_device(op, device)
        # torch's CPU allocator only promises 64-byte alignment: over-allocate and slice.
        raw = torch.zeros(nbytes + WORKSPACE_ALIGNMENT - 1, dtype=torch.uint8, device=device)
        skip = -raw.data_ptr() % WORKSPACE_ALIGNMENT
        self._raw = raw
        self.tensor = raw[skip:skip + nbytes]
        self.device = raw.device
        self._status_host = _new_status_mirror(self.device)
        self._view = None

    def counter_region(self):
        """The counter region, bytes ``[0, COUNTER_REGION_BYTES)``, as a uint8 view."""
        return self.tensor[:COUNTER_REGION_BYTES]

    def check_counter_region(self):
        """Raises ValueError unless every counter is zero (syncs on CUDA: copies 8 MiB).

        The message names how many counters are nonzero and the first one's index, byte
        offset and value.
        """
        check_counter_region(self)

    def raise_if_error(self):
        """Raises ValueError if a launch on this workspace met a dirty counter; heals it.

        A CUDA launch that finds a split counter in a state the protocol cannot leave
        (bytes written by someone else, a launch that died part-way) records it in the
        workspace's status record, never hangs, and its outputs are invalid. The next
        splitkv call on this workspace raises for it, if the GPU has run that launch by
        then; this method says so at once: it synchronises the current stream and reads the
        record. Use it after replaying a CUDA graph. On the CPU a dirty counter is refused
        by the call that meets it.

        Raises
        ------
        ValueError
            Named for :func:`check_workspace`, which it calls: on CUDA "check_workspace:
            workspace counter region corrupted: an earlier launch on this workspace found
            counter I (bytes ...) holding V ..."; on the CPU, where no launch records one,
            for bytes someone else wrote into the status record: "check_workspace:
            workspace counter region corrupted: expected the status record (bytes
            8388352..8388608) to be 0 at rest, got ...". The counter region has been zeroed
            (on the current stream) before the error is raised, so later calls are right.
        """
        check_workspace(self)

    def reset(self):
        """Zeroes the counter region (on the current stream for CUDA, no sync) and clears the
        status record: the way back after a fault, without reallocating.

        Raises
        ------
        ValueError
            Another thread's call is using the workspace ("workspace in use"): zeroing its
            counters under it would break that call.
        """
        _reset("reset", self)

    def __repr__(self):
        return f"Workspace(nbytes={self.nbytes}, device='{self.device}')"

    def __reduce__(self):
        """copy.copy, copy.deepcopy and pickle (multiprocessing too) make a new zeroed
        Workspace of the same size and device: its bytes are scratch, and the counter region
        a new one must hold is zero. The buffer itself is never pickled: its default copy
        lands at an address torch aligns to 64 bytes only (refused as misaligned), and
        torch.multiprocessing would move this workspace's own storage into shared memory
        (a new, misaligned address for the view ``tensor``: every later call refused). The
        device goes as an empty tensor on it (device_token), so that torch.load's map_location
        applies to it."""
        # A subclass stays one, with its own attributes (__getstate__: its own, if it has one).
        return (_new_workspace, (type(self), self.nbytes, device_token(self.device)),
                self.__getstate__())

    def __getstate__(self):
        """A copy's attributes: all but the buffer's, in ``__dict__`` and a subclass's
        ``__slots__`` (as ``(dict, slots)`` when it has slots, as Python's default does). An
        attribute that is a view of ``tensor`` (a subclass's ``counter_region()``, say) goes as
        its place in the buffer (_BufferView), and is the same view of the copy's new buffer:
        copied as a tensor, it took the whole buffer's bytes along, and torch.multiprocessing
        moved this workspace's storage into shared memory (a new, misaligned address)."""
        views = {}
        state = {k: self._state_value(v, views) for k, v in vars(self).items()
                 if k not in _BUFFER_ATTRIBUTES}
        slots = {name: self._state_value(getattr(self, name), views)
                 for name in copyreg._slotnames(type(self)) if hasattr(self, name)}
        if slots:
            return state or None, slots
        return state or None

    def __setstate__(self, state):
        """Sets what __getstate__ gave, each _BufferView as that view of this buffer."""
        state, slots = state if isinstance(state, tuple) else (state, None)
        views = {}
        for name, value in (state or {}).items():
            self.__dict__[name] = self._state_value(value, views)
        for name, value in (slots or {}).items():
            setattr(self, name, self._state_value(value, views))

    def _state_value(self, value, views):
        """``value`` as a copy keeps it: a view of this workspace's bytes as a _BufferView and
        back (``views``: one per object, so two attributes naming one view still do)."""
        if id(value) in views:
            return views[id(value)]
        made = value
        if isinstance(value, _BufferView):
            made = value.view_of(self.tensor)
        elif isinstance(value, torch.Tensor) and type(value) is torch.Tensor:
            made = _BufferView.of(value, self.tensor) or value
        views[id(value)] = made
        return made

    def _launch_view(self):
        """(tensor, its signature, C++ view, busy key, stream order, address) of
        ``self.tensor``, made again whenever the tensor, its address, shape or strides change
        (``resize_``, ``set_`` or ``as_strided_`` in place keep the object): a call's fast path
        (splitkv._calls) reads them instead of the tensor, and keys its layouts by the
        signature, so a changed tensor takes the full path's checks."""
        view = self._view
        buffer = self.tensor
        # The dtype too: ``tensor.data = tensor.view(torch.int8)`` keeps the object, address,
        # shape and strides; the full path refuses a workspace that is not uint8.
        if (view is None or view[0] is not buffer or view[5] != buffer.data_ptr()
                or view[1][1] != buffer.shape or view[1][2] != buffer.stride()
                or view[1][3] is not buffer.dtype):
            key = busy_key(buffer)
            view = self._view = (buffer, tensor_signature(buffer), c_workspace(self, buffer), key,
                                 stream_order(key, buffer.device), buffer.data_ptr())
        return view

    @property
    def nbytes(self):
        """The size of ``tensor`` in bytes (it follows a ``resize_`` of the tensor)."""
        return self.tensor.numel()


_BUFFER_ATTRIBUTES = ("_raw", "tensor", "device", "_status_host", "_view")


class _BufferView:
    """A tensor over a workspace's bytes in its pickled or copied state: where it starts in
    ``tensor`` (bytes), its dtype, shape and strides."""

    __slots__ = ("offset", "dtype", "shape", "stride")

    def __init__(self, offset, dtype, shape, stride):
        self.offset, self.dtype, self.shape, self.stride = offset, dtype, shape, stride

    def __reduce__(self):
        return (_BufferView, (self.offset, self.dtype, self.shape, self.stride))

    @classmethod
    def of(cls, view, buffer):
        """The _BufferView of ``view`` if it lies within ``buffer``'s bytes, else None."""
        if (view.device != buffer.device or view.untyped_storage().data_ptr()
                != buffer.untyped_storage().data_ptr()):
            return None
        # Bytes of the view's span, from the buffer's first byte (same storage: addresses).
        begin, end = _checks._byte_span(view) if view.numel() else (view.data_ptr(),) * 2
        offset, end = begin - buffer.data_ptr(), end - buffer.data_ptr()
        if offset < 0 or end > buffer.numel():
            return None
        return cls(offset, view.dtype, tuple(view.shape), tuple(view.stride()))

    def view_of(self, buffer):
        """The same view of another workspace's ``buffer`` (aligned as the first one was)."""
        # Whole elements: both buffers start WORKSPACE_ALIGNMENT-aligned, at an offset into
        # storages that torch's allocators align to 64 bytes at least.
        start = buffer.storage_offset() + self.offset
        made = torch.empty(0, dtype=self.dtype, device=buffer.device)
        return made.set_(buffer.untyped_storage(), start // self.dtype.itemsize, self.shape,
                         self.stride)


def _new_workspace(cls, nbytes, device):
    """Workspace.__reduce__'s constructor: a new zeroed workspace of class ``cls`` (a subclass
    may take other arguments: Workspace's own __init__ makes the buffer) on ``device`` (a
    device_token, or a str in pickles made before tokens)."""
    workspace = cls.__new__(cls)
    Workspace.__init__(workspace, nbytes, token_device(device))
    return workspace


def device_token(device):
    """An empty uint8 tensor on ``device``: how a pickled workspace names its device. torch.load's
    map_location moves tensors only (a device given as a str stayed where it was saved, so a
    Workspace saved on CUDA could not be loaded on a CPU-only machine); an empty one costs no
    bytes in the pickle and no device memory. Under a tensor mode (FakeTensorMode) the empty
    tensor would be the mode's, which does not pickle: the device goes as a str then, as before
    tokens (torch.load's map_location does not move it)."""
    token = torch.empty(0, dtype=torch.uint8, device=device)
    return token if token.__class__ is torch.Tensor else str(device)


def token_device(token):
    """The device a pickled workspace names: its device_token's, or the str itself."""
    return token.device if isinstance(token, torch.Tensor) else token


def _new_status_mirror(device):
    """Pinned host words the CUDA kernels write a dirty-counter record into (C++:
    WorkspaceBuffer::status_host), so the next call sees it without a sync. None on the CPU."""
    if device.type != "cuda":
        return None
    return torch.zeros(_splitkv.kStatusWords, dtype=torch.int32, pin_memory=True)


# Mirrors of users' own CUDA uint8 buffers, by storage (device, address), made on first use.
_status_mirrors = {}


def status_host_address(workspace, buffer):
    """The address of the pinned status mirror serving ``workspace`` (0 on the CPU)."""
    if buffer.device.type != "cuda":
        return 0
    mirror = getattr(workspace, "_status_host", None)
    if mirror is None:
        key = (str(buffer.device), buffer.untyped_storage().data_ptr())
        mirror = _status_mirrors.get(key)
        if mirror is None:
            mirror = _status_mirrors.setdefault(key, _new_status_mirror(buffer.device))
    return mirror.data_ptr()


def _status_call_args(workspace, buffer):
    """(WorkspaceBuffer, Backend, stream) for the status and reset calls."""
    view = c_workspace(workspace, buffer)
    if buffer.device.type == "cuda":
        return view, _splitkv.Backend.cuda, torch.cuda.current_stream(buffer.device).cuda_stream
    return view, _splitkv.Backend.cpu, 0


@_docs.shared_params
def check_workspace(workspace):
    """Raises ValueError if a launch on ``workspace`` recorded a dirty counter (see
    :meth:`Workspace.raise_if_error`). Reads the status record at the end of the counter
    region (syncs on CUDA); when it holds a report, zeroes the counter region (on CUDA,
    on the current stream before anything queued after this call) and raises. It does not
    scan the counters themselves: a nonzero counter that no launch has used yet is not
    seen here (``SPLITKV_CHECK_WORKSPACE=1`` scans the whole region around every call).

    Parameters
    ----------
    @workspace_buffer@

    Raises
    ------
    TypeError
        workspace is neither a Workspace nor a uint8 tensor.
    ValueError
        A dirty counter was recorded, or stray bytes sit in the status record ("workspace
        counter region corrupted: ..."); the buffer is smaller than the counter region; or
        another thread's call is using it ("workspace in use").
    """
    buffer = _checks.workspace_tensor("check_workspace", workspace)
    with exclusive("check_workspace", workspace, check=False), on_device(buffer.device):
        _splitkv.CheckWorkspaceStatus("check_workspace", *_status_call_args(workspace, buffer))


@_docs.shared_params
def reset_counter_region(workspace):
    """Zeroes the counter region of ``workspace`` and clears its status record: the way back
    after a fault (:meth:`Workspace.reset` for a Workspace), e.g. for a user's buffer whose
    bytes were copied from a workspace in use.

    Holds the workspace as a call does: refused while another thread's call uses it; on CUDA
    enqueued on the current stream (no sync), after the last launch on the same memory from
    another stream.

    Parameters
    ----------
    @workspace_buffer@

    Raises
    ------
    TypeError
        workspace is neither a Workspace nor a uint8 tensor.
    ValueError
        The buffer is smaller than the counter region, or another thread's call is using it
        ("workspace in use").
    """
    _reset("reset_counter_region", workspace)


def _reset(op, workspace):
    buffer = _checks.workspace_tensor(op, workspace)
    with exclusive(op, workspace, check=False), on_device(buffer.device):
        _splitkv.ResetCounterRegion(*_status_call_args(workspace, buffer))


_NO_GUARD = contextlib.nullcontext()


def on_device(device):
    """``device`` current for the block (CUDA); nothing on the CPU or when it already is
    (entering torch.cuda.device costs microseconds on every per-call launch)."""
    if device.type != "cuda" or torch.cuda.current_device() == device.index:
        return _NO_GUARD
    return torch.cuda.device(device)


def current_raw_stream(index):
    """The cudaStream_t of the current stream of device `index`, without making a
    torch.cuda.Stream (torch's own raw-handle query where it has one)."""
    return torch.cuda.current_stream(index).cuda_stream


if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    current_raw_stream = torch._C._cuda_getCurrentRawStream  # noqa: F811


def check_every_call(op, workspace, buffer, when):
    """SPLITKV_CHECK_WORKSPACE=1: the whole counter region must be zero (synchronises)."""
    if buffer.numel() < COUNTER_REGION_BYTES or buffer.data_ptr() % WORKSPACE_ALIGNMENT:
        return  # the launcher refuses such a buffer with its own message, before any counter
    if buffer.device.type == "cuda":
        torch.cuda.current_stream(buffer.device).synchronize()
    # Flat first: a workspace may have any rank (slicing a 2-D one would take whole rows,
    # scratch bytes included, and a 0-d one cannot be sliced).
    region = buffer.view(-1)[:COUNTER_REGION_BYTES].view(torch.int32)
    nonzero = torch.nonzero(region).flatten()
    if nonzero.numel() == 0:
        return
    first = int(nonzero[0])
    value = int(region[first]) & 0xFFFFFFFF
    _splitkv.ResetCounterRegion(*_status_call_args(workspace, buffer))
    _checks.fail(op, "workspace counter region", f"not zero {when} the call",
                 "every word of bytes [0, COUNTER_REGION_BYTES) 0 (SPLITKV_CHECK_WORKSPACE=1)",
                 f"{nonzero.numel()} nonzero words, the first at index {first} (byte {4 * first}) "
                 f"holding {value}",
                 "the region was reset to zero")


@_docs.shared_params
def check_counter_region(workspace):
    """Raises ValueError unless the counter region of ``workspace`` is all zero. A CUDA
    buffer's counter region is copied to the host (a sync).

    Parameters
    ----------
    @workspace_buffer@

    Raises
    ------
    TypeError
        workspace is neither a Workspace nor a uint8 tensor.
    ValueError
        A counter is nonzero ("counter region not zero", with the count and the first
        nonzero counter's index, byte and value); the buffer is smaller than the region or on
        neither a CPU nor a CUDA device; or another thread's call is using it ("workspace in
        use").
    """
    op = "check_counter_region"
    buffer = _checks.workspace_tensor(op, workspace)
    if buffer.device.type not in _checks.BACKENDS:  # a meta tensor has no bytes to copy
        _checks.fail(op, "workspace device", "unsupported", "a cpu or cuda tensor",
                     buffer.device)
    with exclusive(op, workspace, check=False):
        # Flat first, as the launchers read it: a workspace may have any rank (0-d included).
        region = buffer.view(-1)[:COUNTER_REGION_BYTES]
        if region.device.type != "cpu":
            region = region.cpu()
        _splitkv.CheckCounterRegionZero(region.data_ptr(), buffer.numel())


# Storages (device, base address) that a call is using now: a second call on any view of
# the same storage, from another thread, is refused rather than left to race on the counters.
# Distinct storages over overlapping memory (two torch.from_numpy of one array) are not
# detected: keys are storages, not byte ranges (docs/bad_inputs.md, Concurrency).
_in_use = {}
# A forked child has only the thread that forked: no call of its own is running, so claims
# copied from the parent's other threads would refuse that workspace (and its reset) forever.
# The bytes of a launch cut off by the fork stay: the child's next call on that memory reports
# them (the C++ in-use word or a dirty counter), and reset() clears them.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_use.clear)
# CUDA: per storage, the C++ StreamOrder of its launches (an event per stream, recorded after
# each launch; a launch on another stream first waits for the last one on the GPU), so one
# workspace's launches never overlap and no host thread syncs. The templates' launch runs
# it around the kernel launch, in the same C++ call.
_orders = {}


def busy_key(buffer):
    """The key under which calls on ``buffer``'s memory are tracked: (device, storage base)."""
    return (str(buffer.device), buffer.untyped_storage().data_ptr())


def stream_order(key, device):
    """The StreamOrder of the memory of ``key`` (None on the CPU), made on first use."""
    if device.type != "cuda":
        return None
    order = _orders.get(key)
    if order is None:
        order = _orders.setdefault(key, _splitkv.StreamOrder())
    return order


def claim(key):
    """Marks the memory of ``key`` busy for one call if no other call holds it; returns
    whether it did. (dict.setdefault is one atomic step: no lock is needed to claim a key.)"""
    mine = object()
    return _in_use.setdefault(key, mine) is mine


def acquire(op, key):
    """As claim, refusing the call if another call holds the memory."""
    if not claim(key):
        _checks.fail(op, "workspace", "in use", "a workspace no other call is using",
                     "one that another thread is using",
                     "use one Workspace per thread (and per CUDA stream)")


def release(key):
    _in_use.pop(key, None)


@contextlib.contextmanager
def exclusive(op, workspace, check=True):
    """Marks the workspace's memory busy for one call (a Workspace or a user's tensor), and
    on CUDA orders the launch after the last one on the same memory from another stream
    (StreamOrder; nothing while the stream captures a CUDA graph). ``check=False``: never
    the SPLITKV_CHECK_WORKSPACE scan (the counter-region entry points, which heal or read
    the region themselves)."""
    buffer = workspace.tensor if isinstance(workspace, Workspace) else workspace
    key = busy_key(buffer)
    acquire(op, key)
    try:
        order = stream_order(key, buffer.device)
        if order is not None:
            stream = current_raw_stream(buffer.device.index)
            with on_device(buffer.device):
                if not order.Before(stream):
                    order = None
        try:
            if check and CHECK_EVERY_CALL:
                check_every_call(op, workspace, buffer, "before")
            yield
            if check and CHECK_EVERY_CALL:
                check_every_call(op, workspace, buffer, "after")
        finally:
            # Also when the body raised: what it enqueued (a healing reset before its error,
            # say) must be ordered before the next launch on this memory from another stream.
            if order is not None:
                with on_device(buffer.device):
                    order.After(stream)
    finally:
        release(key)