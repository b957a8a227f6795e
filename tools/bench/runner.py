"""Runs one case: builds its input copies, prepares each implementation, checks its output
against the float64 reference (and SDPA's), times it, and returns one result row each."""

import dataclasses
import gc
import time
import typing

import torch

import splitkv
from tools.bench import accuracy
from tools.bench import inputs
from tools.bench import peers
from tools.bench import serving_peers
from tools.bench import shapes
from tools.bench import timing


@dataclasses.dataclass
class Context:
    device: torch.device
    dtype: typing.Optional[torch.dtype]  # None: each case's own (else the device default)
    workspace: typing.Any
    kv_layout: str
    warmup: int
    iters: int
    rotate_bytes: int
    copy_bytes_per_s: float
    max_case_bytes: int
    max_gather_bytes: int
    flex: bool
    flex_compile: bool
    flex_compile_budget_s: float
    seed: int
    max_impl_s: float = 3.0  # timed rounds are cut below --iters past this many seconds
    serving_peers: bool = True  # FlashInfer and FlashAttention-3, where importable
    flashinfer_jit: bool = False  # let FlashInfer compile modules its wheel lacks
    flex_spent_s: float = 0.0
    case: typing.Any = None

    def case_dtype(self, case):
        if self.dtype is not None:
            return self.dtype
        if case.dtype:
            return inputs.DTYPES[case.dtype]
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32


def _free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _row(case, dtype, impl, **fields):
    row = dict(section=case.section, shape=case.label(), dtype=str(dtype).replace("torch.", ""),
               impl=impl, status="ok", note="", variant="", num_splits=None, seconds=None,
               kv_bytes=None, flops=None, bytes_per_s=None, pct_copy=None, flops_per_s=None,
               max_abs_err=None, within_tolerance=None, max_abs_diff_vs_sdpa=None, timing=None,
               graph_seconds=None, eager_seconds=None, eager_bytes_per_s=None,
               eager_flops_per_s=None, iters=None, copies=None, setup_s=None,
               case=dict(batch=len(case.seq_lens()), seq_lens=list(case.seq_lens())[:64],
                         total_kv=sum(case.seq_lens()), head_dim=case.head_dim,
                         num_qo_heads=case.num_qo_heads, num_kv_heads=case.num_kv_heads,
                         page_size=fields.pop("page_size", None)))
    row.update(fields)
    return row


