"""The kernels serving engines use instead of splitkv: FlashInfer and FlashAttention-3,
timed on the same inputs as splitkv when their packages import (issue 18).

Each prepare function follows peers.py's contract (a Prepared whose `calls` are timed and
whose `check` gives `[total_q, num_qo_heads, head_dim]`; Skip when it does not apply).
Plans, wrappers, page lists and workspaces are made in the prepare function, outside the
timing; a call is what a serving step runs per layer (a wrapper's `run()`, or the function).

FlashInfer compiles a kernel module the first time a configuration is used unless its wheel
carries it prebuilt (minutes each, and nvcc). The bench sets FLASHINFER_DISABLE_JIT=1 before
importing it (unless --flashinfer_jit), so a configuration without a prebuilt module is a
skipped row naming that module, not a silent compile inside the run.
"""

import functools
import importlib
import importlib.metadata
import math
import os

import torch

from tools.bench import inputs
from tools.bench import peers

WORKSPACE_BYTES = 256 << 20  # FlashInfer's float workspace (split-KV partials); 128 MiB advised
XQA_WORKSPACE_BYTES = 256 << 20  # XQA: 8 MiB of semaphores (zeroed) then scratch

_WORKSPACES = {}


def _first_line(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:240]


@functools.lru_cache(maxsize=None)
def _import(name):
    """(module, None), or (None, why it does not import)."""
    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001 - a broken install is a reason to skip, not to stop
        return None, f"import {name} failed: {_first_line(e)}"


def _require(ctx, package, dtype, dtypes):
    if ctx.device.type != "cuda":
        raise peers.Skip(f"{package} runs on CUDA only")
    if not ctx.serving_peers:
        raise peers.Skip("--noserving_peers")
    if dtype not in dtypes:
        raise peers.Skip(f"{package} takes {'/'.join(str(d).replace('torch.', '') for d in dtypes)} "
                         f"here, not {str(dtype).replace('torch.', '')}")


def _flashinfer(ctx, dtype):
    _require(ctx, "FlashInfer", dtype, (torch.float16, torch.bfloat16))
    if not ctx.flashinfer_jit:
        os.environ["FLASHINFER_DISABLE_JIT"] = "1"  # read when a module is looked up
    else:
        os.environ.pop("FLASHINFER_DISABLE_JIT", None)
    module, why = _import("flashinfer")
    if module is None:
        raise peers.Skip(why)
    return module


def _fa3(ctx, dtype, head_dim):
    """flash_attn_interface (FlashAttention-3's hopper/ build), if this build has dtype and
    head_dim (its flash_attn_config says which it left out)."""
    _require(ctx, "FlashAttention-3", dtype, (torch.float16, torch.bfloat16))
    if torch.cuda.get_device_capability(ctx.device)[0] < 9:
        raise peers.Skip("FlashAttention-3 needs sm_90 or newer")
    module, why = _import("flash_attn_interface")
    if module is None:
        raise peers.Skip(why)
    config, _ = _import("flash_attn_config")
    flags = (getattr(config, "CONFIG", {}) or {}).get("build_flags", {}) if config else {}
    disabled = [name for name in (f"FLASHATTENTION_DISABLE_HDIM{head_dim}",
                                  "FLASHATTENTION_DISABLE_FP16" if dtype == torch.float16 else "")
                if name and flags.get(name)]
    if disabled:
        raise peers.Skip(f"this FlashAttention-3 build has {', '.join(disabled)} "
                         f"(head_dim {head_dim}, {str(dtype).replace('torch.', '')})")
    return module


def versions():
    """{package: version, or why it does not import} for the run's metadata."""
    found = {}
    for package, module in (("flashinfer-python", "flashinfer"), ("flash_attn_3", "flash_attn_interface")):
        imported, why = _import(module)
        if imported is None:
            found[package] = why
            continue
        try:
            found[package] = importlib.metadata.version(package)
        except Exception:  # noqa: BLE001 - no dist-info (a source tree on the path)
            found[package] = getattr(imported, "__version__", "unknown version")
    return found


def _workspace(ctx, kind, nbytes):
    """One zeroed buffer per kind, kept for the run (as splitkv's one workspace)."""
    key = (kind, str(ctx.device))
    if key not in _WORKSPACES:
        _WORKSPACES[key] = torch.zeros(nbytes, dtype=torch.uint8, device=ctx.device)
    return _WORKSPACES[key]


