"""Decode bandwidth against KV length, one panel per (head_dim, batch size), every
implementation beside splitkv, the same run's copy bandwidth as a dashed line."""

import collections


def save_plot(rows, meta, path):
    """Writes the PNG; returns None, or why no plot was made (no matplotlib, no decode rows)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    decode = [r for r in rows if r["section"] == "decode" and r["status"] in ("ok", "FAIL")
              and r.get("bytes_per_s")]
    if not decode:
        return "no decode results: no plot"
    scale, unit = (1e12, "TB/s") if meta["device_type"] == "cuda" else (1e9, "GB/s")
    several_dtypes = len({r["dtype"] for r in decode}) > 1
    head_dims = sorted({r["case"]["head_dim"] for r in decode})
    batches = sorted({r["case"]["batch"] for r in decode})
    figure, axes = plt.subplots(len(head_dims), len(batches), squeeze=False, sharey=True,
                                figsize=(max(6, 4 * len(batches)), 3.2 * len(head_dims)))
    for i, head_dim in enumerate(head_dims):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            lines = collections.defaultdict(list)
            for r in decode:
                if r["case"]["head_dim"] == head_dim and r["case"]["batch"] == batch:
                    page = r["case"].get("page_size")
                    label = r["impl"] + (f" p{page}" if page else "") + \
                        (f" {r['dtype']}" if several_dtypes else "")
                    lines[label].append((max(r["case"]["seq_lens"]), r["bytes_per_s"] / scale))
            for label in sorted(lines, key=lambda name: (not name.startswith("splitkv"), name)):
                points = sorted(lines[label])
                style = "-o" if label.startswith("splitkv") else "--."
                ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
            ax.axhline(meta["copy_bytes_per_s"] / scale, color="gray", linestyle=":", label="copy")
            ax.set_xscale("log", base=2)
            ax.set_title(f"batch {batch}, head_dim {head_dim}")
            ax.set_xlabel("KV length (tokens)")
            ax.set_ylabel(f"KV read, {unit}")
            ax.grid(True, alpha=0.3)
            if lines:
                ax.legend(fontsize=7)
    device = meta["device_name"].split(",")[0]
    figure.suptitle(f"decode, {device}, {meta['kv_layout']} pages", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None
