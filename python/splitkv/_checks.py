"""Torch-side argument checks: what the C++ core cannot see.

The C++ launchers get pointers, shapes and strides, so they check values (index contents,
multiples, workspace size and alignment) themselves. What only exists on the torch side
is checked here: Python types, dtypes, devices, ranks, strides, and the agreement of
shapes between tensors. Every message has the form
``<op>: <arg> <problem>: expected <X>, got <Y>[; <fix>]``; wrong types and dtypes raise
TypeError, everything else ValueError.
"""

import math
import numbers
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensor  # imported by `import torch` itself

from splitkv import _splitkv

_INT32_MAX = 2**31 - 1
_INT64_LIMIT = 2**63

DTYPE_CODES = {
    torch.float32: _splitkv.DType.float32,
    torch.float16: _splitkv.DType.float16,
    torch.bfloat16: _splitkv.DType.bfloat16,
}

BACKENDS = {"cpu": _splitkv.Backend.cpu, "cuda": _splitkv.Backend.cuda}


def fail(op, arg, problem, expected, got, fix=None, error=ValueError):
    message = f"{op}: {arg} {problem}: expected {expected}, got {got}"
    raise error(message + (f"; {fix}" if fix else ""))


def traced(q):
    """Whether a call must take its custom op (splitkv.ops) instead of raw addresses: under
    torch.compile, or when q is a fake tensor (torch's FakeTensorMode, make_fx), which has
    shapes but no storage to point at; the op's fake implementation then gives fake outputs.
    A plain tensor costs one class test beside torch.compiler.is_compiling()."""
    return torch.compiler.is_compiling() or (q.__class__ is not torch.Tensor
                                             and isinstance(q, FakeTensor))


_functorch = getattr(torch._C, "_functorch", None)


def not_transformed(op, **arguments):
    """Raises TypeError naming the first tensor among ``arguments`` (a tensor, a (k, v) pair
    or None each) that a torch.func transform (vmap, grad, jvp) wraps: such a tensor has no
    storage to point at, and the calls have neither a batching rule nor a derivative. The
    functions call it only once a call has failed with torch's RuntimeError (a wrapped
    tensor's data_ptr() raises one), so a valid call pays nothing for it."""
    if _functorch is None:
        return
    for name, value in arguments.items():
        for x in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(x, torch.Tensor) and _functorch.is_functorch_wrapped_tensor(x):
                fail(op, name, "is wrapped by a torch.func transform",
                     "a plain tensor with storage",
                     "a batched tensor (torch.func.vmap)" if _functorch.is_batchedtensor(x)
                     else "a tensor of torch.func.grad, jvp or another transform",
                     "call splitkv outside torch.func transforms: batch requests along q's "
                     "first dimension (block_tables / cu_seqlens) instead of vmap; the calls "
                     "have no derivative", error=TypeError)


def tensor(op, name, x):
    if not isinstance(x, torch.Tensor):
        fail(op, name, "has the wrong type", "a torch.Tensor", type(x).__name__, error=TypeError)
    if x.layout != torch.strided or x.is_nested:  # the launchers read memory through strides
        fail(op, name, "layout unsupported", "a strided (dense) tensor",
             "a nested tensor" if x.is_nested else x.layout,
             None if x.is_nested else f"pass {name}.to_dense()", error=TypeError)
    not_negated(op, name, x)
    return x


@torch.compiler.assume_constant_result
def _traced_is_neg(x):
    """x.is_neg() while torch.compile traces (Dynamo cannot trace is_neg() itself): read on
    the fake tensor, which keeps the neg bit, as a constant; Dynamo guards on the input's
    dispatch keys (Negative among them), so a call that changes the bit recompiles."""
    return x.is_neg()


def not_negated(op, name, x):
    """Refuses a negated view (``x.is_neg()``, e.g. ``torch.conj(c).imag``): its memory holds
    -x, and the launchers read and write memory. Also while torch.compile traces: the op's
    implementation never sees the bit (torch's Negative fallback hands it a resolved copy,
    and inductor drops the bit of a graph input, so the op would read -x: a wrong answer)."""
    if _traced_is_neg(x) if torch.compiler.is_compiling() else x.is_neg():
        fail(op, name, "is a negated view", "a tensor whose memory holds its values",
             "is_neg() == True", f"pass {name}.resolve_neg()")


