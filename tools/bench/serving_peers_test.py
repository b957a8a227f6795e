"""What of the serving peers' glue runs without FlashInfer, FA3 or a GPU: the page lists
FlashInfer is planned with and the K/V views FA3 reads describe the same tokens as the
paged cache splitkv reads (decode and paged prefill); the paged-prefill and decode peers,
run against stand-ins for FA3 and FlashInfer that attend over exactly what they are handed,
pass the bench's float64 check; a peer is skipped with its reason off CUDA; a FlashInfer
"module not prebuilt" error becomes a skip naming the module; the CUDA table has the graph
and eager columns and the summary picks the fastest other implementation (prefill: ragged
against ragged, paged against paged)."""

import math
import sys
import types

import torch

from tools.bench import accuracy
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


def _paged_prefill(kv_layout, lengths=(37, 16, 1, 50), page_size=16, seed=2):
    """A ragged causal prefill case (small heads) and its paged copy, as runner.run_prefill."""
    gen = torch.Generator().manual_seed(seed)
    case = shapes.PrefillCase(tuple(lengths), "test", head_dim=8, num_qo_heads=4, num_kv_heads=2)
    copy = inputs.prefill_copies(case, torch.float32, torch.device("cpu"), 1, gen)[0]
    return case, copy, inputs.paged_prefill_copy(copy, case.lengths, page_size, kv_layout, gen)


def test_paged_prefill_page_lists_and_views():
    for kv_layout in ("HND", "NHD"):
        case, copy, paged = _paged_prefill(kv_layout)
        ctx = types.SimpleNamespace(kv_layout=kv_layout)
        page_size, indptr, indices, last = serving_peers._csr_pages(ctx, paged)
        assert page_size == 16
        assert indptr.tolist() == [0, 3, 4, 5, 9], indptr  # ceil(n / 16) pages each
        assert last.tolist() == [5, 16, 1, 2], last  # a full last page holds 16, not 0
        k_pages, v_pages = serving_peers._nhd_views(ctx, paged.kv_cache)
        begin = 0
        for b, n in enumerate(case.lengths):
            pages = indices[indptr[b]:indptr[b + 1]].long()
            assert torch.equal(pages, paged.block_tables[b, :len(pages)].long()), (kv_layout, b)
            assert int(paged.seq_lens[b]) == n and int(paged.cu_seqlens_q[b]) == begin, (kv_layout, b)
            assert torch.equal(k_pages[pages].reshape(-1, 2, 8)[:n], copy.k[begin:begin + n]), (kv_layout, b)
            assert torch.equal(v_pages[pages].reshape(-1, 2, 8)[:n], copy.v[begin:begin + n]), (kv_layout, b)
            begin += n


def _attend(q, k, v, causal):
    """Attention of q [q_len, qo heads, d] over k, v [kv_len, kv heads, d] in float64, the
    causal mask aligned to the last key (as FA3 and FlashInfer align it)."""
    group = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) / math.sqrt(q.shape[-1])
    if causal:
        q_len, kv_len = q.shape[0], k.shape[0]
        keep = torch.arange(kv_len)[None, :] <= torch.arange(q_len)[:, None] + (kv_len - q_len)
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)


class _FakeFA3:
    """flash_attn_interface's two calls the bench makes, in torch, on what they are handed
    (NHD page views, page_table, cache_seqlens, cu_seqlens_q); metadata_error: what
    get_scheduler_metadata raises, if anything."""

    def __init__(self, metadata_error=None):
        self.metadata_error, self.metadata_kwargs, self.calls = metadata_error, [], []

    def get_scheduler_metadata(self, *args, **kwargs):
        if self.metadata_error:
            raise self.metadata_error
        self.metadata_kwargs.append(kwargs)
        return ("metadata", len(self.metadata_kwargs) - 1)

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q=None,
                                max_seqlen_q=None, causal=False, scheduler_metadata=None):
        assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
        self.calls.append(dict(q_shape=tuple(q.shape), scheduler_metadata=scheduler_metadata,
                               causal=causal, max_seqlen_q=max_seqlen_q))
        page_size = k_cache.shape[1]
        packed = cu_seqlens_q is not None  # q [total_q, h, d]; else [batch, q_len, h, d]
        bounds = cu_seqlens_q.tolist() if packed else None
        out = torch.empty_like(q)
        for b, n in enumerate(cache_seqlens.tolist()):
            pages = page_table[b, :-(-n // page_size)].long()
            k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]
            v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n]
            if packed:
                assert bounds[b + 1] - bounds[b] <= max_seqlen_q
                out[bounds[b]:bounds[b + 1]] = _attend(q[bounds[b]:bounds[b + 1]], k, v, causal)
            else:
                out[b] = _attend(q[b], k, v, causal)
        return out


