"""Paged decode graph times per shape, for A/B across packages (one process a package).
Shape: HD:BATCHxLEN[:g8][:fp8][:inv]  (32 qo / 8 kv heads; gN: 8 x N qo heads; page 16, HND)."""
import sys
import torch
import splitkv
from tools.bench import inputs, timing

dev = torch.device("cuda")
gen = torch.Generator(device="cuda").manual_seed(0)
ws = splitkv.Workspace(1024 << 20, dev)
tag = sys.argv[1]
for arg in sys.argv[2:]:
    parts = arg.split(":")
    hd = int(parts[0])
    batch, kv_len = (int(x) for x in parts[1].split("x"))
    flags = set(parts[2:])
    groups = [int(f[1:]) for f in flags if f.startswith("g")]
    qo = 8 * (groups[0] if groups else 4)
    fp8 = "fp8" in flags
    inv = "inv" in flags
    forced = [int(f[1:]) for f in flags if f.startswith("s")]
    scales_ns = dict(num_splits=forced[0]) if forced else {}
    q = inputs.randn((batch, qo, hd), torch.bfloat16, dev, gen)
    k = inputs.fp8_exact(inputs.randn((batch, 8, kv_len, hd), torch.bfloat16, dev, gen))
    v = inputs.fp8_exact(inputs.randn((batch, 8, kv_len, hd), torch.bfloat16, dev, gen))
    p = inputs.paged_copy(inputs.DecodeCopy(q, k, v), 16, "HND", gen)
    del k, v
    if fp8:
        p = inputs.fp8_paged_copy(p)
    scales = dict(k_scale=inputs.FP8_SCALE, v_scale=inputs.FP8_SCALE) if fp8 else {}
    out = torch.empty_like(q)

    def call():
        return splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, out=out,
                                       max_q_len=1, batch_invariant=inv, **scales, **scales_ns)
    call()
    torch.cuda.synchronize()
    ts = [timing.time_calls([call], dev, 3, 20)[0] for _ in range(3)]
    plan = splitkv.plan_paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, ws, max_q_len=1,
                                        batch_invariant=inv, **scales, **scales_ns)
    call()
    torch.cuda.synchronize()
    bits = out.view(torch.int16).long().mul(torch.arange(out.numel(), device=dev).view(out.shape) % 7919 + 1).sum().item()
    print(f"{tag} {arg}: {min(ts) * 1e6:.2f} us (splits {plan.num_splits}) bits {bits}", flush=True)
    del p, out
    torch.cuda.empty_cache()