def out_writable(x):
    """Whether torch lets a call write ``x`` in place: not when it requires grad (the call
    records no gradient), nor an inference tensor outside inference mode."""
    return not x.requires_grad and not (x.is_inference() and not torch.is_inference_mode_enabled())


def writable_out(op, x, name="out"):
    """Refuses an output ``name`` (out, or a raw op's lse) that out_writable rejects, saying
    why. Skipped while torch.compile traces: the op's implementation runs it on the real
    tensor (the flags are not dispatch keys, so torch keeps them)."""
    if torch.compiler.is_compiling() or out_writable(x):
        return
    if x.requires_grad:
        fail(op, name, "requires grad", f"{name}.requires_grad == False (splitkv's calls record no "
             "gradient)", f"{name}.requires_grad == True")
    fail(op, name, "is an inference tensor outside inference mode",
         "a tensor writable in place here", f"{name}.is_inference() == True",
         f"call inside torch.inference_mode() or pass another {name}")


def attention_dtype(op, name, x):
    """The DType code of q (float32, float16 or bfloat16)."""
    if x.dtype not in DTYPE_CODES:
        fail(op, name, "dtype unsupported", "torch.float16, torch.bfloat16 or torch.float32",
             x.dtype, error=TypeError)
    return DTYPE_CODES[x.dtype]


def same_dtype(op, name, x, ref_name, ref):
    if x.dtype != ref.dtype:
        fail(op, name, "dtype mismatch", f"{ref.dtype} (the dtype of {ref_name})", x.dtype,
             error=TypeError)


def not_null(op, name, x):
    """Refuses a tensor with elements but no memory: its storage resized to 0, as FSDP-style
    freeing leaves it (data_ptr() is then 0, or for a view at an offset the offset in bytes:
    the storage's own address says), or an efficient-zero tensor. The launchers take a null
    address for an absent tensor (sinks, a per-head scale, kv_offsets), so such a tensor would
    silently drop out of the call, and a view's small address would be read. A cached
    layout's C++ launch sends a null address here (the full path) for this message."""
    if x.numel() > 0 and (x.data_ptr() == 0 or x.untyped_storage().data_ptr() == 0):
        fail(op, name, "is null", "a valid pointer", "null")


def index_tensor(op, name, x, ndim):
    """An int32 index tensor (block_tables, seq_lens, cu_seqlens_*): refused, not converted."""
    tensor(op, name, x)
    if x.dtype != torch.int32:
        fix = f"pass {name}.to(torch.int32)" if x.dtype == torch.int64 else None
        fail(op, name, "dtype unsupported", "torch.int32", x.dtype, fix, error=TypeError)
    rank(op, name, x, ndim)
    if ndim == 1:
        contiguous(op, name, x)
    else:
        inner_stride(op, name, x)
    return x


def rank(op, name, x, ndim, shape_doc=None):
    if x.dim() != ndim:
        expected = f"a {ndim}-D tensor" + (f" {shape_doc}" if shape_doc else "")
        fail(op, name, "has the wrong number of dimensions", expected, f"shape {tuple(x.shape)}")


def dim(op, name, x, axis, expected, what):
    if x.shape[axis] != expected:
        fail(op, f"{name}.shape[{axis}]", "mismatch", f"{expected} ({what})", x.shape[axis])


def same_shape(op, name, x, ref_name, ref):
    if x.shape != ref.shape:
        fail(op, name, "shape mismatch", f"{tuple(ref.shape)} (the shape of {ref_name})",
             tuple(x.shape))


def inner_stride(op, name, x):
    """The last dimension must be dense: the kernels read head_dim elements in a row."""
    if x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        fail(op, f"{name}.stride(-1)", "is not 1", "1 (a dense last dimension)", x.stride(-1),
             f"pass {name}.contiguous()")


def contiguous(op, name, x):
    if not x.is_contiguous():
        fail(op, name, "is not contiguous", "a contiguous tensor", f"strides {x.stride()}",
             f"pass {name}.contiguous()")


def device(op, name, x, ref_device):
    if x.device != ref_device:
        fail(op, f"{name} device", "mismatch", f"{ref_device} (q's device)", x.device,
             f"move {name} to {ref_device}")


