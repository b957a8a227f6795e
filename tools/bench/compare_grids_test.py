"""compare_grids on two synthetic bench.json files: the lines' figures, the shapes both runs
hold, the fastest FlashInfer row of each run, the invariant cost, --match."""

import json
import lzma

from tools.bench import compare_grids


def _row(shape, impl, variant, seconds, page_size=16, status="ok"):
    return {"shape": shape, "impl": impl, "variant": variant, "status": status, "graph_seconds": seconds,
            "case": {"page_size": page_size}}


def _write(path, rows):
    path.write_text(json.dumps({"meta": {}, "results": rows}))
    return compare_grids.load(str(path))


def test_lines(tmp_path):
    before = _write(tmp_path / "a.json", [
        _row("64 x 1024 d64", "splitkv", "planned", 50e-6),
        _row("64 x 1024 d64", "splitkv invariant", "planned", 40e-6),
        _row("64 x 1024 d64", "flashinfer fa2 tc", "tensor cores", 45e-6),
        _row("64 x 1024 d64", "flashinfer xqa", "xqa", 60e-6),
        _row("8 x 2048 d64", "splitkv", "planned", 10e-6),
        _row("8 x 2048 d64", "flashinfer xqa", "xqa", 11e-6),
        _row("1 x 1024 d64", "splitkv", "planned", 5e-6),
    ])
    after = _write(tmp_path / "b.json", [
        _row("64 x 1024 d64", "splitkv", "planned", 40e-6),
        _row("64 x 1024 d64", "splitkv invariant", "planned", 40e-6),
        _row("64 x 1024 d64", "flashinfer fa2 tc", "tensor cores", 46e-6),
        _row("64 x 1024 d64", "flashinfer xqa", "xqa", 44e-6),
        _row("8 x 2048 d64", "splitkv", "planned", 10e-6),
        _row("8 x 2048 d64", "flashinfer xqa", "xqa", 9e-6, status="error"),  # no peer: left out
        _row("1 x 1024 d64", "splitkv", "planned", 5e-6, page_size=64),  # another page size
    ])
    lines = compare_grids.lines(before, after)
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("64 x 1024 d64      page 16:")
    assert "50.0 ->      40.0 us (-20.0 %)" in line
    assert "vs FlashInfer -10.0 -> +10.0 % (flashinfer xqa)" in line
    assert "invariant cost -20.0 ->  +0.0 %" in line
    assert compare_grids.lines(before, after, match="^8 x") == []


def test_reads_xz(tmp_path):
    rows = [_row("64 x 1024 d64", "splitkv", "planned", 50e-6),
            _row("64 x 1024 d64", "flashinfer xqa", "xqa", 60e-6, page_size=64)]
    plain = _write(tmp_path / "a.json", rows)
    with lzma.open(tmp_path / "a.json.xz", "wt") as f:
        json.dump({"meta": {}, "results": rows}, f)
    packed = compare_grids.load(str(tmp_path / "a.json.xz"))
    assert packed == plain
    assert packed[("64 x 1024 d64", 64)] == {"flashinfer xqa/xqa": 60e-6}
