"""Causal prefill TFLOP/s of paged_attention (cu_seqlens_q, q_len == seq_len) beside
ragged_attention over the same keys, on the GPU machine: page sizes, HND and NHD, head_dims,
pages in random or table order. On sm_90 both run the wgmma + TMA prefill (paged K/V by
page-box tensor copies); SPLITKV_DISABLE_SM90=1 gives the mma.sync kernel for both. A/B of
builds: run it once per staged package.

    PYTHONPATH=.device_x:. python3 tools/gpu/paged_prefill_probe.py [--quick]
"""

import sys

import torch

import splitkv
from tools.bench import timing


def _time(run):
    """Median ms of one call between events after 3 warm-up calls (the bench's eager timing)."""
    return timing.time_eager([run], warmup=3, iters=20) * 1e3


def probe(batch, seq_len, head_dim=128, page_sizes=(16, 64), heads=(32, 8), dtype=torch.bfloat16):
    workspace = splitkv.Workspace(256 << 20, "cuda")
    hq, hk = heads
    total = batch * seq_len
    q = torch.randn(total, hq, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(total, hk, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(total, hk, head_dim, device="cuda", dtype=dtype)
    cu = torch.arange(0, total + 1, seq_len, device="cuda", dtype=torch.int32)
    flops = 4 * batch * hq * head_dim * seq_len * (seq_len + 1) / 2
    options = dict(causal=True, sm_scale=head_dim ** -0.5, max_q_len=seq_len, num_splits=1)
    ragged = lambda: splitkv.ragged_attention(q, k, v, cu, cu, workspace, **options)
    t = _time(ragged)
    name = f"{batch} x {seq_len} d{head_dim}"
    print(f"{name} ragged: {t:.3f} ms, {flops / t / 1e9:.0f} TFLOP/s", flush=True)
    expected = ragged()
    for page_size in page_sizes:
        pages_per_seq = seq_len // page_size
        num_pages = batch * pages_per_seq
        for order in ("random", "table"):
            ids = torch.randperm(num_pages) if order == "random" else torch.arange(num_pages)
            tables = ids.view(batch, pages_per_seq).to(torch.int32).cuda()
            for layout in ("HND", "NHD"):
                # Scatter k, v into the pages the tables name.
                kp = k.view(batch, pages_per_seq, page_size, hk, head_dim)
                vp = v.view(batch, pages_per_seq, page_size, hk, head_dim)
                cache = torch.empty(num_pages, 2, page_size, hk, head_dim, device="cuda", dtype=dtype)
                flat = tables.view(-1).long()
                cache[flat, 0] = kp.reshape(-1, page_size, hk, head_dim)
                cache[flat, 1] = vp.reshape(-1, page_size, hk, head_dim)
                if layout == "HND":
                    cache = cache.transpose(2, 3).contiguous()
                seq_lens = torch.full((batch,), seq_len, device="cuda", dtype=torch.int32)
                paged = lambda: splitkv.paged_attention(q, cache, tables, seq_lens, workspace,
                                                        cu_seqlens_q=cu, kv_layout=layout, **options)
                t = _time(paged)
                diff = float((paged().float() - expected.float()).abs().max())
                print(f"{name} paged p{page_size} {order} {layout}: {t:.3f} ms, "
                      f"{flops / t / 1e9:.0f} TFLOP/s, max |paged - ragged| {diff:.1e}", flush=True)
                del cache


def main():
    print(torch.cuda.get_device_name())
    probe(4, 4096)
    if "--quick" not in sys.argv:
        probe(1, 16384, page_sizes=(16,))
        probe(4, 4096, head_dim=64, page_sizes=(16,))
        probe(4, 4096, head_dim=256, page_sizes=(16,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
