"""The bench program stays working: the tiny preset on the CPU writes the JSON, markdown and
plot, every section has rows with the expected fields, and splitkv matches SDPA."""

import json
import os
import subprocess
import sys
import tempfile

_FIELDS = {"section", "shape", "dtype", "impl", "status", "num_splits", "seconds", "kv_bytes", "flops",
           "bytes_per_s", "pct_copy", "flops_per_s", "max_abs_err", "within_tolerance",
           "max_abs_diff_vs_sdpa", "timing", "copies", "case", "graph_seconds", "eager_seconds",
           "eager_bytes_per_s", "eager_flops_per_s"}


def _run(out_dir, *args):
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench")
    return subprocess.run([binary, "--device=cpu", "--shapes=tiny", "--warmup=0", "--iters=2",
                           f"--out_dir={out_dir}", *args], capture_output=True, text=True, timeout=600)


def main():
    out_dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    result = _run(out_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(out_dir, "bench.json")) as f:
        data = json.load(f)
    meta, rows = data["meta"], data["results"]
    assert meta["device_type"] == "cpu" and meta["preset"] == "tiny"
    assert meta["copy_bytes_per_s"] > 1e8, meta
    assert {r["section"] for r in rows} == {"decode", "prefill", "merge"}
    for row in rows:
        assert _FIELDS <= set(row), sorted(_FIELDS - set(row))
    splitkv_rows = [r for r in rows if r["impl"].startswith("splitkv")]
    # 2 decode cases (one with 2 page sizes): splitkv, sinks and batch_invariant rows each, an
    # fp8 row for the bfloat16 one; 2 prefill cases: ragged, batch_invariant and paged rows each,
    # ragged fp8 and paged fp8 rows for the bfloat16 one; merge: 1 split, planned, 2 forced.
    assert len(splitkv_rows) == 3 * 3 + 1 + 2 * 3 + 2 + 3, [(r["shape"], r["impl"]) for r in splitkv_rows]
    impls = {(r["section"], r["dtype"], r["impl"]) for r in splitkv_rows}
    assert {("prefill", "bfloat16", name) for name in
            ("splitkv", "splitkv invariant", "splitkv fp8", "splitkv paged", "splitkv paged fp8")} <= impls, impls
    invariant = [r for r in splitkv_rows if r["impl"] == "splitkv invariant"]
    assert len(invariant) == 5 and all("x the splitkv row's time" in r["note"] for r in invariant), invariant
    for row in splitkv_rows:
        assert row["status"] == "ok" and row["within_tolerance"], row
        assert row["seconds"] > 0 and row["bytes_per_s"] > 0 and row["flops_per_s"] > 0, row
        assert row["num_splits"] >= 1, row
        tolerance = 1e-4 if row["dtype"] == "float32" else 3e-2
        assert 0 < row["max_abs_err"] < tolerance, row  # real values: small, never exactly 0
        if row["section"] != "merge" and row["impl"] != "splitkv sinks":  # SDPA has no sinks
            assert row["max_abs_diff_vs_sdpa"] < tolerance, row
    forced = [r for r in splitkv_rows if r["impl"] == "splitkv num_splits=2"]
    assert forced and forced[0]["num_splits"] == 2 and "vs 1 split" in forced[0]["note"], forced
    sdpa_rows = [r for r in rows if r["impl"] == "sdpa"]
    assert len(sdpa_rows) == 4 and all(r["status"] == "ok" for r in sdpa_rows), sdpa_rows
    # FlashInfer and FA3 are never silently absent: on the CPU, one skipped row each per decode
    # page size (3; the fp8 one for the bfloat16 case) and prefill case (2: ragged and paged),
    # with the reason, in the JSON and the table.
    peer_rows = [r for r in rows if r["impl"].startswith(("flashinfer", "fa3"))]
    assert len(peer_rows) == 3 * 4 + 1 + 2 * (3 + 3), [(r["shape"], r["impl"]) for r in peer_rows]
    for row in peer_rows:
        assert row["status"] == "skipped" and "runs on CUDA only" in row["note"], row
    assert "| prefill | 2 x 100 d64 | float32 | flashinfer sm90 | - | - |" in result.stdout, result.stdout
    assert "| prefill | 2 x 100 d64 | float32 | fa3 paged | 16 | - |" in result.stdout, result.stdout
    for row in rows:
        if row["status"] == "ok":  # the CPU has one figure, wall time per call
            assert row["eager_seconds"] == row["seconds"] and row["graph_seconds"] is None, row
    for name in ("bench.md", "bench.png"):
        assert os.path.getsize(os.path.join(out_dir, name)) > 0, name
    assert "| decode | 3 x 300 d64 | float32 | splitkv | 16 |" in result.stdout, result.stdout

    usage = _run(out_dir, "--shapes=nope")
    assert usage.returncode != 0 and "--shapes" in usage.stderr, usage.stderr
    print("bench_test: OK")


if __name__ == "__main__":
    main()
    sys.exit(0)
