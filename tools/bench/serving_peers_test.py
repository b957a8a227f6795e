"""What of the serving peers' glue runs without FlashInfer, FA3 or a GPU: the page lists
FlashInfer is planned with and the K/V views FA3 reads describe the same tokens as the
paged cache splitkv reads; a peer is skipped with its reason off CUDA; a FlashInfer
"module not prebuilt" error becomes a skip naming the module; the CUDA table has the graph
and eager columns and the summary picks the fastest other implementation."""

import sys
import types

import torch

from tools.bench import inputs
from tools.bench import peers
from tools.bench import report
from tools.bench import serving_peers
from tools.bench import shapes


def _paged(kv_layout, kv_len=37, page_size=16):
    gen = torch.Generator().manual_seed(1)
    case = shapes.DecodeCase(3, kv_len, head_dim=8, num_qo_heads=4, num_kv_heads=2)
    copy = inputs.decode_copies(case, torch.float32, torch.device("cpu"), 1, gen)[0]
    return case, copy, inputs.paged_copy(copy, page_size, kv_layout, gen)


def test_page_lists_and_views():
    for kv_layout in ("HND", "NHD"):
        case, copy, paged = _paged(kv_layout)
        ctx = types.SimpleNamespace(kv_layout=kv_layout)
        page_size, indptr, indices, last = serving_peers._csr_pages(ctx, paged)
        assert page_size == 16
        assert indptr.tolist() == [0, 3, 6, 9], indptr  # ceil(37 / 16) pages each
        assert last.tolist() == [5, 5, 5], last  # 37 = 2 x 16 + 5
        assert torch.equal(indices, paged.block_tables[:, :3].reshape(-1)), indices
        k_pages, v_pages = serving_peers._nhd_views(ctx, paged.kv_cache)
        assert k_pages.shape == (paged.kv_cache.shape[0], 16, 2, 8), k_pages.shape
        for b in range(case.batch):
            # Token t of request b: page block_tables[b, t // 16], row t % 16.
            pages = paged.block_tables[b].long()
            k = k_pages[pages].reshape(-1, 2, 8)[:case.kv_len]  # [kv_len, kv heads, d]
            v = v_pages[pages].reshape(-1, 2, 8)[:case.kv_len]
            assert torch.equal(k, copy.k[b].transpose(0, 1)), (kv_layout, b)
            assert torch.equal(v, copy.v[b].transpose(0, 1)), (kv_layout, b)


def test_skips_off_cuda():
    ctx = types.SimpleNamespace(device=torch.device("cpu"), serving_peers=True, flashinfer_jit=False,
                                kv_layout="HND", case=None)
    _, _, paged = _paged("HND")
    named = serving_peers.paged_decode_peers() + serving_peers.prefill_peers()
    assert [n for n, _ in named] == ["flashinfer fa2", "flashinfer fa2 tc", "flashinfer xqa", "fa3",
                                     "flashinfer fa2", "flashinfer sm90", "fa3"], named
    for name, prepare in named:
        try:
            prepare(ctx, [paged])
        except peers.Skip as e:
            assert "runs on CUDA only" in str(e), (name, e)
        else:
            raise AssertionError(f"{name} ran on the CPU")


def test_missing_module_becomes_skip():
    class MissingJITCacheError(RuntimeError):
        def __init__(self, message, spec):
            super().__init__(message)
            self.spec = spec

    def make(ctx, copies):
        try:
            raise MissingJITCacheError("JIT disabled", types.SimpleNamespace(name="batch_prefill_d64_sm90"))
        except MissingJITCacheError as e:
            raise ValueError("wrapped") from e  # found through the exception's chain

    try:
        serving_peers._flashinfer_guard(make)(None, [])
    except peers.Skip as e:
        assert "not prebuilt" in str(e) and "batch_prefill_d64_sm90" in str(e), e
    else:
        raise AssertionError("no Skip")

    def broken(ctx, copies):
        raise ValueError("a real error")

    try:
        serving_peers._flashinfer_guard(broken)(None, [])
    except ValueError as e:
        assert str(e) == "a real error"
    else:
        raise AssertionError("the error was swallowed")


def _row(impl, page, graph_s, eager_s, status="ok", section="decode"):
    return dict(section=section, shape="2 x 64 d8", dtype="bfloat16", impl=impl, status=status,
                note="", variant="v", num_splits=1 if impl == "splitkv" else None,
                seconds=graph_s or eager_s, graph_seconds=graph_s, eager_seconds=eager_s,
                kv_bytes=1e12, flops=2e12, pct_copy=50.0, max_abs_err=1e-3, max_abs_diff_vs_sdpa=None,
                case=dict(page_size=page))


def test_report_columns_and_summary():
    rows = [_row("splitkv", 16, 0.5, 0.6), _row("fa3", 16, 0.4, 0.9), _row("sdpa_cudnn", None, 1.0, 1.0),
            _row("flashinfer xqa", 16, None, 0.3, status="FAIL")]
    table = report.markdown_table(rows, "cuda")
    header = table.splitlines()[0]
    assert "ms graph | ms eager | TB/s graph | TB/s eager" in header, header
    assert "| splitkv | 16 | 1 | 500.000 | 600.000 | 2.00 | 1.67 | 50 | 4.0 | 3.3 |" in table, table
    assert "| flashinfer xqa | 16 | - | - | 300.000 | - | 3.33 | - |" in table, table
    summary = report.peer_summary(rows, "cuda").splitlines()
    assert len(summary) == 3, summary
    # graph: fa3 2.50 TB/s beats splitkv 2.00 (-20 %); eager: splitkv 1.67 beats fa3's 1.11
    # (the FAIL row's 3.33 never counts; the contiguous-KV cudnn row stands beside page 16).
    assert summary[2] == "| decode | 2 x 64 d8 | bfloat16 | 16 | TB/s | 2.00 | fa3 2.50 | -20.0% " \
        "| fa3 2.50 | -20.0% | 1.67 | fa3 1.11 | +50.0% | fa3 1.11 | +50.0% |", summary
    # Without FA3, the best other is cuDNN's and no serving peer is left.
    summary = report.peer_summary([r for r in rows if r["impl"] != "fa3"], "cuda").splitlines()
    assert summary[2] == "| decode | 2 x 64 d8 | bfloat16 | 16 | TB/s | 2.00 | sdpa_cudnn 1.00 | " \
        "+100.0% | - | - | 1.67 | sdpa_cudnn 1.00 | +66.7% | - | - |", summary
    assert report.peer_summary(rows, "cpu") == ""


def main():
    test_page_lists_and_views()
    test_skips_off_cuda()
    test_missing_module_becomes_skip()
    test_report_columns_and_summary()
    print("serving_peers_test: OK")


if __name__ == "__main__":
    main()
    sys.exit(0)