def _error_text(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return text[:300]


def _measure(ctx, case, dtype, impl, prepare, data, sample, sdpa_ref, page_size=None,
             splitkv_row=False, kv_dtype=None):
    """One row: prepare, check on copy 0, time every copy. sdpa_ref is a dict whose "rows"
    entry (the reference SDPA's sampled rows) the first SDPA row fills."""
    row = _row(case, dtype, impl, page_size=page_size, copies=len(data))
    try:
        prepared = prepare(ctx, data)
        row["variant"], row["num_splits"], row["setup_s"] = (
            prepared.variant, prepared.num_splits, prepared.setup_s or None)
        start = time.perf_counter()
        out = prepared.check()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        call_s = time.perf_counter() - start
        row["max_abs_err"], row["within_tolerance"] = sample.check(out)
        taken = sample.take(out)
        if impl.startswith("sdpa") and "rows" not in sdpa_ref:
            sdpa_ref["rows"], sdpa_ref["impl"] = taken, impl
        if "rows" in sdpa_ref:
            row["max_abs_diff_vs_sdpa"] = sample.max_abs_diff(taken, sdpa_ref["rows"])
        del out, taken
        # A slow implementation gets fewer rounds, so one row cannot eat the run's time.
        iters = max(3, min(ctx.iters, int(ctx.max_impl_s / max(1e-9, call_s * len(data)))))
        warmup = min(ctx.warmup, iters)
        timed = timing.time_graph_and_eager(prepared.calls, ctx.device, warmup, iters)
        row["graph_seconds"], row["eager_seconds"] = timed["graph_s"], timed["eager_s"]
        # The headline figure is the graph's (the GPU's time per call); eager where no graph.
        seconds = timed["graph_s"] or timed["eager_s"]
        if ctx.device.type != "cuda":
            row["timing"] = "wall"
        elif timed["graph_s"]:
            row["timing"] = "graph"
        else:
            row["timing"] = "eager"
            row["note"] = f"no CUDA graph ({timed['graph_error']}): headline figures eager"
        row["seconds"], row["iters"] = seconds, iters
        row["kv_bytes"], row["flops"] = inputs.kv_bytes(case, kv_dtype or dtype), shapes.flops(case)
        row["bytes_per_s"] = row["kv_bytes"] / seconds
        row["pct_copy"] = 100.0 * row["bytes_per_s"] / ctx.copy_bytes_per_s
        row["flops_per_s"] = row["flops"] / seconds
        row["eager_bytes_per_s"] = row["kv_bytes"] / timed["eager_s"]
        row["eager_flops_per_s"] = row["flops"] / timed["eager_s"]
        if splitkv_row:
            splitkv.check_counter_region(ctx.workspace)
        if not row["within_tolerance"]:  # any implementation, peers included: shown, not hidden
            note = "output outside tolerance of the float64 reference"
            row["status"], row["note"] = "FAIL", f"{note}; {row['note']}" if row["note"] else note
    except peers.Skip as e:
        row["status"], row["note"] = "skipped", str(e)
    except Exception as e:  # noqa: BLE001 - one row's failure is reported, the bench goes on
        row["status"], row["note"] = "error", _error_text(e)
        if ctx.device.type == "cuda":
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a sticky CUDA error: later rows will say so
                pass
    _free()
    return row


def _too_big(ctx, case, dtype):
    nbytes = inputs.kv_bytes(case, dtype)
    if nbytes <= ctx.max_case_bytes:
        return None
    return _row(case, dtype, "all", status="skipped",
                note=f"KV {nbytes / 2**30:.1f} GiB > --max_case_gb={ctx.max_case_bytes / 2**30:g}")


def _generator(ctx):
    return torch.Generator(device=ctx.device).manual_seed(ctx.seed)


def _decode_copies(ctx, case, dtype, gen):
    q_bytes = case.batch * case.num_qo_heads * case.head_dim * torch.empty((), dtype=dtype).element_size()
    count = inputs.num_copies(inputs.kv_bytes(case, dtype) + q_bytes, ctx.rotate_bytes)
    return inputs.decode_copies(case, dtype, ctx.device, count, gen)


def run_decode(ctx, case):
    dtype = ctx.case_dtype(case)
    skipped = _too_big(ctx, case, dtype)
    if skipped:
        return [skipped]
    gen = _generator(ctx)
    contiguous = _decode_copies(ctx, case, dtype, gen)
    sample = accuracy.decode_sample(contiguous[0], ctx.seed)
    # Attention sinks rows: their own reference (no SDPA beside them).
    sinks = torch.randn(case.num_qo_heads, generator=torch.Generator().manual_seed(ctx.seed)).to(ctx.device)
    sinks_sample = accuracy.decode_sample(contiguous[0], ctx.seed, sinks=sinks)
    sdpa_ref, rows = {}, []
    for name, prepare in peers.decode_contiguous_peers(ctx.device):
        rows.append(_measure(ctx, case, dtype, name, prepare, contiguous, sample, sdpa_ref))
    for index, page_size in enumerate(case.page_sizes):
        paged = [inputs.paged_copy(c, page_size, ctx.kv_layout, gen) for c in contiguous]
        if index == len(case.page_sizes) - 1:
            contiguous = None  # the paged copies hold the same values; free the memory
            _free()
        rows.append(_measure(ctx, case, dtype, "splitkv", peers.splitkv_paged(), paged, sample,
                             sdpa_ref, page_size=page_size, splitkv_row=True))
        base = rows[-1]
        rows.append(_measure(ctx, case, dtype, "splitkv sinks", peers.splitkv_paged(sinks=sinks),
                             paged, sinks_sample, {}, page_size=page_size, splitkv_row=True))
        _note_ratio(rows[-1], base)
        # batch_invariant=True beside the default (issue 16: the bench shows what it costs).
        rows.append(_measure(ctx, case, dtype, "splitkv invariant", peers.splitkv_paged(batch_invariant=True),
                             paged, sample, sdpa_ref, page_size=page_size, splitkv_row=True))
        _note_ratio(rows[-1], base)
        if dtype in inputs.FP8_Q_DTYPES:  # an fp8 cache of the same values, and FlashInfer's
            fp8 = [inputs.fp8_paged_copy(p) for p in paged]
            rows.append(_measure(ctx, case, dtype, "splitkv fp8",
                                 peers.splitkv_paged(kv_scale=inputs.FP8_SCALE), fp8, sample,
                                 sdpa_ref, page_size=page_size, splitkv_row=True,
                                 kv_dtype=inputs.FP8))
            _note_ratio(rows[-1], base)
            rows.append(_measure(ctx, case, dtype, "flashinfer fa2 fp8",
                                 serving_peers.flashinfer_decode(False, kv_scale=inputs.FP8_SCALE),
                                 fp8, sample, sdpa_ref, page_size=page_size, kv_dtype=inputs.FP8))
            del fp8
            _free()
        rows.append(_measure(ctx, case, dtype, "gather+sdpa", peers.gather_sdpa, paged, sample,
                             sdpa_ref, page_size=page_size))
        for name, prepare in serving_peers.paged_decode_peers():
            rows.append(_measure(ctx, case, dtype, name, prepare, paged, sample, sdpa_ref,
                                 page_size=page_size))
        del paged
        _free()
    return rows


def _note_ratio(row, base):
    """Notes row's time as a multiple of base's (the 16-bit splitkv row of the same case)."""
    if row["seconds"] and base["seconds"]:
        ratio = f"{row['seconds'] / base['seconds']:.3f}x the splitkv row's time"
        row["note"] = f"{row['note']}; {ratio}" if row["note"] else ratio


PREFILL_PAGE_SIZE = 16  # the paged prefill rows' page size (the serving engines' usual one)


def run_prefill(ctx, case):
    dtype = ctx.case_dtype(case)
    skipped = _too_big(ctx, case, dtype)
    if skipped:
        return [skipped]
    gen = _generator(ctx)
    total = sum(case.lengths)
    element = torch.empty((), dtype=dtype).element_size()
    copy_bytes = total * (case.num_qo_heads + 2 * case.num_kv_heads) * case.head_dim * element
    copies = inputs.prefill_copies(case, dtype, ctx.device,
                                   inputs.num_copies(copy_bytes, ctx.rotate_bytes, limit=16), gen)
    sample = accuracy.prefill_sample(copies[0], case.lengths, case.causal, ctx.seed)
    sdpa_ref, rows = {}, []
    for name, prepare in peers.prefill_peers(ctx.device) + serving_peers.prefill_peers():
        rows.append(_measure(ctx, case, dtype, name, prepare, copies, sample, sdpa_ref))
    rows.append(_measure(ctx, case, dtype, "splitkv", peers.splitkv_ragged(), copies, sample, sdpa_ref,
                         splitkv_row=True))
    base = rows[-1]
    rows.append(_measure(ctx, case, dtype, "splitkv invariant", peers.splitkv_ragged(batch_invariant=True),
                         copies, sample, sdpa_ref, splitkv_row=True))
    _note_ratio(rows[-1], base)
    fp8 = dtype in inputs.FP8_Q_DTYPES
    if fp8:  # the same K/V values as fp8 (issue 17: fp8 prefill's speed in the bench)
        rows.append(_measure(ctx, case, dtype, "splitkv fp8", peers.splitkv_ragged(inputs.FP8_SCALE),
                             [inputs.fp8_prefill_copy(c) for c in copies], sample, sdpa_ref,
                             splitkv_row=True, kv_dtype=inputs.FP8))
        _note_ratio(rows[-1], base)
    # The prompts as one chunk each over a paged cache (what a chunked prefill reads).
    page_size = PREFILL_PAGE_SIZE
    paged = [inputs.paged_prefill_copy(c, case.lengths, page_size, ctx.kv_layout, gen) for c in copies]
    copies = None
    _free()
    rows.append(_measure(ctx, case, dtype, "splitkv paged", peers.splitkv_paged_prefill(), paged, sample,
                         sdpa_ref, page_size=page_size, splitkv_row=True))
    _note_ratio(rows[-1], base)
    # The serving peers on the same paged caches (FlashInfer's paged prefill, FA3's kvcache call).
    for name, prepare in serving_peers.paged_prefill_peers():
        rows.append(_measure(ctx, case, dtype, name, prepare, paged, sample, sdpa_ref,
                             page_size=page_size))
    if fp8:
        rows.append(_measure(ctx, case, dtype, "splitkv paged fp8", peers.splitkv_paged_prefill(inputs.FP8_SCALE),
                             [inputs.fp8_paged_prefill_copy(p) for p in paged], sample, sdpa_ref,
                             page_size=page_size, splitkv_row=True, kv_dtype=inputs.FP8))
        _note_ratio(rows[-1], base)
    return rows


def run_merge(ctx, case):
    """splitkv alone: num_splits forced to 1, planned, then forced above 1; the overhead of
    each against the 1-split time is the merge's cost (plus the smaller tiles')."""
    dtype = ctx.case_dtype(case)
    skipped = _too_big(ctx, case, dtype)
    if skipped:
        return [skipped]
    gen = _generator(ctx)
    contiguous = _decode_copies(ctx, case, dtype, gen)
    sample = accuracy.decode_sample(contiguous[0], ctx.seed)
    paged = [inputs.paged_copy(c, case.page_size, ctx.kv_layout, gen) for c in contiguous]
    contiguous = None
    _free()
    rows = []
    for num_splits in (1, None) + tuple(case.forced_splits):
        name = "splitkv planned" if num_splits is None else f"splitkv num_splits={num_splits}"
        rows.append(_measure(ctx, case, dtype, name, peers.splitkv_paged(num_splits), paged, sample,
                             {}, page_size=case.page_size, splitkv_row=True))
    base = rows[0]["seconds"]
    for row in rows[1:]:
        if base and row["seconds"]:
            row["note"] = (row["note"] + " " if row["note"] else "") + \
                f"{100.0 * (row['seconds'] / base - 1):+.1f}% vs 1 split"
    return rows


RUNNERS = {"decode": run_decode, "prefill": run_prefill, "merge": run_merge}


def case_row(ctx, case, status, note):
    """One row standing for the whole case (skipped, or failed outside any implementation)."""
    return _row(case, ctx.case_dtype(case), "all", status=status, note=note)


def run_case(ctx, case):
    ctx.case = case
    start = time.perf_counter()
    try:
        rows = RUNNERS[case.section](ctx, case)
    except Exception as e:  # noqa: BLE001 - inputs or reference failed (e.g. out of memory)
        rows = [case_row(ctx, case, "error", _error_text(e))]
    _free()
    for row in rows:
        row["case_wall_s"] = time.perf_counter() - start
    return rows