class _FakeFlashInfer:
    """flashinfer's BatchPrefillWithPagedKVCacheWrapper in torch: plan keeps the CSR page
    lists, run attends over the pages they name in the wrapper's kv_layout;
    missing_module: the MissingJITCacheError's module its constructor raises, if any."""

    def __init__(self, missing_module=None):
        self.missing_module, self.wrappers = missing_module, []
        fake = self

        class Wrapper:
            def __init__(self, workspace, kv_layout="NHD", backend="auto"):
                if fake.missing_module:
                    raise _missing_jit_error(fake.missing_module)
                self.kv_layout, self.backend = kv_layout, backend
                fake.wrappers.append(self)

            def plan(self, qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads,
                     head_dim, page_size, causal=False, q_data_type=None, kv_data_type=None):
                self.lists = [x.tolist() for x in (qo_indptr, indptr, indices, last_page_len)]
                self.page_size, self.causal = page_size, causal

            def run(self, q, kv_cache, out):
                qo, indptr, indices, last = self.lists
                if self.kv_layout == "HND":  # [pages, 2, kv heads, page, d] -> NHD
                    kv_cache = kv_cache.transpose(2, 3)
                for b in range(len(indptr) - 1):
                    pages = torch.tensor(indices[indptr[b]:indptr[b + 1]])
                    n = (len(pages) - 1) * self.page_size + last[b]
                    k = kv_cache[pages, 0].reshape(-1, *kv_cache.shape[3:])[:n]
                    v = kv_cache[pages, 1].reshape(-1, *kv_cache.shape[3:])[:n]
                    out[qo[b]:qo[b + 1]] = _attend(q[qo[b]:qo[b + 1]], k, v, self.causal)
                return out

        self.BatchPrefillWithPagedKVCacheWrapper = Wrapper


def _missing_jit_error(name):
    class MissingJITCacheError(RuntimeError):
        def __init__(self, message, spec):
            super().__init__(message)
            self.spec = spec

    return MissingJITCacheError("JIT disabled", types.SimpleNamespace(name=name))


def _with_stand_ins(fa3=None, flashinfer=None):
    """Patches serving_peers' FA3 / FlashInfer lookups (and shrinks FlashInfer's workspace);
    returns the function that puts them back."""
    saved = (serving_peers._fa3, serving_peers._flashinfer, serving_peers.WORKSPACE_BYTES)
    serving_peers._fa3 = lambda ctx, dtype, head_dim: fa3
    serving_peers._flashinfer = lambda ctx, dtype: flashinfer
    serving_peers.WORKSPACE_BYTES = 256

    def restore():
        serving_peers._fa3, serving_peers._flashinfer, serving_peers.WORKSPACE_BYTES = saved

    return restore


def test_paged_prefill_peers_on_stand_ins():
    """The rows' glue (what is passed where) is right: each peer's output, from a stand-in
    that attends over exactly the arguments it is given, passes the bench's float64 check
    on the same sampled rows as splitkv's, in both layouts; FA3's fallbacks are tried in
    order; a FlashInfer module not prebuilt is a skipped row naming it."""
    for kv_layout in ("HND", "NHD"):
        case, copy, paged = _paged_prefill(kv_layout)
        _, other_copy, other = _paged_prefill(kv_layout, seed=3)  # a second copy, its own pages
        sample = accuracy.prefill_sample(copy, case.lengths, case.causal)
        other_sample = accuracy.prefill_sample(other_copy, case.lengths, case.causal)
        ctx = types.SimpleNamespace(device=torch.device("cpu"), kv_layout=kv_layout, case=case)
        fa3, flashinfer = _FakeFA3(), _FakeFlashInfer()
        restore = _with_stand_ins(fa3, flashinfer)
        try:
            named = dict(serving_peers.paged_prefill_peers())
            for name in ("flashinfer fa2 paged", "flashinfer sm90 paged", "fa3 paged"):
                prepared = named[name](ctx, [paged, other])
                err, ok = sample.check(prepared.check())
                assert ok and err < 1e-5, (kv_layout, name, err)
                assert len(prepared.calls) == 2 and other_sample.check(prepared.calls[1]())[1], name
            # One wrapper per copy, each planned with its copy's page lists and the case's causal.
            assert [(w.backend, w.kv_layout, w.causal) for w in flashinfer.wrappers] == \
                [("fa2", kv_layout, True)] * 2 + [("fa3", kv_layout, True)] * 2, flashinfer.wrappers
            assert flashinfer.wrappers[1].lists[2] != flashinfer.wrappers[0].lists[2]
            assert "scheduler metadata planned" in prepared.variant, prepared.variant
            assert fa3.metadata_kwargs[0]["cu_seqlens_q"] is paged.cu_seqlens_q
            assert fa3.metadata_kwargs[0]["causal"] is True and fa3.metadata_kwargs[0]["page_size"] == 16
            assert fa3.calls[-1] == dict(q_shape=tuple(paged.q.shape), scheduler_metadata=("metadata", 1),
                                         causal=True, max_seqlen_q=50), fa3.calls[-1]
            # FA3 without scheduler metadata: the next variant, still checked.
            restore()
            restore = _with_stand_ins(_FakeFA3(metadata_error=RuntimeError("no metadata")))
            prepared = serving_peers.fa3_paged_prefill(ctx, [paged])
            assert prepared.variant.endswith("metadata per call"), prepared.variant
            assert sample.check(prepared.check())[1]
            restore()
            restore = _with_stand_ins(flashinfer=_FakeFlashInfer(missing_module="batch_prefill_sm90"))
            try:
                serving_peers.flashinfer_paged_prefill("fa3")(ctx, [paged])
            except peers.Skip as e:
                assert "not prebuilt" in str(e) and "batch_prefill_sm90" in str(e), e
            else:
                raise AssertionError("no Skip")
        finally:
            restore()


