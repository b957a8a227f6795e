"""splitkv as an attention implementation of Hugging Face transformers' continuous batching.

    import splitkv.integrations.transformers as splitkv_hf
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=splitkv_hf.register())
    outputs = model.generate_batch(prompts, generation_config)   # or init_continuous_batching()

:func:`register` adds ``"paged|splitkv"`` to ``transformers.AttentionInterface``. The
continuous-batching loop (``generate_batch``, ``ContinuousBatchingManager``) then calls
:func:`paged_attention_forward` for every attention layer with its own
``PagedAttentionCache`` and the batch's packed tensors (``cu_seq_lens_q/k``,
``read_index``/``write_index``). Per layer:

- the new keys and values go into transformers' cache tensors at ``write_index`` (as its
  own paged implementations do);
- full-attention layers whose batch reads cached keys (decode, chunked prefill, a prompt
  joining requests that are decoding) run :func:`splitkv.paged_attention` directly on that
  cache: its ``[num_blocks * block_size, num_kv_heads, head_dim]`` tensors are NHD pages
  of ``block_size`` slots, and the block tables are read off ``read_index`` on the device
  (one gather per layer group and batch, shared by the group's layers);
- a batch of fresh prompts only (no cached keys) runs :func:`splitkv.ragged_attention`
  on the new keys and values;
- sliding-window layers run :func:`splitkv.ragged_attention` with ``window_left`` on the
  window transformers gathers from its rolling buffer (at most ``sliding_window - 1``
  cached keys per request plus the new ones), because that buffer is not in logical order;
  ``window_left = sliding_window - 1`` is read per layer (gpt-oss alternates sliding and
  full layers through ``config.layer_types``);
- a layer with attention sinks (gpt-oss: ``s_aux`` / ``module.sinks``) passes them as
  splitkv's ``sinks`` to each of those calls, the semantics of transformers' own
  ``paged|eager`` (its ``paged|sdpa`` drops them, so compare gpt-oss with ``paged|eager``).

Which keys a layer has is the paged cache's call (``config.layer_types``, else every layer
sliding when ``config.sliding_window`` is set): a layer whose own window is wider than the
one the cache keeps for it (a config carrying a ``sliding_window`` its attention does not
use, say) is refused; a windowed layer over a full-attention cache group reads its pages
with ``window_left``.

One :class:`splitkv.Workspace` per device serves every layer (:func:`workspace_for`);
managers generating at once on one device (two threads, two models) take turns on it
through a per-device lock around each splitkv call. The
adapter reads no device tensor on the host (lengths come from transformers' host-side
``max_seqlen_q``/``max_seqlen_k``), so a full-attention layer never waits for the GPU; a
sliding-window layer's gather is transformers' own ``cache.update``.

Not supported (each refused with an error naming it): transformers' decode fast path
(``block_table``: transformers enables it for flash attention only), CUDA-graph padding of
the batch, dropout, and a forward outside continuous batching (no paged cache).

Importing this module needs transformers (the ``transformers`` extra); ``import splitkv``
does not import it. Transformers 5.17 only (:data:`SUPPORTED_TRANSFORMERS`): 5.18 changed the
paged cache's layer groups, and from 5.20 continuous batching accepts no attention
implementation but its own ('paged|eager', 'sdpa', flash); :func:`register` refuses others.
"""

import math
import operator
import os
import threading
import weakref

import torch

try:
    import transformers
    from transformers import AttentionInterface
except ImportError as error:  # the optional dependency is missing: say how to get it
    raise ImportError(
        "splitkv.integrations.transformers: transformers not importable: expected "
        "transformers 5.17 (pip install '<splitkv wheel>[transformers]'), got: " + str(error)) from error

import splitkv
from splitkv import workspace as workspace_module

_OP = "splitkv.integrations.transformers"
# What continuous batching always passes the attention function (a missing one was a KeyError).
_REQUIRED_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_seqlen_q", "max_seqlen_k", "read_index",
                    "write_index")
