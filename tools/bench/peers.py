"""The implementations the bench times: splitkv and its peers, each prepared on the same
input copies.

A prepare function returns a Prepared: `calls` (one per input copy, what is timed) and
`check` (runs on copy 0 once, outside the timing, and returns the output as
`[total_q, num_qo_heads, head_dim]` for the correctness check). It raises Skip when the
peer does not apply here; any other exception is reported as that row's error.
"""

import contextlib
import dataclasses
import importlib
import inspect
import time
import typing

import torch
import torch.nn.functional as F

import splitkv
from tools.bench import inputs


class Skip(Exception):
    """This implementation does not run here (absent, unsupported, over a limit)."""


@dataclasses.dataclass
class Prepared:
    calls: list
    check: typing.Callable
    variant: str = ""
    num_splits: typing.Optional[int] = None
    setup_s: float = 0.0  # first-call time (torch.compile of flex_attention)


def _backend_context(backend):
    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, backend))


def first_working(variants):
    """The first (variant name, call for copy, to-canonical) whose call on copy 0 runs;
    raises the last error when none does."""
    error = None
    for name, make in variants:
        try:
            call, canon = make()
            canon(call(0))
            return name, call, canon
        except Exception as e:  # noqa: BLE001 - try the next variant, keep the reason
            error = e
    raise error


def prepared_calls(copies, call, canon, variant, **kwargs):
    return Prepared([lambda i=i: call(i) for i in range(len(copies))], lambda: canon(call(0)),
                    variant, **kwargs)


# ---- decode over contiguous KV ([batch, kv heads, kv_len, d]) ----


def sdpa_decode(backend):
    """SDPA on contiguous KV with enable_gqa; if the backend refuses GQA, the query heads of
    each KV head folded into the query length (q_len = group, no mask: the same math)."""

    def prepare(ctx, copies):
        def gqa():
            def call(i):
                c = copies[i]
                with _backend_context(backend):
                    return F.scaled_dot_product_attention(c.q.unsqueeze(2), c.k, c.v, enable_gqa=True)
            return call, lambda out: out.squeeze(2)

        def folded():
            def call(i):
                c = copies[i]
                batch, _, head_dim = c.q.shape
                q = c.q.view(batch, c.k.shape[1], -1, head_dim)
                with _backend_context(backend):
                    return F.scaled_dot_product_attention(q, c.k, c.v)
            return call, lambda out: out.reshape(out.shape[0], -1, out.shape[-1])

        variant, call, canon = first_working([("enable_gqa", gqa), ("q heads folded", folded)])
        return prepared_calls(copies, call, canon, variant)

    return prepare


_FLEX = {}


def flex_decode(ctx, copies):
    """flex_attention compiled (no mask, enable_gqa); every new shape recompiles, so the
    compile time is budgeted (--flex_compile_budget_s)."""
    if not ctx.flex:
        raise Skip("--noflex")
    if ctx.flex_spent_s >= ctx.flex_compile_budget_s:
        raise Skip(f"flex compile budget spent ({ctx.flex_spent_s:.0f} s of "
                   f"{ctx.flex_compile_budget_s:.0f} s)")
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention
        for name in ("cache_size_limit", "recompile_limit"):  # one shape per case: no limit hit
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False) if ctx.flex_compile else flex_attention
    flex = _FLEX["fn"]

    def call(i):
        c = copies[i]
        return flex(c.q.unsqueeze(2), c.k, c.v, enable_gqa=True)

    start = time.perf_counter()
    try:
        call(0)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
    finally:
        ctx.flex_spent_s += time.perf_counter() - start
    setup_s = time.perf_counter() - start
    variant = (f"compiled, first call {setup_s:.1f} s" if ctx.flex_compile else "eager")
    return prepared_calls(copies, call, lambda out: out.squeeze(2), variant, setup_s=setup_s)


# ---- decode over the paged cache ----


# Options a runner's run takes (the layer's own tensors); the rest are bound when it is made.
_RUN_OPTIONS = ("sinks", "k_scale", "v_scale")


def _bind(op, workspace, args, options):
    """op(*args, workspace, out=out, **options) as a call of out, through op's runner
    (splitkv.PagedAttentionRunner / RaggedAttentionRunner): bitwise op's result, with the index
    tensors, workspace and options bound once, as FlashInfer's rows call run() after plan()."""
    run_options = {k: v for k, v in options.items() if k in _RUN_OPTIONS}
    bound = {k: v for k, v in options.items() if k not in _RUN_OPTIONS}
    if op is splitkv.paged_attention:
        q, kv_cache, block_tables, seq_lens = args
        runner = splitkv.PagedAttentionRunner(workspace, block_tables, seq_lens, **bound)
        return lambda out: runner.run(q, kv_cache, out=out, **run_options)
    q, k, v, cu_seqlens_q, cu_seqlens_kv = args
    runner = splitkv.RaggedAttentionRunner(workspace, cu_seqlens_q, cu_seqlens_kv, **bound)
    return lambda out: runner.run(q, k, v, out=out, **run_options)


