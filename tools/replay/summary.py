"""The replay's closing summary table."""

from tools.replay import checks


def _seconds(s):
    return f"{s:.2f} s"


def _plural(count, noun):
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _splits(result, kind, calls):
    split = result.split_calls[kind]
    most = f" (up to {result.max_num_splits[kind]} splits)" if split else ""
    return f"{split} of {calls}{most}"


def _invariance(config, inv):
    if config.check_every == 0:
        return "every call batch_invariant; re-runs off (--check_every=0)"
    compared = inv.compared["prefill"] + inv.compared["decode"]
    return (f"{compared} compared ({inv.compared['prefill']} prefill, {inv.compared['decode']} decode "
            f"requests re-run alone), {inv.differed} differed")


def _layers(layers):
    """'' for one plain layer; else what each replayed layer is."""
    if len(layers) == 1 and layers[0].window_left < 0 and layers[0].sinks is None:
        return ""
    kinds = [layer.name + (f" ({layer.window_left + 1}-token window)" if layer.window_left >= 0 else "")
             for layer in layers]
    sinks = "; each with its own sinks (seeded float32 per qo head)" if layers[0].sinks is not None else ""
    return f"; {_plural(len(layers), 'layer')} per step: {', '.join(kinds)}{sinks}"


def _kv_cache(config, layers):
    """The pool's dtype; for fp8, each layer's scales and the values saturated."""
    if layers[0].quant is None:
        return f"{str(config.kv_dtype or config.dtype).replace('torch.', '')}"
    parts = []
    for layer in layers:
        quant = layer.quant
        k_sat, v_sat = quant.saturated()
        name = f"{layer.name} layer: " if len(layers) > 1 else ""
        parts.append(f"{name}k_scale {float(quant.k_scale.min()):.4g}..{float(quant.k_scale.max()):.4g}, "
                     f"v_scale {float(quant.v_scale.min()):.4g}..{float(quant.v_scale.max()):.4g}, "
                     f"saturated {k_sat} K and {v_sat} V of {quant.values:,} each")
    return ("float8_e4m3fn, per-kv-head scales = amax / 448 of a calibration sample; the ragged "
            "prefills read the same fp8 K/V; " + "; ".join(parts))


def summary_rows(config, result, trace_description, model_name):
    shape = config.shape
    stats = result.check_stats
    attention_s = result.prefill_s + result.decode_s
    tokens = result.prefill_tokens + result.decode_tokens
    atol, rtol = checks.OUTPUT_TOLERANCES[config.dtype]
    cap = config.max_generated_tokens
    if result.counter_failure:
        counter_state = "FAIL: " + result.counter_failure
    else:
        counter_state = (f"all zero after each of {result.counter_steps_checked} steps "
                         f"(bytes [0, {result.counter_region_bytes}), never re-zeroed)")
    if config.check_every == 0:
        checked = "off (--check_every=0)"
    else:
        every = "every call" if config.check_every == 1 else f"every {config.check_every}th call of each kind"
        if len(result.layers) > 1:
            every += ", every layer"
        per_layer = ""
        if len(result.layers) > 1:
            per_layer = ": " + ", ".join(f"{layer.name} {stats.layer_requests.get(layer.name, 0)}"
                                         for layer in result.layers)
        checked = (f"{stats.calls['prefill']} prefill + {stats.calls['decode']} decode calls "
                   f"({stats.requests} request checks{per_layer}), {every}")
    per = " per layer" if len(result.layers) > 1 else ""
    return [
        ("trace", trace_description),
        ("model", f"{model_name}: {_plural(shape.num_qo_heads, 'qo head')}, "
                  f"{_plural(shape.num_kv_heads, 'kv head')}, "
                  f"head_dim {shape.head_dim}, page_size {shape.page_size}{_layers(result.layers)}"),
        ("device, dtype", f"{config.device.type}, {str(config.dtype).replace('torch.', '')}, "
                          f"kv_layout {config.kv_layout}"),
        ("KV cache", _kv_cache(config, result.layers)),
        ("requests", f"{len(config.requests)} replayed, {result.finished} finished"),
        ("prefill tokens", f"{result.prefill_tokens:,} in {result.prefill_calls} "
                           f"{'ragged' if config.context_parallel == 1 else 'paged (cu_seqlens_q)'} calls{per}"),
        ("decode tokens", f"{result.decode_tokens:,} in {result.decode_calls} paged calls{per}"),
        ("generated-token cap", "none (the trace's GeneratedTokens)" if cap == 0 else f"{cap} per request"),
        ("steps", f"{result.steps} ({config.step_seconds * 1e3:g} ms simulated each, "
                  f"{result.simulated_s:.1f} s of trace time); peak batch {result.peak_batch_size}, "
                  f"peak waiting {result.peak_waiting}"),
        ("KV pages", f"pool {config.num_pages}, peak in use {result.peak_pages_in_use}"),
        ("workspace", f"{result.workspace_bytes:,} bytes, one for all calls"),
        ("split-KV calls", f"prefill {_splits(result, 'prefill', result.prefill_calls * len(result.layers))}, "
                           f"decode {_splits(result, 'decode', result.decode_calls * len(result.layers))}: "
                           f"these used the counters"),
        ("attention time", f"{_seconds(attention_s)} (prefill {_seconds(result.prefill_s)}, "
                           f"decode {_seconds(result.decode_s)}); "
                           f"{tokens / attention_s if attention_s else 0:,.0f} tokens/s"),
        ("float64 checks", checked),
        ("max abs error", f"out {stats.max_out_error:.3g} (tolerance {atol:g} + {rtol:g}*|ref|), "
                          f"lse {stats.max_lse_error:.3g} (tolerance {checks.LSE_ATOL:g}); "
                          f"{len(stats.failures)} failed"),
        *([] if result.invariance is None else [("batch invariance", _invariance(config, result.invariance))]),
        ("counter region", counter_state),
        ("wall time", _seconds(result.wall_s)),
        ("result", "PASS" if result.ok else "FAIL" + (f" ({result.error})" if result.error else "")),
    ]


def format_summary(rows):
    width = max(len(name) for name, _ in rows)
    rule = "-" * (width + 2 + max(len(value) for _, value in rows))
    lines = ["splitkv replay summary", rule]
    lines += [f"{name.ljust(width)}  {value}" for name, value in rows]
    lines.append(rule)
    return "\n".join(lines)


def context_parallel_rows(rows, outcomes):
    """rows (rank 0's) with a row per rank and a result over every rank (--context_parallel)."""
    per_rank = []
    for rank, o in enumerate(outcomes):
        state = "PASS" if o["ok"] else "FAIL"
        counters = "counter region zero" if o["counter_failure"] is None else "counter region FAIL"
        per_rank.append((f"rank {rank}", f"{state}: {o['requests_checked']} request checks, "
                         f"{len(o['failures'])} failed; {counters} after each of "
                         f"{o['counter_steps_checked']} steps; out error {o['max_out_error']:.3g}, "
                         f"lse {o['max_lse_error']:.3g}"))
    head = [("context parallel", f"{len(outcomes)} ranks ({outcomes[0]['backend']}), each "
             "request's pages dealt in contiguous runs; every call merged over the group")]
    ok = all(o["ok"] for o in outcomes)
    failed = [str(rank) for rank, o in enumerate(outcomes) if not o["ok"]]
    result = [("result", "PASS on every rank" if ok else f"FAIL on rank {', '.join(failed)}")]
    body = [row for row in rows if row[0] != "result"]
    return body[:3] + head + body[3:] + per_rank + result
