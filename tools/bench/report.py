"""The results as a markdown table (printed and saved) and as JSON."""

import json
import lzma
import math
import os


def _units(device_type):
    # The GPU's figures read best in TB/s and TFLOP/s, the CPU's in GB/s and GFLOP/s.
    return (1e12, "TB/s", 1e12, "TFLOP/s") if device_type == "cuda" else (1e9, "GB/s", 1e9, "GFLOP/s")


def _num(value, digits):
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}f}"


def _err(value):
    if value is None:
        return "-"
    return "inf/NaN" if math.isinf(value) or math.isnan(value) else f"{value:.1e}"


def _per_s(amount, seconds, scale):
    return amount / seconds / scale if amount and seconds else None


def markdown_table(rows, device_type):
    """One line per row. CUDA: time, bandwidth and FLOP/s from the CUDA graph and eager
    (each "-" where it was not measured); the CPU: wall time."""
    bw_scale, bw_unit, fl_scale, fl_unit = _units(device_type)
    cuda = device_type == "cuda"
    if cuda:
        figures = ["ms graph", "ms eager", f"{bw_unit} graph", f"{bw_unit} eager", "% copy",
                   f"{fl_unit} graph", f"{fl_unit} eager"]
    else:
        figures = ["ms", bw_unit, "% copy", fl_unit]
    header = ["section", "shape", "dtype", "impl", "page", "splits"] + figures + \
        ["max err", "vs SDPA", "status / note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        # A prefill's KV bytes over its time says little (it is compute-bound): left blank.
        kv_bytes = r.get("kv_bytes") if r["section"] != "prefill" else None
        status = r["status"] if r["status"] != "ok" else ""
        detail = "; ".join(x for x in (status, r.get("variant") if r["status"] == "ok" else "",
                                       r.get("note", "")) if x)
        cells = [r["section"], r["shape"], r["dtype"], r["impl"], str(r["case"].get("page_size") or "-"),
                 str(r["num_splits"] or "-")]
        if cuda:
            graph, eager = r.get("graph_seconds"), r.get("eager_seconds")
            bw = _per_s(kv_bytes, graph, bw_scale)
            cells += [_num(graph * 1e3 if graph else None, 3), _num(eager * 1e3 if eager else None, 3),
                      _num(bw, 2), _num(_per_s(kv_bytes, eager, bw_scale), 2),
                      _num(r.get("pct_copy") if bw else None, 0),  # the headline: the graph's
                      _num(_per_s(r.get("flops"), graph, fl_scale), 1),
                      _num(_per_s(r.get("flops"), eager, fl_scale), 1)]
        else:
            seconds = r.get("seconds")
            cells += [_num(seconds * 1e3 if seconds else None, 3),
                      _num(_per_s(kv_bytes, seconds, bw_scale), 1),
                      _num(r.get("pct_copy") if kv_bytes else None, 0),
                      _num(_per_s(r.get("flops"), seconds, fl_scale), 0)]
        cells += [_err(r.get("max_abs_err")), _err(r.get("max_abs_diff_vs_sdpa")), detail.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _best(rows, key):
    """The row with the largest figure (bytes or flops per graph/eager second), or None."""
    scored = [(r[key[0]] / r[key[1]], r) for r in rows if r.get(key[1]) and r.get(key[0])]
    return max(scored, key=lambda x: x[0]) if scored else None


SERVING_PEERS = ("flashinfer", "fa3")  # impl name prefixes of serving_peers.py's rows


def _is_own(row):
    """splitkv's row a summary line is about: decode's `splitkv` per page size, prefill's
    ragged `splitkv` (no page size) and `splitkv paged` (its page size)."""
    return row["impl"] == "splitkv" or (row["section"] == "prefill" and row["impl"] == "splitkv paged")


def peer_comparisons(rows, device_type):
    """splitkv against the fastest other implementation of each case (and page size), and
    against the fastest serving peer (FlashInfer, FA3), from the CUDA graph and the eager
    figures: decode in bandwidth, prefill in FLOP/s. Decode: each page size's splitkv row
    against the peers on that page size and the contiguous-KV ones (SDPA, flex). Prefill:
    the ragged splitkv row against the ragged peers (page None), `splitkv paged` against the
    peers on the same paged cache (its page size). Only rows whose output passed the float64
    check count. One dict a line: section, shape, dtype, page, unit, digits, and for "graph"
    and "eager" a dict of own (splitkv's figure in unit, or None), other and serving ((impl,
    figure) or None). Empty off CUDA."""
    if device_type != "cuda":
        return []
    bw_scale, bw_unit, fl_scale, fl_unit = _units(device_type)
    groups = {}
    for r in rows:
        if r["section"] not in ("decode", "prefill") or r["status"] != "ok":
            continue
        groups.setdefault((r["section"], r["shape"], r["dtype"]), []).append(r)
    out = []
    for (section, shape, dtype), members in groups.items():
        amount, scale, unit = ("kv_bytes", bw_scale, bw_unit) if section == "decode" else \
            ("flops", fl_scale, fl_unit)
        pages = sorted({r["case"].get("page_size") for r in members if _is_own(r)},
                       key=lambda p: p or 0)
        for page in pages or [None]:
            mine = [r for r in members if _is_own(r) and r["case"].get("page_size") == page]
            # Contiguous-KV decode peers (SDPA, flex) stand beside every page size; a prefill
            # line compares ragged with ragged, paged with paged.
            beside = (page, None) if section == "decode" else (page,)
            # splitkv's own variant rows (sinks, fp8, invariant) are not "others".
            others = [r for r in members if not r["impl"].startswith("splitkv")
                      and r["case"].get("page_size") in beside]
            serving = [r for r in others if r["impl"].startswith(SERVING_PEERS)]
            line = dict(section=section, shape=shape, dtype=dtype, page=page, unit=unit,
                        digits=2 if section == "decode" else 0)
            for timed in ("graph", "eager"):
                key = (amount, f"{timed}_seconds")
                own, other, peer = _best(mine, key), _best(others, key), _best(serving, key)
                line[timed] = dict(own=own[0] / scale if own else None,
                                   other=(other[1]["impl"], other[0] / scale) if other else None,
                                   serving=(peer[1]["impl"], peer[0] / scale) if peer else None)
            out.append(line)
    return out


def peer_summary(rows, device_type):
    """peer_comparisons as a markdown table: each timing's splitkv figure, the best other
    implementation and the best FlashInfer / FA3 row, and splitkv against each (+: ahead)."""
    lines = []
    for c in peer_comparisons(rows, device_type):
        cells = [c["section"], c["shape"], c["dtype"], str(c["page"] or "-"), c["unit"]]
        for timed in ("graph", "eager"):
            own = c[timed]["own"]
            cells.append(_num(own, c["digits"]))
            for best in (c[timed]["other"], c[timed]["serving"]):
                cells += [f"{best[0]} {best[1]:.{c['digits']}f}" if best else "-",
                          f"{100.0 * (own / best[1] - 1):+.1f}%" if own and best else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    if not lines:
        return ""
    header = ["section", "shape", "dtype", "page", "unit"]
    for timed in ("graph", "eager"):
        header += [f"splitkv {timed}", f"best other {timed}", "splitkv vs it",
                   f"best FlashInfer/FA3 {timed}", "splitkv vs it"]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + lines)


def header_lines(meta):
    bw_scale, bw_unit, _, _ = _units(meta["device_type"])
    return [
        f"splitkv bench: {meta['device_name']} ({meta['device_type']}), preset {meta['preset']}, "
        f"torch {meta['torch_version']}, splitkv {meta['splitkv_version']}",
        f"copy bandwidth: {meta['copy_bytes_per_s'] / bw_scale:.2f} {bw_unit} ({meta['copy_method']}, "
        f"read + write); '% copy' = KV bytes read / time over it",
        f"timing: median of {meta['iters']} rounds after {meta['warmup']} warm-up; input copies rotated "
        f"past {meta['rotate_bytes'] / 2**20:.0f} MiB; load average at start "
        f"{' '.join(f'{x:.2f}' for x in meta['load_average_start'])}, at end "
        f"{' '.join(f'{x:.2f}' for x in meta.get('load_average_end', [])) or '-'}",
        "max err: max |out - ref| over sampled rows, ref in float64; vs SDPA: max |out - out_SDPA| "
        "on the same rows",
    ] + ([
        "graph: per call, calls replayed back to back from a captured CUDA graph (the GPU's time); "
        "eager: one call from an idle GPU between two events (the host's work before the launch "
        "included); '% copy' from the graph figure",
    ] if meta["device_type"] == "cuda" else []) + ([
        "serving peers: " + ", ".join(f"{k} {v}" for k, v in meta["serving_peers"].items())
    ] if meta.get("serving_peers") else [])


def read_json(path):
    """A bench.json's {"meta": ..., "results": [rows]}, or a .json.xz's (docs/bench/ keeps large
    ones xz-compressed)."""
    with (lzma.open if path.endswith(".xz") else open)(path, "rt") as f:
        return json.load(f)


def write_json(path, meta, rows):
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1, default=str)
    os.replace(temporary, path)