def sinks(op, x, q):
    """The address of ``sinks`` (0 for None): float32 ``[num_qo_heads]``, contiguous, on q's
    device. Refused, not converted: a float16 or int sink would change the softmax."""
    if x is None:
        return 0
    tensor(op, "sinks", x)
    if x.dtype != torch.float32:
        fail(op, "sinks", "dtype unsupported", "torch.float32", x.dtype, "pass sinks.float()",
             error=TypeError)
    device(op, "sinks", x, q.device)
    rank(op, "sinks", x, 1, "[num_qo_heads]")
    dim(op, "sinks", x, 0, q.shape[1], "num_qo_heads, q.shape[1]")
    contiguous(op, "sinks", x)
    not_null(op, "sinks", x)
    return x.data_ptr()


def kv_dtype(op, name, x, q):
    """k / v / kv_cache: q's dtype, or torch.float8_e4m3fn (an fp8 cache) with float16 or
    bfloat16 q. Returns whether it is fp8."""
    fp8 = x.dtype == torch.float8_e4m3fn
    if x.dtype == q.dtype or (fp8 and q.dtype in (torch.float16, torch.bfloat16)):
        return fp8
    if fp8:
        fail(op, f"{name} dtype", "unsupported with q " + str(q.dtype),
             "q torch.float16 or torch.bfloat16 with a torch.float8_e4m3fn cache", x.dtype,
             error=TypeError)
    if x.dtype.is_floating_point and x.dtype.itemsize == 1:  # e5m2 and the other fp8 formats
        fail(op, name, "dtype unsupported",
             f"{q.dtype} (the dtype of q) or torch.float8_e4m3fn (fp8 with k_scale, v_scale)",
             x.dtype, error=TypeError)
    same_dtype(op, name, x, "q", q)
    return False


def kv_scale(op, name, scale, fp8, kv_dtype_, num_kv_heads, q):
    """(value, address) of k_scale / v_scale: a finite float (address 0) or a float32
    [num_kv_heads] tensor on q's device (value 1). Only with an fp8 cache, and required there."""
    if not fp8:
        if scale is not None:
            got = f"a {scale.dtype} tensor" if isinstance(scale, torch.Tensor) else repr(scale)
            fail(op, name, "given without an fp8 KV cache",
                 f"None (scales apply to a torch.float8_e4m3fn cache; this one is {kv_dtype_})",
                 got)
        return 1.0, 0
    if scale is None:
        fail(op, name, "is missing",
             "a float or a float32 tensor [num_kv_heads] with a torch.float8_e4m3fn KV cache",
             None)
    if isinstance(scale, torch.Tensor):
        not_negated(op, name, scale)
        if scale.dtype != torch.float32:
            fail(op, name, "dtype unsupported", "torch.float32", scale.dtype, f"pass {name}.float()",
                 error=TypeError)
        device(op, name, scale, q.device)
        rank(op, name, scale, 1, "[num_kv_heads]")
        dim(op, name, scale, 0, num_kv_heads, "num_kv_heads")
        contiguous(op, name, scale)
        not_null(op, name, scale)
        return 1.0, scale.data_ptr()
    value = real(op, name, scale)
    if not math.isfinite(value):
        fail(op, name, "is not finite", "a finite scale", repr(value))
    return value, 0


def backend(op, dev):
    if dev.type not in BACKENDS:
        fail(op, "q device", "unsupported", "a cpu or cuda tensor", dev)
    return BACKENDS[dev.type]


def workspace_device(op, device):
    """``device`` (a torch.device, a str or a CUDA index) as the torch.device of a buffer
    splitkv can run on: a CPU, or a CUDA device this process has."""
    if isinstance(device, bool) or not isinstance(device, (torch.device, str, int)):
        fail(op, "device", "has the wrong type", "a torch.device, a str or an int",
             _type_text(device), error=TypeError)
    # An int N is CUDA device N (torch.device(N) means the current accelerator and raises
    # where the process has none, which would read as "not a device").
    try:
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, ValueError):  # torch's own message names no argument
        dev = None
    if dev is None:
        fail(op, "device", "is not a device", "'cpu', 'cuda', 'cuda:N' or an int N >= 0", repr(device))
    if dev.type not in BACKENDS:
        fail(op, "device", "unsupported", "a cpu or cuda device", repr(str(dev)))
    if dev.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            fail(op, "device", "is not available", "a CUDA device (this process sees none)",
                 repr(str(dev)))
        if dev.index is not None and dev.index >= count:
            fail(op, "device", "is not available", f"a CUDA device index below {count}",
                 repr(str(dev)))
    return dev


