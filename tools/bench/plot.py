"""The bench's figure: decode bandwidth against KV length, one panel per (head_dim, batch
size), and below them causal prefill FLOP/s per case; every implementation beside splitkv
in its own colour and marker (splitkv solid, peers dashed / hatched), the same run's copy
bandwidth dotted. Figures are the CUDA graph's where there is one (the headline)."""

import collections

_MARKERS = "os^vD<>pP*Xh"


def _styles(impls):
    """Stable colour and marker per implementation (page sizes of one implementation share
    them; save_plot tells those apart by the marker's fill): splitkv first, then by name."""
    import matplotlib
    # Light enough extras that a peer's black hatching stays visible.
    colours = list(matplotlib.colormaps["tab10"].colors) + ["gold", "lime", "salmon", "slateblue"]
    ordered = sorted(set(impls), key=lambda name: (not name.startswith("splitkv"), name))
    return {name: (colours[i % len(colours)], _MARKERS[i % len(_MARKERS)])
            for i, name in enumerate(ordered)}


def _label(row, several_dtypes):
    page = row["case"].get("page_size")
    return row["impl"] + (f" p{page}" if page else "") + (f" {row['dtype']}" if several_dtypes else "")


def save_plot(rows, meta, path):
    """Writes the PNG; returns None, or why no plot was made (no matplotlib, no results)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    measured = [r for r in rows if r["status"] in ("ok", "FAIL") and r.get("seconds")]
    decode = [r for r in measured if r["section"] == "decode" and r.get("bytes_per_s")]
    prefill = [r for r in measured if r["section"] == "prefill" and r.get("flops_per_s")]
    if not decode and not prefill:
        return "no decode or prefill results: no plot"
    scale, unit = (1e12, "TB/s") if meta["device_type"] == "cuda" else (1e9, "GB/s")
    fl_scale, fl_unit = (1e12, "TFLOP/s") if meta["device_type"] == "cuda" else (1e9, "GFLOP/s")
    several_dtypes = len({r["dtype"] for r in decode + prefill}) > 1
    styles = _styles([r["impl"] for r in decode + prefill])
    pages = sorted({r["case"]["page_size"] for r in decode if r["case"].get("page_size")}) or [0]
    head_dims = sorted({r["case"]["head_dim"] for r in decode})
    batches = sorted({r["case"]["batch"] for r in decode})
    grid_rows = len(head_dims) + (1 if prefill else 0)
    columns = max(1, len(batches))  # a prefill-only run (`--only='^prefill'`): one wide panel
    prefill_cases = len({(r["shape"], r["dtype"]) for r in prefill})
    figure = plt.figure(figsize=(max(7, 4.2 * len(batches), 1.2 * prefill_cases + 3), 3.6 * grid_rows + 0.8))
    spec = figure.add_gridspec(grid_rows, columns)
    first = None
    for i, head_dim in enumerate(head_dims):
        for j, batch in enumerate(batches):
            ax = figure.add_subplot(spec[i, j], sharey=first)
            first = first or ax
            lines = collections.defaultdict(list)
            for r in decode:
                if r["case"]["head_dim"] == head_dim and r["case"]["batch"] == batch:
                    key = (_label(r, several_dtypes), r["impl"], r["case"].get("page_size") or 0)
                    lines[key].append((max(r["case"]["seq_lens"]), r["bytes_per_s"] / scale))
            for key in sorted(lines, key=lambda k: (not k[0].startswith("splitkv"), k[0])):
                label, impl, page = key
                points = sorted(lines[key])
                colour, marker = styles[impl]
                own = impl.startswith("splitkv")
                # A second page size of one implementation: the same colour, open markers.
                ax.plot([p[0] for p in points], [p[1] for p in points], color=colour, marker=marker,
                        markerfacecolor=colour if page == pages[0] or not page else "none",
                        linestyle="-" if own else "--", linewidth=2.0 if own else 1.2, markersize=4,
                        label=label)
            ax.axhline(meta["copy_bytes_per_s"] / scale, color="gray", linestyle=":", label="copy")
            ax.set_xscale("log", base=2)
            ax.set_title(f"decode, batch {batch}, head_dim {head_dim}", fontsize=9)
            ax.set_xlabel("KV length (tokens)", fontsize=8)
            ax.set_ylabel(f"KV read, {unit}", fontsize=8)
            ax.grid(True, alpha=0.3)
            if lines:
                ax.legend(fontsize=6)
    if prefill:
        _prefill_bars(figure.add_subplot(spec[grid_rows - 1, :]), prefill, styles, several_dtypes,
                      fl_scale, fl_unit)
    device = meta["device_name"].split(",")[0]
    figure.suptitle(f"{device}, {meta['kv_layout']} pages; CUDA-graph figures where captured",
                    fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 0.97))  # room for the suptitle
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None


def _prefill_bars(ax, prefill, styles, several_dtypes, scale, unit):
    """Grouped bars: one group per prefill case (and dtype), one bar per implementation."""

    def case_of(r):
        return r["shape"] + (f" {r['dtype']}" if several_dtypes else "")

    cases = list(dict.fromkeys(case_of(r) for r in prefill))
    impls = sorted({r["impl"] for r in prefill}, key=lambda name: (not name.startswith("splitkv"), name))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        mine = [r for r in prefill if r["impl"] == impl]
        colour, _ = styles[impl]
        ax.bar([cases.index(case_of(r)) - 0.4 + (k + 0.5) * width for r in mine],
               [r["flops_per_s"] / scale for r in mine], width=width, color=colour, label=impl,
               hatch=None if impl.startswith("splitkv") else "//", edgecolor="black", linewidth=0.4)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, fontsize=7, rotation=20, ha="right")
    ax.set_ylabel(f"causal prefill, {unit}", fontsize=8)
    ax.set_title("prefill (causal, ragged)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    # Beside the bars, not over them (a full grid has ~17 implementations).
    ax.legend(fontsize=6, ncol=1 + len(impls) // 12, loc="upper left", bbox_to_anchor=(1.0, 1.0))