def _missing_module(e):
    """The name of the FlashInfer module a MissingJITCacheError (anywhere in e's chain)
    asked for, or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ == "MissingJITCacheError":
            spec = getattr(e, "spec", None)
            return getattr(spec, "name", None) or "?"
        e = e.__cause__ or e.__context__
    return None


def _flashinfer_guard(make):
    """prepare functions whose FlashInfer module is not prebuilt raise Skip, not an error."""

    @functools.wraps(make)
    def prepare(ctx, copies):
        try:
            return make(ctx, copies)
        except peers.Skip:
            raise
        except Exception as e:
            name = _missing_module(e)
            if name is None:
                raise
            raise peers.Skip(f"FlashInfer JIT module not prebuilt in this wheel ({name}); "
                             "--flashinfer_jit compiles it (minutes, needs nvcc)") from None

    return prepare


# ---- paged decode (the same paged caches splitkv reads) ----


def _page_geometry(ctx, p):
    """(page_size, pages used per request as a list)."""
    page_size = p.kv_cache.shape[3] if ctx.kv_layout == "HND" else p.kv_cache.shape[2]
    lens = p.seq_lens.tolist()
    return page_size, [max(1, -(-n // page_size)) for n in lens], lens


def _csr_pages(ctx, p):
    """FlashInfer's page lists: indptr [batch+1], indices [pages], last_page_len [batch]."""
    page_size, used, lens = _page_geometry(ctx, p)
    device = p.block_tables.device
    indices = torch.cat([p.block_tables[b, :n] for b, n in enumerate(used)])
    indptr = inputs.cu_seqlens(used, device)
    last = torch.tensor([n - (m - 1) * page_size for n, m in zip(lens, used)], dtype=torch.int32,
                        device=device)
    return page_size, indptr, indices.contiguous(), last


def _prepared_into(outs, call, variant, canon=lambda out: out):
    """Prepared calls i = 0 .. len(outs) - 1 that write into the preallocated outs[i]; the
    accuracy check first poisons outs[0] with NaN, so an element left unwritten fails it
    (canon: the output to the bench's [total, heads, d] layout)."""

    def check():
        outs[0].fill_(float("nan"))
        return canon(call(0))

    return peers.Prepared([lambda i=i: call(i) for i in range(len(outs))], check, variant)


def _planned_per_copy(ctx, paged, plan):
    """One FlashInfer wrapper per paged input copy (each copy has its own page table), made
    and planned by plan(workspace, copy, page_size, indptr, indices, last_page_len) on the
    shared workspace, and an output buffer per copy."""
    workspace = _workspace(ctx, "flashinfer", WORKSPACE_BYTES)
    wrappers = [plan(workspace, p, *_csr_pages(ctx, p)) for p in paged]
    return wrappers, [torch.empty_like(p.q) for p in paged]


def flashinfer_decode(tensor_cores, kv_scale=None):
    """BatchDecodeWithPagedKVCacheWrapper (FA2 decode; tensor_cores: its prefill-kernel
    decode): one wrapper planned per input copy (each copy has its own page table);
    kv_scale: k_scale = v_scale of an fp8 cache."""

    def make(ctx, paged):
        fi = _flashinfer(ctx, paged[0].q.dtype)
        case = ctx.case

        def plan(workspace, p, page_size, indptr, indices, last):
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout=ctx.kv_layout,
                                                            use_tensor_cores=tensor_cores)
            wrapper.plan(indptr, indices, last, case.num_qo_heads, case.num_kv_heads, case.head_dim,
                         page_size, q_data_type=p.q.dtype, kv_data_type=p.kv_cache.dtype)
            return wrapper

        wrappers, outs = _planned_per_copy(ctx, paged, plan)

        scales = {} if kv_scale is None else dict(k_scale=kv_scale, v_scale=kv_scale)

        def call(i):
            return wrappers[i].run(paged[i].q, paged[i].kv_cache, out=outs[i], **scales)

        backend = getattr(wrappers[0], "resolved_backend", "")
        variant = ("tensor cores" if tensor_cores else "CUDA cores") + \
            (f", backend {backend}" if isinstance(backend, str) and backend else "")
        return _prepared_into(outs, call, variant)

    return _flashinfer_guard(make)