# The transformers minor version whose continuous batching this adapter drives (tested).
SUPPORTED_TRANSFORMERS = "5.17"
# The name transformers' continuous batching looks up: its paged implementations are
# "paged|<name>"; a model loaded with "splitkv" is switched to it by generate_batch.
ATTN_IMPLEMENTATION = "paged|splitkv"
# Default bytes of each device's workspace: the 8 MiB counter region plus room for the
# split-KV partials of a few thousand query rows; the planner lowers num_splits to fit.
DEFAULT_WORKSPACE_BYTES = 64 << 20

_workspace_bytes = DEFAULT_WORKSPACE_BYTES
# Per device: its Workspace and the lock held around each splitkv call on it, so that two
# managers generating at once (each runs its own thread) take turns on it instead of the
# second one failing every request with splitkv's "workspace in use". The lock is held while
# the call runs on the CPU, while it is enqueued on CUDA (splitkv orders launches from other
# streams on the same memory itself); no device sync.
_workspaces = {}
_workspaces_lock = threading.Lock()
# Per CUDA workspace: the raw handles of the streams whose use of its memory torch's
# allocator was told of (_use_stream).
_streams_used = weakref.WeakKeyDictionary()


def _new_locks_in_child():
    """A forked child has only the thread that forked: a lock another thread held then (a
    manager's generation thread inside a splitkv call) would stay held there forever, and the
    child's first attention call would hang. splitkv drops that thread's in-use claims in the
    child (splitkv.workspace); these locks go with them."""
    global _workspaces_lock
    _workspaces_lock = threading.Lock()
    for device, (workspace, _) in list(_workspaces.items()):
        _workspaces[device] = workspace, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)
# Per paged cache (one a manager), per layer group: the block tables of the batch whose
# read_index / cu_seq_lens_k tensors are still alive (the same objects reach every layer of
# one forward; the next batch's are new objects). Keyed by cache, so two managers generating
# at once do not evict each other's tables every layer; a cache's entries go with it.
_block_tables_memo = weakref.WeakKeyDictionary()


def register(workspace_bytes=DEFAULT_WORKSPACE_BYTES):
    """Registers splitkv with transformers' attention registry and returns its name.

    Parameters
    ----------
    workspace_bytes : int, default 64 MiB
        Size of each device's :class:`splitkv.Workspace`, made on first use (>= 8 MiB;
        checked here as the Workspace checks its ``nbytes``). Takes effect for every later
        attention call: a device's workspace of another size, made before (an earlier
        ``register``), is dropped here, and that device's next call makes one of this size
        (:func:`workspace_for` returns it from then on). A call running meanwhile finishes on
        the old one; one of the same size is kept. A dropped CUDA workspace's memory goes
        back to torch's allocator once no call holds it, and is handed out again only after
        the work every stream enqueued on it is done (``Tensor.record_stream``).

    Returns
    -------
    str
        ``"paged|splitkv"``, for ``attn_implementation=`` of ``from_pretrained`` /
        ``from_config`` or ``model.set_attn_implementation``. ``"splitkv"`` is registered
        too; continuous batching switches it to the paged name.

    Raises
    ------
    ImportError
        The installed transformers is not 5.17.x.
    TypeError
        workspace_bytes is not an int.
    ValueError
        workspace_bytes is below ``splitkv.COUNTER_REGION_BYTES`` or above
        ``2**63 - splitkv.WORKSPACE_ALIGNMENT``.
    """
    global _workspace_bytes
    version = transformers.__version__
    if version.split(".")[:2] != SUPPORTED_TRANSFORMERS.split("."):
        raise ImportError(f"{_OP}.register: transformers version unsupported: expected "
                          f"{SUPPORTED_TRANSFORMERS}.x (later releases changed the paged cache and "
                          f"closed continuous batching to other attention implementations), got "
                          f"{version}")
    # Checked now, as splitkv.Workspace will (which makes it on first use).
    workspace_bytes = workspace_module.checked_nbytes(f"{_OP}.register", "workspace_bytes",
                                                      workspace_bytes)
    with _workspaces_lock:
        # Under the lock that makes workspaces: a call sees the old size and its workspace, or
        # the new size and none. A dropped entry's lock goes with it: a call still holding it
        # runs on the old workspace's own memory, apart from the new one's.
        _workspace_bytes = workspace_bytes
        for device, (workspace, _) in list(_workspaces.items()):
            if workspace.nbytes != workspace_bytes:
                # Freed once no call holds it: every stream that used a CUDA one was recorded
                # on its tensor (_use_stream), so torch's allocator reuses the memory only
                # after their work on it. CPU calls return when done.
                del _workspaces[device]
    AttentionInterface.register("splitkv", paged_attention_forward)
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION


