"""The results as a markdown table (printed and saved) and as JSON."""

import json
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


def markdown_table(rows, device_type):
    bw_scale, bw_unit, fl_scale, fl_unit = _units(device_type)
    header = ["section", "shape", "dtype", "impl", "page", "splits", "ms", bw_unit, "% copy", fl_unit,
              "max err", "vs SDPA", "status / note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        seconds = r.get("seconds")
        # A prefill's KV bytes over its time says little (it is compute-bound): left blank.
        bw = r["bytes_per_s"] / bw_scale if r.get("bytes_per_s") and r["section"] != "prefill" else None
        pct = r.get("pct_copy") if r["section"] != "prefill" else None
        fl = r["flops_per_s"] / fl_scale if r.get("flops_per_s") else None
        status = r["status"] if r["status"] != "ok" else ""
        detail = "; ".join(x for x in (status, r.get("variant") if r["status"] == "ok" else "",
                                       r.get("note", "")) if x)
        cells = [r["section"], r["shape"], r["dtype"], r["impl"], str(r["case"].get("page_size") or "-"),
                 str(r["num_splits"] or "-"), _num(seconds * 1e3 if seconds else None, 3),
                 _num(bw, 2 if device_type == "cuda" else 1), _num(pct, 0),
                 _num(fl, 1 if device_type == "cuda" else 0), _err(r.get("max_abs_err")),
                 _err(r.get("max_abs_diff_vs_sdpa")), detail.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    ]


def write_json(path, meta, rows):
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1, default=str)
    os.replace(temporary, path)
