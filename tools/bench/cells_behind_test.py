"""cells_behind on synthetic bench rows: which cases trail their fastest FlashInfer / FA3 row,
per page size and timing; splitkv's variants and rows that failed the float64 check do not
count; decode sees contiguous-KV peers beside every page size, prefill pairs ragged with
ragged; --match; the table's lines."""

import json
import lzma
import subprocess
import sys

from tools.bench import cells_behind


def _row(section, shape, impl, graph_us, eager_us=None, page_size=16, status="ok"):
    return {"section": section, "shape": shape, "dtype": "bfloat16", "impl": impl, "status": status,
            "case": {"page_size": page_size}, "kv_bytes": 1e6, "flops": 1e9,
            "graph_seconds": graph_us * 1e-6, "eager_seconds": eager_us * 1e-6 if eager_us else None}


ROWS = [
    # Behind at page 16 (XQA faster), ahead at page 64; the fp8 variant is faster but is splitkv's own.
    _row("decode", "1 x 1024 d128", "splitkv", 10.0, 30.0),
    _row("decode", "1 x 1024 d128", "splitkv fp8", 5.0),
    _row("decode", "1 x 1024 d128", "flashinfer xqa", 8.0, 40.0),
    _row("decode", "1 x 1024 d128", "splitkv", 10.0, page_size=64),
    _row("decode", "1 x 1024 d128", "flashinfer fa2 tc", 12.0, page_size=64),
    # A contiguous-KV peer (no page size) stands beside every page size, but is not a serving peer.
    _row("decode", "64 x 4096 d128", "splitkv", 100.0),
    _row("decode", "64 x 4096 d128", "sdpa_cudnn", 90.0, page_size=None),
    _row("decode", "64 x 4096 d128", "fa3", 99.0),
    # A peer whose output failed the check does not count: no peer left, not compared.
    _row("decode", "8 x 8192 d128", "splitkv", 50.0),
    _row("decode", "8 x 8192 d128", "fa3", 40.0, status="FAIL"),
    # Prefill: ragged against ragged (page None), paged against the same page size.
    _row("prefill", "4 x 4096 d128", "splitkv", 1000.0, page_size=None),
    _row("prefill", "4 x 4096 d128", "fa3", 900.0, page_size=None),
    _row("prefill", "4 x 4096 d128", "splitkv paged", 1000.0, page_size=16),
    _row("prefill", "4 x 4096 d128", "fa3 paged", 1100.0, page_size=16),
]


def _names(cells):
    return [(c["section"], c["shape"], c["page"]) for c, _ in cells]


def test_behind_graph():
    cells, compared = cells_behind.behind(ROWS)
    assert compared == 5
    assert _names(cells) == [("decode", "1 x 1024 d128", 16), ("decode", "64 x 4096 d128", 16),
                             ("prefill", "4 x 4096 d128", None)]
    gaps = [round(gap, 4) for _, gap in cells]
    assert gaps == [round(8 / 10 - 1, 4), round(99 / 100 - 1, 4), round(900 / 1000 - 1, 4)]


def test_behind_eager_and_match():
    cells, compared = cells_behind.behind(ROWS, timing="eager")
    assert compared == 1 and cells == []  # only 1 x 1024 p16 has both eager figures: ahead
    cells, compared = cells_behind.behind(ROWS, match="^prefill")
    assert compared == 2 and _names(cells) == [("prefill", "4 x 4096 d128", None)]


def test_table_and_program(tmp_path):
    cells, compared = cells_behind.behind(ROWS)
    text = cells_behind.table(cells, compared, "graph")
    assert "| decode | 1 x 1024 d128 | 16 | 0.10 TB/s | flashinfer xqa 0.12 | -20.0 % |" in text
    assert "| prefill | 4 x 4096 d128 | - | 1 TFLOP/s | fa3 1 | -10.0 % |" in text
    assert text.endswith("3 of 5 cases with a FlashInfer / FA3 row are behind (graph).")
    path = tmp_path / "bench.json.xz"
    with lzma.open(path, "wt") as f:
        json.dump({"meta": {}, "results": ROWS}, f)
    run = subprocess.run([sys.executable, cells_behind.__file__, str(path), "--match=^decode 64"],
                         capture_output=True, text=True, check=True)
    assert "| decode | 64 x 4096 d128 | 16 |" in run.stdout
    assert "1 of 1 cases" in run.stdout