def test_fa3_decode_on_stand_in():
    """fa3_decode (its cache views and fallbacks shared with fa3_paged_prefill) passes the
    decode check on the stand-in."""
    for kv_layout in ("HND", "NHD"):
        case, copy, paged = _paged(kv_layout)
        sample = accuracy.decode_sample(copy)
        ctx = types.SimpleNamespace(device=torch.device("cpu"), kv_layout=kv_layout, case=case)
        fa3 = _FakeFA3()
        restore = _with_stand_ins(fa3)
        try:
            prepared = serving_peers.fa3_decode(ctx, [paged])
            assert sample.check(prepared.check())[1], kv_layout
            assert "scheduler metadata planned" in prepared.variant, prepared.variant
            assert fa3.calls[-1]["q_shape"] == (case.batch, 1, 4, 8), fa3.calls[-1]
        finally:
            restore()


def test_skips_off_cuda():
    ctx = types.SimpleNamespace(device=torch.device("cpu"), serving_peers=True, flashinfer_jit=False,
                                kv_layout="HND", case=None)
    _, _, paged = _paged("HND")
    _, _, paged_prefill = _paged_prefill("HND")
    named = [(n, p, paged) for n, p in serving_peers.paged_decode_peers() + serving_peers.prefill_peers()]
    named += [(n, p, paged_prefill) for n, p in serving_peers.paged_prefill_peers()]
    assert [n for n, _, _ in named] == ["flashinfer fa2", "flashinfer fa2 tc", "flashinfer xqa", "fa3",
                                        "flashinfer fa2", "flashinfer sm90", "fa3", "flashinfer fa2 paged",
                                        "flashinfer sm90 paged", "fa3 paged"], named
    # The summary counts the paged-prefill peers as serving peers.
    assert all(n.startswith(report.SERVING_PEERS) for n, _, _ in named)
    for name, prepare, data in named:
        try:
            prepare(ctx, [data])
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


def test_prefill_summary_ragged_and_paged():
    """A prefill case's two summary lines: ragged splitkv against the ragged rows (page "-"),
    splitkv paged against the rows on the same paged cache (page 16); splitkv's variant rows
    never count as others."""
    rows = [_row("splitkv", None, 0.5, 0.6, section="prefill"),
            _row("fa3", None, 0.4, 0.5, section="prefill"),
            _row("sdpa_cudnn", None, 0.45, 0.45, section="prefill"),
            _row("splitkv fp8", None, 0.1, 0.1, section="prefill"),
            _row("splitkv paged", 16, 0.8, 1.0, section="prefill"),
            _row("flashinfer fa2 paged", 16, 1.0, 1.0, section="prefill"),
            _row("fa3 paged", 16, 0.5, 2.0, section="prefill"),
            _row("splitkv paged fp8", 16, 0.1, 0.1, section="prefill")]
    summary = report.peer_summary(rows, "cuda").splitlines()
    assert len(summary) == 4, summary
    # 2e12 flops: ragged splitkv 4 TFLOP/s graph against fa3's 5 (the faster sdpa_cudnn is
    # not a serving peer); eager 3.33 against sdpa_cudnn's 4.44 and fa3's 4.
    assert summary[2] == "| prefill | 2 x 64 d8 | bfloat16 | - | TFLOP/s | 4 | fa3 5 | -20.0% | fa3 5 " \
        "| -20.0% | 3 | sdpa_cudnn 4 | -25.0% | fa3 4 | -16.7% |", summary
    # Paged: 2.5 graph against fa3 paged's 4; eager 2 against flashinfer fa2 paged's 2.
    assert summary[3] == "| prefill | 2 x 64 d8 | bfloat16 | 16 | TFLOP/s | 2 | fa3 paged 4 | -37.5% " \
        "| fa3 paged 4 | -37.5% | 2 | flashinfer fa2 paged 2 | +0.0% | flashinfer fa2 paged 2 | +0.0% |", \
        summary


def main():
    test_page_lists_and_views()
    test_paged_prefill_page_lists_and_views()
    test_paged_prefill_peers_on_stand_ins()
    test_fa3_decode_on_stand_in()
    test_skips_off_cuda()
    test_missing_module_becomes_skip()
    test_report_columns_and_summary()
    test_prefill_summary_ragged_and_paged()
    print("serving_peers_test: OK")


if __name__ == "__main__":
    main()
    sys.exit(0)