@_flashinfer_guard
def flashinfer_xqa(ctx, paged):
    """trtllm_batch_decode_with_kv_cache (XQA on sm_90): block tables and seq_lens as splitkv
    takes them; its workspace zeroed once (XQA's semaphores reset themselves)."""
    p0 = paged[0]
    fi = _flashinfer(ctx, p0.q.dtype)
    case = ctx.case
    workspace = _workspace(ctx, "xqa", XQA_WORKSPACE_BYTES)
    scale = 1.0 / math.sqrt(case.head_dim)
    outs = [torch.empty_like(p.q) for p in paged]
    max_len = max(int(p.seq_lens.max()) for p in paged)
    # Not re-exported at the top of flashinfer 0.7.2: flashinfer.decode holds it.
    decode = getattr(fi, "trtllm_batch_decode_with_kv_cache", None) or \
        importlib.import_module("flashinfer.decode").trtllm_batch_decode_with_kv_cache

    def make(lens_of):
        def call(i):
            p = paged[i]
            return decode(
                p.q, p.kv_cache, workspace, p.block_tables, lens_of(p), max_len, bmm1_scale=scale,
                bmm2_scale=1.0, out=outs[i], kv_layout=ctx.kv_layout, backend="xqa")
        return call, lambda out: out

    variant, call, canon = peers.first_working([
        ("xqa, seq_lens int32", lambda: make(lambda p: p.seq_lens)),
        ("xqa, seq_lens as uint32", lambda: make(lambda p: p.seq_lens.view(torch.uint32)))])

    return _prepared_into(outs, call, variant, canon)


def _nhd_views(ctx, kv_cache):
    """K and V caches as [pages, page_size, kv_heads, head_dim] views of the cache (HND:
    strided, no copy)."""
    if ctx.kv_layout == "HND":
        return kv_cache[:, 0].transpose(1, 2), kv_cache[:, 1].transpose(1, 2)
    return kv_cache[:, 0], kv_cache[:, 1]


def _fa3_caches(ctx, paged, layout):
    """Each copy's (k_cache, v_cache) as FA3 reads them: "views" (_nhd_views: strided for
    HND, no copy) or "copy" (contiguous NHD copies, made beforehand)."""
    if layout == "views":
        return [_nhd_views(ctx, p.kv_cache) for p in paged]
    return [tuple(x.contiguous() for x in _nhd_views(ctx, p.kv_cache)) for p in paged]


def _fa3_fallbacks(ctx, make):
    """FA3's variants in the order tried (peers.first_working): the cache's own pages with
    scheduler metadata planned, the same with metadata per call, K/V copied to contiguous NHD.
    make(layout, planned) returns (call for copy i, to-canonical)."""
    layout_name = "HND pages as strided views" if ctx.kv_layout == "HND" else "NHD pages"
    return [(f"{layout_name}, scheduler metadata planned", lambda: make("views", True)),
            (f"{layout_name}, metadata per call", lambda: make("views", False)),
            ("K/V copied to contiguous NHD beforehand, metadata per call", lambda: make("copy", False))]


def fa3_decode(ctx, paged):
    """flash_attn_with_kvcache on the paged cache (split-KV and PackGQA by FA3's heuristic),
    its scheduler metadata computed beforehand (as vLLM does) where the call accepts it."""
    p0 = paged[0]
    fa3 = _fa3(ctx, p0.q.dtype, p0.q.shape[-1])
    case = ctx.case
    page_size, _, _ = _page_geometry(ctx, p0)
    max_len = max(int(p.seq_lens.max()) for p in paged)

    def make(layout, planned):
        caches = _fa3_caches(ctx, paged, layout)
        metadata = [None] * len(paged)
        if planned:
            metadata = [fa3.get_scheduler_metadata(
                p.q.shape[0], 1, max_len, case.num_qo_heads, case.num_kv_heads, case.head_dim,
                p.seq_lens, qkv_dtype=p.q.dtype, page_size=page_size) for p in paged]

        def call(i):
            p = paged[i]
            k_cache, v_cache = caches[i]
            return fa3.flash_attn_with_kvcache(p.q.unsqueeze(1), k_cache, v_cache,
                                               cache_seqlens=p.seq_lens, page_table=p.block_tables,
                                               scheduler_metadata=metadata[i])
        return call, lambda out: out.squeeze(1)

    variant, call, canon = peers.first_working(_fa3_fallbacks(ctx, make))
    return peers.prepared_calls(paged, call, canon, variant)


def paged_decode_peers():
    return [("flashinfer fa2", flashinfer_decode(False)),
            ("flashinfer fa2 tc", flashinfer_decode(True)),
            ("flashinfer xqa", flashinfer_xqa),
            ("fa3", fa3_decode)]


# ---- ragged prefill ([total, heads, d] packed, as splitkv's ragged_attention) ----


def flashinfer_prefill(backend):
    """BatchPrefillWithRaggedKVCacheWrapper, backend "fa2" or "fa3" (its sm_90 kernel):
    planned once (every copy has the same lengths)."""

    def make(ctx, copies):
        c0 = copies[0]
        fi = _flashinfer(ctx, c0.q.dtype)
        case = ctx.case
        cu = inputs.cu_seqlens(case.lengths, ctx.device)
        wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(
            _workspace(ctx, "flashinfer", WORKSPACE_BYTES), kv_layout="NHD", backend=backend)
        wrapper.plan(cu, cu, case.num_qo_heads, case.num_kv_heads, case.head_dim,
                     causal=case.causal, q_data_type=c0.q.dtype, kv_data_type=c0.k.dtype)
        outs = [torch.empty_like(c.q) for c in copies]

        def call(i):
            c = copies[i]
            return wrapper.run(c.q, c.k, c.v, out=outs[i])

        return _prepared_into(outs, call, f"ragged, backend {backend}")

    return _flashinfer_guard(make)