def workspace_for(device):
    """The splitkv Workspace that serves ``device`` (made, zeroed, on first use).

    One per device for the whole process, until :func:`register` with another
    ``workspace_bytes`` replaces it (ask again afterwards: the one returned before no longer
    serves the adapter's calls). transformers runs one generation thread per manager, and
    managers generating at once on one device (two threads' generate_batch, or two models)
    take turns on it: the adapter holds a per-device lock around each of its splitkv calls.
    A caller running splitkv on this workspace itself must not do so while a manager
    generates (splitkv refuses the second concurrent call, ValueError "workspace in use")."""
    return _workspace_and_lock(device)[0]


def _workspace_and_lock(device):
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _workspaces_lock:
        entry = _workspaces.get(device)
        if entry is None:
            entry = (splitkv.Workspace(_workspace_bytes, device), threading.Lock())
            _workspaces[device] = entry
        return entry


def _use_stream(workspace, device):
    """Tells torch's allocator that the current stream of CUDA ``device`` uses the memory of
    ``workspace`` (``Tensor.record_stream``, once a stream). When register() drops the
    workspace and its last holder lets it go, the allocator hands the memory out again only
    after the work each recorded stream had enqueued by then: freed without it, the next
    allocation on the stream that made the workspace (the new workspace's zero fill, say)
    could take the memory while a kernel another thread enqueued on its own stream still
    reads it."""
    stream = workspace_module.current_raw_stream(device.index)
    used = _streams_used.setdefault(workspace, set())
    if stream not in used:
        workspace.tensor.record_stream(torch.cuda.current_stream(device))
        used.add(stream)


def _refuse(what, expected, got, error=ValueError):
    raise error(f"{_OP}: {what}: expected {expected}, got {got}")


def _sinks(module, kwargs):
    """The layer's attention sinks as splitkv takes them (float32 ``[num_qo_heads]``), or None.

    gpt-oss passes its per-head sink logits as ``s_aux`` (``module.sinks``); transformers'
    paged eager path adds them to every softmax row of the layer, full and sliding layers
    alike, which is splitkv's ``sinks`` (one extra logit per row, no value). Converted on
    the device (no host sync); a float32 parameter is used as it is.
    """
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = getattr(module, "sinks", None)
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        # Refused, not converted (docs/bad_inputs.md): an int sink would change the softmax.
        _refuse("sinks dtype unsupported", "a floating-point tensor (s_aux / module.sinks)",
                sinks.dtype if isinstance(sinks, torch.Tensor) else type(sinks).__name__, TypeError)
    return sinks.detach().to(torch.float32).contiguous()