def _splitkv_prepared(ctx, copies, op, plan_op, args, options, variant="planned"):
    """A splitkv row's calls over its input copies: op(*args(copy), workspace, out=its own out,
    **options(copy)) each, through op's runner (_bind), planned once on copy 0 for the row's
    num_splits; check() poisons copy 0's out with NaN first, so every element must be
    written."""
    outs = [torch.empty_like(c.q) for c in copies]
    calls = [_bind(op, ctx.workspace, args(c), options(c)) for c in copies]

    def call(i):
        return calls[i](outs[i])

    try:
        plan = plan_op(*args(copies[0]), ctx.workspace, out=outs[0], **options(copies[0]))
    except ValueError as e:
        # batch_invariant calls whose split CTAs need every split's partials (decode tiles,
        # head_dim 256) may not fit the bench's one workspace: a skipped row, with the reason.
        if options(copies[0]).get("batch_invariant") and "workspace too small" in str(e):
            raise Skip(f"batch_invariant: {e}") from None
        raise

    def check():
        outs[0].fill_(float("nan"))  # every element must be written
        return call(0)

    return Prepared([lambda i=i: call(i) for i in range(len(copies))], check, variant,
                    num_splits=plan.num_splits)


def _scale_options(kv_scale):
    """k_scale = v_scale = kv_scale for an fp8 cache; nothing for None."""
    return {} if kv_scale is None else dict(k_scale=kv_scale, v_scale=kv_scale)


def _paged_args(p):
    return p.q, p.kv_cache, p.block_tables, p.seq_lens


def splitkv_paged(num_splits=None, kv_scale=None, sinks=None, batch_invariant=False):
    """splitkv's paged decode; kv_scale: k_scale = v_scale of an fp8 cache; sinks: a
    [num_qo_heads] tensor; batch_invariant: the bitwise batch-invariant mode."""

    def prepare(ctx, paged):
        options = dict(kv_layout=ctx.kv_layout, max_q_len=1, num_splits=num_splits,
                       **_scale_options(kv_scale))
        if batch_invariant:
            options.update(batch_invariant=True)
        if sinks is not None:
            options.update(sinks=sinks)
        return _splitkv_prepared(ctx, paged, splitkv.paged_attention, splitkv.plan_paged_attention,
                                 _paged_args, lambda p: options,
                                 "planned" if num_splits is None else f"forced {num_splits}")

    return prepare


def gather_sdpa(ctx, paged):
    """Gather the pages into contiguous KV, then SDPA (default backend choice, enable_gqa)."""
    kv_len = ctx.case.kv_len
    nbytes = inputs.kv_bytes(ctx.case, paged[0].q.dtype)
    if nbytes > ctx.max_gather_bytes:
        raise Skip(f"gathered KV would take {nbytes / 2**30:.1f} GiB (twice, with the reshape); "
                   f"--max_gather_gb={ctx.max_gather_bytes / 2**30:g}")

    def call(i):
        p = paged[i]
        k, v = inputs.gather_pages(p.kv_cache, p.block_tables, kv_len, ctx.kv_layout)
        return F.scaled_dot_product_attention(p.q.unsqueeze(2), k, v, enable_gqa=True)

    return prepared_calls(paged, call, lambda out: out.squeeze(2), "index + reshape + SDPA")


# ---- ragged prefill ([total, heads, d] packed) ----


def _expand_kv(x, group):
    return x.repeat_interleave(group, dim=1) if group > 1 else x


def sdpa_prefill(backend):
    """SDPA over each request: one batched call on views when all lengths are equal,
    otherwise one call per request (views, no copies). If the backend refuses GQA, K and V
    are expanded to the query heads beforehand (outside the timing; the call then reads
    `group` times the KV)."""

    def prepare(ctx, copies):
        lengths, causal = ctx.case.lengths, ctx.case.causal
        group = ctx.case.num_qo_heads // ctx.case.num_kv_heads

        def make(expand):
            kvs = [(_expand_kv(c.k, group), _expand_kv(c.v, group)) if expand else (c.k, c.v)
                   for c in copies]
            gqa = {} if expand else {"enable_gqa": True}
            if len(set(lengths)) == 1:
                batch, seq_len = len(lengths), lengths[0]

                def as_bhld(x):
                    return x.view(batch, seq_len, x.shape[1], x.shape[2]).transpose(1, 2)

                def call(i):
                    k, v = kvs[i]
                    with _backend_context(backend):
                        return F.scaled_dot_product_attention(
                            as_bhld(copies[i].q), as_bhld(k), as_bhld(v), is_causal=causal, **gqa)

                return call, lambda out: out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[3])

            bounds = []
            for n in lengths:
                start = bounds[-1][1] if bounds else 0
                bounds.append((start, start + n))

            def call(i):
                k, v = kvs[i]
                q = copies[i].q
                outs = []
                with _backend_context(backend):
                    for begin, end in bounds:
                        if end > begin:
                            outs.append(F.scaled_dot_product_attention(
                                q[begin:end].transpose(0, 1).unsqueeze(0),
                                k[begin:end].transpose(0, 1).unsqueeze(0),
                                v[begin:end].transpose(0, 1).unsqueeze(0), is_causal=causal, **gqa))
                return outs

            return call, lambda outs: torch.cat([o[0].transpose(0, 1) for o in outs])

        per_request = "" if len(set(ctx.case.lengths)) == 1 else "per request, "
        variant, call, canon = first_working([
            (per_request + "enable_gqa", lambda: make(False)),
            (per_request + f"KV expanded x{group} beforehand", lambda: make(True))])
        return prepared_calls(copies, call, canon, variant)

    return prepare