def fa3_prefill(ctx, copies):
    """flash_attn_varlen_func on the packed ragged batch."""
    fa3 = _fa3(ctx, copies[0].q.dtype, copies[0].q.shape[-1])
    case = ctx.case
    cu = inputs.cu_seqlens(case.lengths, ctx.device)
    longest = max(case.lengths)

    def call(i):
        c = copies[i]
        return fa3.flash_attn_varlen_func(c.q, c.k, c.v, cu, cu, longest, longest, causal=case.causal)

    return peers.prepared_calls(copies, call, lambda out: out, "varlen")


def prefill_peers():
    return [("flashinfer fa2", flashinfer_prefill("fa2")),
            ("flashinfer sm90", flashinfer_prefill("fa3")),
            ("fa3", fa3_prefill)]


# ---- paged prefill (inputs.PagedPrefillCopy: each prompt one chunk over the paged cache) ----


def flashinfer_paged_prefill(backend):
    """BatchPrefillWithPagedKVCacheWrapper, backend "fa2" or "fa3" (its sm_90 kernel), in the
    cache's own kv_layout: one wrapper per input copy (each copy has its own block_tables),
    planned once with qo_indptr = cu_seqlens_q and the copy's page lists (_csr_pages)."""

    def make(ctx, paged):
        fi = _flashinfer(ctx, paged[0].q.dtype)
        case = ctx.case

        def plan(workspace, p, page_size, indptr, indices, last):
            wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout=ctx.kv_layout,
                                                             backend=backend)
            wrapper.plan(p.cu_seqlens_q, indptr, indices, last, case.num_qo_heads, case.num_kv_heads,
                         case.head_dim, page_size, causal=case.causal, q_data_type=p.q.dtype,
                         kv_data_type=p.kv_cache.dtype)
            return wrapper

        wrappers, outs = _planned_per_copy(ctx, paged, plan)

        def call(i):
            return wrappers[i].run(paged[i].q, paged[i].kv_cache, out=outs[i])

        return _prepared_into(outs, call, f"paged {ctx.kv_layout}, backend {backend}")

    return _flashinfer_guard(make)


def fa3_paged_prefill(ctx, paged):
    """flash_attn_with_kvcache with q packed [total_q, heads, d] (cu_seqlens_q, max_seqlen_q),
    page_table = block_tables, cache_seqlens = seq_lens and the case's causal; the cache and
    the fallbacks as fa3_decode (HND pages as strided NHD views; scheduler metadata planned
    beforehand where the call accepts it)."""
    p0 = paged[0]
    fa3 = _fa3(ctx, p0.q.dtype, p0.q.shape[-1])
    case = ctx.case
    page_size, _, _ = _page_geometry(ctx, p0)
    max_seqlen_q = max(case.lengths)

    def make(layout, planned):
        caches = _fa3_caches(ctx, paged, layout)
        metadata = [None] * len(paged)
        if planned:
            metadata = [fa3.get_scheduler_metadata(
                len(case.lengths), max_seqlen_q, int(p.seq_lens.max()), case.num_qo_heads,
                case.num_kv_heads, case.head_dim, p.seq_lens, qkv_dtype=p.q.dtype,
                cu_seqlens_q=p.cu_seqlens_q, page_size=page_size, causal=case.causal) for p in paged]

        def call(i):
            p = paged[i]
            k_cache, v_cache = caches[i]
            return fa3.flash_attn_with_kvcache(p.q, k_cache, v_cache, cache_seqlens=p.seq_lens,
                                               page_table=p.block_tables, cu_seqlens_q=p.cu_seqlens_q,
                                               max_seqlen_q=max_seqlen_q, causal=case.causal,
                                               scheduler_metadata=metadata[i])
        return call, lambda out: out

    variant, call, canon = peers.first_working(_fa3_fallbacks(ctx, make))
    return peers.prepared_calls(paged, call, canon, variant)


def paged_prefill_peers():
    return [("flashinfer fa2 paged", flashinfer_paged_prefill("fa2")),
            ("flashinfer sm90 paged", flashinfer_paged_prefill("fa3")),
            ("fa3 paged", fa3_paged_prefill)]