def _layer_window(module, kwargs):
    """(layer type, window_left): transformers' sliding_window W lets a token see itself
    and the W - 1 before it."""
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    if window is None or window is False or (not isinstance(window, torch.Tensor) and window == 0):
        # transformers' "no window"
        return "full_attention", -1
    # 1 (a token sees only itself) is refused too: transformers' paged cache takes a layer
    # whose sliding window is 1 for a full-attention one (cache.py, transformers 5.17), so its
    # decode steps would hand this layer every cached key, not the window's.
    # An int or numpy integer, as splitkv's own int options; never a bool or a tensor (not read).
    value = None
    if not isinstance(window, (bool, torch.Tensor)) and type(window).__name__ != "bool_":
        try:
            value = operator.index(window)
        except TypeError:
            value = None
    if value is None or value < 2:
        _refuse("sliding_window unsupported", "None, 0 (no window) or an int >= 2 (a token "
                "sees itself and the sliding_window - 1 before it; transformers' paged cache "
                "reads 1 as no window)", repr(window))
    return "sliding_attention", value - 1


def _cache_layer_type(cache, layer_idx, layer_type, window_left):
    """The layer type of transformers' paged cache for this layer ("sliding_attention" when
    it keeps a rolling window, read through cache.update; "full_attention" when its keys
    are in logical order, read as pages), which also names the layer's cu_seq_lens_k.

    The cache takes it from the config (config.layer_types, else every layer sliding when
    config.sliding_window is set), the attention layer's window from the module: a layer
    without a window (or with a wider one) over a cache that keeps a window lacks keys, and
    is refused; a windowed layer over a full cache reads its pages with window_left.
    """
    cache_window = getattr(cache, "sliding_windows", {}).get(layer_idx)
    if cache_window is None:  # not transformers' PagedAttentionCache: the module decides
        return layer_type
    if cache_window == 1:  # transformers' "no window"
        return "full_attention"
    if window_left < 0 or window_left > cache_window - 1:
        _refuse(f"layer {layer_idx} window wider than the paged cache's",
                f"at most the sliding_window of {cache_window} that transformers' paged cache keeps "
                "for this layer (config.sliding_window / config.layer_types); a config that sets "
                "sliding_window for a model whose attention has none makes the cache drop keys "
                "the layer reads: set config.sliding_window = None",
                "no window" if window_left < 0 else f"sliding_window {window_left + 1}")
    return "sliding_attention"