def varlen_prefill(ctx, copies):
    """torch.nn.attention.varlen.varlen_attn (torch >= 2.9 on CUDA), where present."""
    try:
        varlen = importlib.import_module("torch.nn.attention.varlen")
    except ImportError:
        raise Skip(f"torch {torch.__version__} has no torch.nn.attention.varlen") from None
    if ctx.device.type != "cuda":
        raise Skip("varlen_attn runs on CUDA only")
    params = inspect.signature(varlen.varlen_attn).parameters
    case = ctx.case
    group = case.num_qo_heads // case.num_kv_heads
    kwargs = {}
    if case.causal:
        if "is_causal" in params:
            kwargs["is_causal"] = True
        elif "window_size" in params:
            kwargs["window_size"] = (-1, 0)
        else:
            raise Skip("varlen_attn has neither is_causal nor window_size")
    cu = inputs.cu_seqlens(case.lengths, ctx.device)
    longest = max(case.lengths)

    def make(expand):
        # Without enable_gqa, varlen_attn still hands fewer KV heads to flash attention,
        # which supports GQA natively; expanding the KV is the last resort.
        extra = dict(kwargs)
        if group > 1 and not expand and "enable_gqa" in params:
            extra["enable_gqa"] = True
        kvs = [(_expand_kv(c.k, group), _expand_kv(c.v, group)) if expand else (c.k, c.v)
               for c in copies]

        def call(i):
            k, v = kvs[i]
            return varlen.varlen_attn(copies[i].q, k, v, cu, cu, longest, longest, **extra)

        return call, lambda out: out

    causal_kw = ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
    variant, call, canon = first_working([
        (causal_kw + ", GQA", lambda: make(False)),
        (causal_kw + f", KV expanded x{group} beforehand", lambda: make(True))])
    return prepared_calls(copies, call, canon, variant)


def splitkv_ragged(kv_scale=None, batch_invariant=False):
    """splitkv's ragged prefill; kv_scale: k_scale = v_scale of fp8 K/V; batch_invariant: the
    bitwise batch-invariant mode."""

    def prepare(ctx, copies):
        case = ctx.case
        cu = inputs.cu_seqlens(case.lengths, ctx.device)
        options = dict(causal=case.causal, max_q_len=max(case.lengths), **_scale_options(kv_scale))
        if batch_invariant:
            options.update(batch_invariant=True)
        return _splitkv_prepared(ctx, copies, splitkv.ragged_attention, splitkv.plan_ragged_attention,
                                 lambda c: (c.q, c.k, c.v, cu, cu), lambda c: options)

    return prepare


def splitkv_paged_prefill(kv_scale=None):
    """splitkv's paged_attention over inputs.PagedPrefillCopy: each prompt as one chunk
    (cu_seqlens_q) over its paged cache; kv_scale: k_scale = v_scale of an fp8 cache."""

    def prepare(ctx, paged):
        case = ctx.case
        options = dict(kv_layout=ctx.kv_layout, causal=case.causal, max_q_len=max(case.lengths),
                       **_scale_options(kv_scale))
        return _splitkv_prepared(ctx, paged, splitkv.paged_attention, splitkv.plan_paged_attention,
                                 _paged_args, lambda p: dict(cu_seqlens_q=p.cu_seqlens_q, **options))

    return prepare


def decode_contiguous_peers(device):
    if device.type == "cuda":
        return [("sdpa_cudnn", sdpa_decode("CUDNN_ATTENTION")),
                ("sdpa_flash", sdpa_decode("FLASH_ATTENTION")),
                ("flex_attention", flex_decode)]
    return [("sdpa", sdpa_decode(None))]


def prefill_peers(device):
    if device.type == "cuda":
        return [("sdpa_cudnn", sdpa_prefill("CUDNN_ATTENTION")),
                ("sdpa_flash", sdpa_prefill("FLASH_ATTENTION")),
                ("varlen_attn", varlen_prefill)]
    return [("sdpa", sdpa_prefill(None))]