def workspace_tensor(op, ws):
    """The uint8 tensor behind a Workspace or a user's own buffer."""
    buffer = getattr(ws, "tensor", ws)
    if not isinstance(buffer, torch.Tensor):
        if buffer is not ws:  # a Workspace whose tensor attribute was replaced
            fail(op, "workspace.tensor", "has the wrong type", "a uint8 torch.Tensor",
                 type(buffer).__name__, error=TypeError)
        fail(op, "workspace", "has the wrong type", "a splitkv.Workspace or a uint8 torch.Tensor",
             type(ws).__name__, error=TypeError)
    if buffer.dtype != torch.uint8:
        fail(op, "workspace", "dtype unsupported", "torch.uint8", buffer.dtype, error=TypeError)
    contiguous(op, "workspace", buffer)
    return buffer


def flag(op, name, value):
    # Python bools only: 1, 1.0, numpy and tensor bools compare equal to True and would be
    # converted silently.
    if not isinstance(value, bool):
        # _type_text, not repr: a tensor's repr is its values, which torch.compile cannot
        # trace (fullgraph would then lose this message).
        fail(op, name, "has the wrong type", "a bool", _type_text(value), error=TypeError)
    return value


def _type_text(value):
    """What a refused option was: a tensor by its kind (its repr is its values), else repr."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return repr(value)


def _not_a_number(value):
    """A bool (Python's or numpy's), a tensor or an array (a 0-d one too): what a numeric
    option refuses rather than reads. A tensor or array has __index__ / __float__ too:
    reading it is a silent conversion (and, for a CUDA tensor, a device sync), and True
    reads as 1."""
    if isinstance(value, (bool, torch.Tensor)) or getattr(value, "ndim", 0) != 0:
        return True
    np = sys.modules.get("numpy")  # not imported: no numpy value can be here
    # numpy registers timedelta64 as an integer type (numbers.Integral): a duration, not a count.
    return np is not None and isinstance(value, (np.bool_, np.ndarray, np.timedelta64, np.datetime64))


def integer(op, name, value, minimum, expected):
    # Options take Python (or numpy) scalars only (_not_a_number). A Python int is taken as it
    # is: torch.compile traces a symbolic int (dynamic=True, or a value that changed between
    # calls) as one, and cannot trace hasattr or __index__ on it; the comparisons below then
    # become guards on it. type(), not __class__ or isinstance: Dynamo traces type() alone.
    if type(value) is not int and not isinstance(value, torch.SymInt):  # noqa: E721
        if _not_a_number(value) or not hasattr(value, "__index__"):
            fail(op, name, "has the wrong type", "an int", _type_text(value), error=TypeError)
        value = value.__index__()
    if torch.compiler.is_compiling():
        # The range is the op's to check, on the real value: Dynamo traces a symbolic int as
        # an int (type() and isinstance cannot tell it from a constant), and a refusal here
        # would build its message from the symbol, which Dynamo cannot format (fullgraph
        # would then report "BUILD_STRING type error" without splitkv's message). Only a
        # value past int64, which the op's SymInt cannot carry (and no symbol holds), is
        # refused here, with the message below.
        if value < -_INT64_LIMIT:
            fail(op, name, "out of range", expected, value)
        if value >= _INT64_LIMIT:
            fail(op, name, "out of range", f"{expected} and <= {_INT32_MAX} (int32)", value)
        return value
    if value < minimum:
        fail(op, name, "out of range", expected, value)
    if value > _INT32_MAX:  # the C++ options are int32
        fail(op, name, "out of range", f"{expected} and <= {_INT32_MAX} (int32)", value)
    return value


# The C++ options are float32: a value outside its normal range would silently become 0
# (a soft cap turned off) or inf.
_FLOAT32_MIN_NORMAL = 1.1754943508222875e-38
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT64_INT_LIMIT = 2**1024  # the ints float() converts lie strictly inside (-2**1024, 2**1024)


def real(op, name, value):
    """A Python float in float32's normal range: 0, NaN/inf as given (callers check those),
    or a magnitude in [FLT_MIN, FLT_MAX]. A float32 subnormal is refused too: its float32
    rounding keeps only part of the value's 24 significant bits."""
    # A Python float or a traced symbol as it is, as in integer().
    if type(value) is not float and not isinstance(value, torch.SymFloat):  # noqa: E721
        # numbers.Real: numpy's float and int scalars and Fraction; not numpy's str_, bytes_ or
        # complex scalars, which have __float__ too (a string parsed, an imaginary part dropped).
        # A Python int needs neither test: Dynamo traces a symbolic int (an int option that
        # changed between compiled calls, or dynamic=True) as one and cannot trace their
        # hasattr / isinstance on it (fullgraph: "Unsupported hasattr call").
        if type(value) is not int and (  # noqa: E721
                _not_a_number(value) or not isinstance(value, numbers.Real)):
            fail(op, name, "has the wrong type", "a float", _type_text(value), error=TypeError)
        # An int past float64's range, refused before float(): Dynamo cannot catch float()'s
        # OverflowError (an internal error under torch.compile); comparisons, not bit_length(),
        # which Dynamo cannot trace on a symbolic int.
        overflow = type(value) is int and not -_FLOAT64_INT_LIMIT < value < _FLOAT64_INT_LIMIT
        if not overflow:
            try:
                value = float(value)
            except OverflowError:  # an int just below 2**1024 that rounds up to it
                overflow = True
        if overflow:
            fail(op, name, "outside float32's normal range", "0 or a magnitude in [1.2e-38, 3.4e38]",
                 f"an int of {value.bit_length()} bits")
    if torch.compiler.is_compiling():  # the op checks the range on the real value (integer())
        return value
    if value != 0 and _FLOAT32_MIN_NORMAL > abs(value) or _FLOAT32_MAX < abs(value) < float("inf"):
        fail(op, name, "outside float32's normal range",
             "0 or a magnitude in [1.2e-38, 3.4e38]", repr(value))
    return value