def _block_tables(cache, group, read_index, cu_seqlens_kv, max_seqlen_kv):
    """Block tables [batch_size, max_pages_per_seq] int32 and seq_lens [batch_size] int32 of
    a full-attention group, read off transformers' read_index on the device.

    For such a group read_index lists, request after request (request b from
    cu_seqlens_kv[b]), the physical slot of each of its tokens in logical order: token j
    of a request is at page_of_j * block_size + j % block_size. So page p of request b is
    read_index[cu_seqlens_kv[b] + p * block_size] // block_size. Entries past a request's
    last page point at some other valid page (clamped): paged_attention never reads them.
    """
    try:
        memos = _block_tables_memo.setdefault(cache, {})
    except TypeError:  # a cache object that takes no weak reference: no memo
        memos = {}
    memo = memos.get(group)
    if memo is not None and memo[0]() is read_index and memo[1]() is cu_seqlens_kv:
        return memo[2], memo[3]
    block_size = cache.block_size
    max_pages = max(1, math.ceil(max_seqlen_kv / block_size))
    starts = cu_seqlens_kv[:-1].to(torch.int64)
    offsets = torch.arange(0, max_pages * block_size, block_size, device=starts.device)
    slots = (starts[:, None] + offsets[None, :]).clamp_(max=read_index.numel() - 1)
    block_tables = torch.div(read_index[slots], block_size, rounding_mode="floor").to(torch.int32)
    seq_lens = (cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]).to(torch.int32)
    memos[group] = (weakref.ref(read_index), weakref.ref(cu_seqlens_kv), block_tables, seq_lens)
    return block_tables, seq_lens


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                            **kwargs):
    """transformers' paged attention function, computed by splitkv.

    Called by the attention layers of a model whose ``attn_implementation`` is
    ``"paged|splitkv"``, inside transformers' continuous batching: the batch is one packed
    sequence of ``total_q`` new tokens from several requests.

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer: ``layer_idx``, optional ``sliding_window`` (None, or an int or numpy integer) and
        ``sinks`` (gpt-oss).
    query : torch.Tensor
        ``[1, num_qo_heads, total_q, head_dim]``, the model's dtype (float32, float16 or
        bfloat16 on the CPU; bfloat16/float16 on CUDA).
    key, value : torch.Tensor
        ``[1, num_kv_heads, total_q, head_dim]``: the new tokens' keys and values, written
        into ``cache`` here (after the checks below: a refused call writes nothing).
    attention_mask : None
        Unused: splitkv masks from the sequence lengths (causal, aligned to the end of
        each request's keys, plus the layer's window).
    scaling : float, optional
        ``sm_scale``; default ``1 / sqrt(head_dim)``.
    dropout : float, default 0.0
        Must be 0 (inference only).
    **kwargs
        From continuous batching: ``cache`` (``PagedAttentionCache``), ``cu_seq_lens_q``
        ``[batch_size + 1]`` int32, ``cu_seq_lens_k`` (int32 tensor, or a dict by layer
        type), ``max_seqlen_q`` (int), ``max_seqlen_k`` (int or dict), ``read_index`` and
        ``write_index`` (int64, one per layer group), ``block_table`` (must be None);
        optional ``sliding_window`` (window_left = sliding_window - 1), ``softcap`` (logit
        soft cap), ``s_aux`` (attention sinks, ``[num_qo_heads]``, any float dtype, an integer
        one refused (TypeError); else
        ``module.sinks`` when the layer has it).

    Returns
    -------
    out : torch.Tensor
        ``[1, total_q, num_qo_heads, head_dim]``, query's dtype. Inference only: no
        autograd graph is recorded (a query that requires grad gives an out that does not).
    weights : None

    Raises
    ------
    ValueError
        No paged cache (a forward outside continuous batching), one of the keywords above
        that continuous batching always passes missing, dropout != 0, a decode
        fast-path block table, a padded batch (CUDA graphs), query / key / value not
        ``[1, heads, total_q, head_dim]`` (key and value of one shape, query's total_q and
        head_dim, num_qo_heads a multiple of num_kv_heads), a sliding_window that is not None, 0 or an int
        >= 2 (transformers' paged cache reads 1 as no window), a layer whose window is
        wider than the one the paged cache keeps for it (no window over a sliding cache
        group: a config's stray ``sliding_window``), or any of splitkv's own refusals
        (dtype, head_dim, ...).
    """
    cache = kwargs.get("cache")
    if cache is None:
        _refuse("cache missing", "a call from transformers' continuous batching (generate_batch "
                "or init_continuous_batching), which passes its PagedAttentionCache",
                "no cache; use attn_implementation='sdpa' for a plain forward")
    if dropout:
        _refuse("dropout unsupported", "0.0 (inference)", repr(dropout))
    if kwargs.get("block_table") is not None:
        _refuse("block_table unsupported", "None (transformers' decode fast path is for flash "
                "attention; set max_blocks_per_request=0)", "a block table")
    for name in _REQUIRED_KWARGS:
        if name not in kwargs:
            _refuse(f"{name} missing", "the keyword transformers' continuous batching passes "
                    f"({', '.join(_REQUIRED_KWARGS)})", "a call without it")
    sinks = _sinks(module, kwargs)
    layer_type, window_left = _layer_window(module, kwargs)
    layer_type = _cache_layer_type(cache, module.layer_idx, layer_type, window_left)
    cu_seqlens_q = kwargs["cu_seq_lens_q"]
    cu_seqlens_kv, max_seqlen_kv = kwargs["cu_seq_lens_k"], kwargs["max_seqlen_k"]
    if isinstance(cu_seqlens_kv, dict):
        cu_seqlens_kv, max_seqlen_kv = cu_seqlens_kv[layer_type], max_seqlen_kv[layer_type]
    max_q_len = max(1, int(kwargs["max_seqlen_q"]))
    soft_cap = kwargs.get("softcap") or 0.0

    group, layer_in_group = cache.layer_index_to_group_indices[module.layer_idx]
    read_index, write_index = kwargs["read_index"][group], kwargs["write_index"][group]
    # Continuous batching packs every request into one sequence: a batch dimension of 1.
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[0] != 1:
            _refuse(f"{name} shape unsupported", "[1, heads, total_q, head_dim] (continuous "
                    "batching's packed batch)", tuple(x.shape) if isinstance(x, torch.Tensor)
                    else type(x).__name__)
    # Checked before the cache is written: index_copy_ would raise a raw IndexError or
    # RuntimeError, or write the cache and leave the refusal to splitkv.
    if value.shape != key.shape:
        _refuse("value shape mismatch", f"{tuple(key.shape)} (the shape of key)", tuple(value.shape))
    if key.shape[2] != query.shape[2] or key.shape[3] != query.shape[3]:
        _refuse("key shape mismatch", f"[1, num_kv_heads, {query.shape[2]}, {query.shape[3]}] "
                "(query's total_q and head_dim)", tuple(key.shape))
    if query.shape[1] % key.shape[1] != 0:
        _refuse("num_qo_heads is not a multiple of num_kv_heads",
                f"a multiple of {key.shape[1]} (key.shape[1])", query.shape[1])
    for name, x in (("key", key), ("value", value)):
        if x.dtype != query.dtype:
            _refuse(f"{name} dtype mismatch", f"{query.dtype} (query's dtype)", x.dtype, TypeError)
        if x.device != query.device:
            _refuse(f"{name} device mismatch", f"{query.device} (query's device)", x.device)
    # [1, heads, tokens, head_dim] -> [tokens, heads, head_dim] views (dense head_dim).
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    if write_index.numel() != k.shape[0]:
        _refuse("write_index size mismatch", f"{k.shape[0]} (one slot per new token; padded "
                "batches for CUDA graphs are not supported)", write_index.numel())
    workspace, lock = _workspace_and_lock(q.device)
    if q.device.type == "cuda":
        _use_stream(workspace, q.device)
    options = dict(sm_scale=scaling, causal=True, window_left=window_left,
                   logits_soft_cap=float(soft_cap), max_q_len=max_q_len, sinks=sinks)

    if read_index.numel() == 0:
        # Fresh prompts only: their keys are exactly the new ones.
        k_cache, v_cache = cache.key_cache[layer_in_group], cache.value_cache[layer_in_group]
        k_cache.index_copy_(0, write_index, k)
        v_cache.index_copy_(0, write_index, v)
        with lock:
            out = splitkv.ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, **options)
    elif layer_type == "full_attention":
        k_cache, v_cache = cache.key_cache[layer_in_group], cache.value_cache[layer_in_group]
        k_cache.index_copy_(0, write_index, k)
        v_cache.index_copy_(0, write_index, v)
        block_tables, seq_lens = _block_tables(cache, group, read_index, cu_seqlens_kv,
                                               max_seqlen_kv)
        pages = (-1, cache.block_size, cache.num_key_value_heads, cache.head_dim)
        with lock:
            out = splitkv.paged_attention(q, (k_cache.view(pages), v_cache.view(pages)),
                                          block_tables, seq_lens, workspace,
                                          cu_seqlens_q=cu_seqlens_q, kv_layout="NHD", **options)
    else:
        # The rolling buffer of a sliding layer is not in logical order: transformers
        # gathers each request's window (and writes the new keys) in cache.update.
        k_window, v_window = cache.update(key, value, module.layer_idx, read_index=kwargs["read_index"],
                                          write_index=kwargs["write_index"])
        with lock:
            out = splitkv.ragged_attention(q, k_window, v_window, cu_seqlens_q, cu_seqlens_kv,
                                           workspace, **options)
    return out.unsqueeze(0), None
