"""Paged decode launches for ncu, and a quick timing of decode variants.

    python3 tools/gpu/decode_profile.py 64x4096 1x32768            # 2 launches each (for ncu)
    python3 tools/gpu/decode_profile.py --time 64x4096:HND:1 ...  # tools/bench/timing.py, TB/s
    python3 tools/gpu/decode_profile.py --invariant 1x32768        # batch_invariant=True calls
    python3 tools/gpu/decode_profile.py --time --fp8 1x32768:HND:16 # an fp8 e4m3 cache (scale FP8_SCALE)
    python3 tools/gpu/decode_profile.py --time --page_size=64 64x4096 # pages of 64 slots (only the = form)
    python3 tools/gpu/decode_profile.py --time --head_dim=256 24x4096  # head_dim 64, 128 or 256 (the = form)

A shape is BATCHxKV_LEN[:LAYOUT[:NUM_SPLITS]] (bf16, 32 qo / 8 kv heads, head_dim 128, page
16 unless --head_dim / --page_size say). With --time each shape is timed over rotated input copies (> 4 x L2), and its output
checked against float32 SDPA on the gathered KV.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import splitkv  # noqa: E402
from tools.bench import inputs, shapes, timing  # noqa: E402


def parse(spec):
    parts = spec.split(":")
    batch, kv_len = (int(x) for x in parts[0].split("x"))
    layout = parts[1] if len(parts) > 1 else "HND"
    splits = int(parts[2]) if len(parts) > 2 else None
    return batch, kv_len, layout, splits


def make(batch, kv_len, layout, copies, gen, fp8, page_size=16, head_dim=128):
    case = shapes.DecodeCase(batch, kv_len, head_dim)
    out = []
    for c in inputs.decode_copies(case, torch.bfloat16, torch.device("cuda", 0), copies, gen):
        p = inputs.paged_copy(c, page_size, layout, gen)
        out.append(inputs.fp8_paged_copy(p) if fp8 else p)
        del c, p
    return out


def main(argv):
    timed = "--time" in argv
    invariant = "--invariant" in argv
    fp8 = "--fp8" in argv
    page_size = 16
    head_dim = 128
    for a in argv:
        if a.startswith("--head_dim="):
            head_dim = int(a.split("=", 1)[1])
            if head_dim not in (64, 128, 256):
                sys.exit(f"--head_dim={head_dim}: expected 64, 128 or 256")
        if a.startswith("--page_size="):
            page_size = int(a.split("=", 1)[1])
            if page_size < 1 or page_size & (page_size - 1):
                sys.exit(f"--page_size={page_size}: expected a power of two")
    scales = dict(k_scale=inputs.FP8_SCALE, v_scale=inputs.FP8_SCALE) if fp8 else {}
    specs = [a for a in argv if not a.startswith("--")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = splitkv.Workspace(256 << 20, "cuda")
    rows = []
    for spec in specs:
        batch, kv_len, layout, splits = parse(spec)
        kv_bytes = batch * 8 * kv_len * head_dim * 2 * (1 if fp8 else 2)
        copies = max(1, min(16, -(-(240 << 20) // kv_bytes))) if timed else 1
        paged = make(batch, kv_len, layout, copies, gen, fp8, page_size, head_dim)
        outs = [torch.empty_like(p.q) for p in paged]

        def call(i):
            p = paged[i]
            return splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, kv_layout=layout,
                                           out=outs[i], max_q_len=1, num_splits=splits,
                                           batch_invariant=invariant, **scales)

        plan = splitkv.plan_paged_attention(paged[0].q, paged[0].kv_cache, paged[0].block_tables,
                                            paged[0].seq_lens, ws, kv_layout=layout, max_q_len=1,
                                            num_splits=splits, batch_invariant=invariant, **scales)
        if not timed:
            for _ in range(2):
                call(0)
            torch.cuda.synchronize()
            print(f"{spec}: page_size {page_size}, launched, num_splits {plan.num_splits}")
            continue
        # Check against SDPA in float32 on the gathered KV.
        p = paged[0]
        cache = p.kv_cache.float() * inputs.FP8_SCALE if fp8 else p.kv_cache
        k, v = inputs.gather_pages(cache, p.block_tables, kv_len, layout)
        del cache
        ref = F.scaled_dot_product_attention(p.q.float().unsqueeze(2), k.float(), v.float(),
                                             enable_gqa=True).squeeze(2)
        outs[0].fill_(float("nan"))
        got = call(0).float()
        err = float((got - ref).abs().max())
        del k, v, ref
        t, _ = timing.time_calls([lambda i=i: call(i) for i in range(len(paged))], torch.device("cuda", 0), 5, 30)
        rows.append(f"{spec:<22} d{head_dim:<3} p{page_size:<3} splits {plan.num_splits:>3}  {t * 1e3:8.4f} ms  {kv_bytes / t / 1e12:5.2f} TB/s"
                    f"  err {err:.1e}{'  BAD' if not err < 2e-2 else ''}")
        print(rows[-1], flush=True)
        del paged, outs
        torch.cuda.empty_cache()
    if rows:
        print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