def _byte_span(x):
    """Bytes [begin, end) from x's first to its last element (strides are >= 0 in torch)."""
    begin = x.data_ptr()
    if x.is_contiguous():  # the common case, without a Python loop over the dimensions
        return begin, begin + x.numel() * x.element_size()
    extent = sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()))
    return begin, begin + (extent + 1) * x.element_size()


def disjoint(op, name, x, named_tensors, noun, fix):
    """Refuse `x`, which the call writes, sharing a byte with any of `named_tensors`
    ((name, tensor or None) pairs; tensors on another device are skipped). The spans from
    first to last element are compared; the offsets reported are within `x`."""
    if x is None or x.numel() == 0:
        return
    x_begin, x_end = _byte_span(x)
    for other, y in named_tensors:
        if y is None or y.device != x.device or y.numel() == 0:
            continue
        begin, end = _byte_span(y)
        if begin < x_end and x_begin < end:
            shared = f"[{max(begin, x_begin) - x_begin}, {min(end, x_end) - x_begin})"
            fail(op, name, f"overlaps {other}", f"a {noun} sharing no byte with {other}",
                 f"{name} bytes {shared} within {other}'s span", fix)


def workspace_disjoint(op, buffer, named_tensors):
    """The call writes every workspace byte it plans to use: refuse a workspace that shares
    bytes with an input or output."""
    disjoint(op, "workspace", buffer, named_tensors, "buffer",
             "allocate the workspace on its own (splitkv.Workspace)")


def floating(op, name, x):
    """A floating-point tensor of any precision (merge_states' partial outputs)."""
    if not x.dtype.is_floating_point:
        fail(op, name, "dtype unsupported", "a floating-point dtype", x.dtype, error=TypeError)


def dtype_is(op, name, x, expected):
    """Exactly `expected` (an LSE is float32): refused, not converted."""
    if x.dtype != expected:
        fail(op, name, "dtype unsupported", expected, x.dtype, error=TypeError)


def at_least(op, name, value, minimum, what):
    """A size (an int from a shape) of at least `minimum`."""
    if value < minimum:
        fail(op, name, "out of range", f">= {minimum} ({what})", value)
