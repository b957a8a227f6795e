"""A/B of head_dim 64 fp8 decode routes (SPLITKV_PROBE_D64FP8 = 0,1,2,3) beside bf16, one process."""
import math, os, sys, torch
import splitkv
from tools.bench import inputs, timing

HD = int(os.environ.get("HD", "64"))
MODES = [int(m) for m in os.environ.get("MODES", "0,1,2,3").split(",")]
dev = torch.device("cuda")
gen = torch.Generator(device="cuda").manual_seed(0)
ws = splitkv.Workspace(512 << 20, dev)
l2 = torch.cuda.get_device_properties(0).L2_cache_size

def ref64(q, k, v, scale_k, scale_v, group):
    # q [B, H, D], k/v [B, KVH, L, D] -> out [B, H, D] float64
    qd = q.double(); kd = k.double() * scale_k; vd = v.double() * scale_v
    kd = kd.repeat_interleave(group, 1); vd = vd.repeat_interleave(group, 1)
    s = torch.einsum("bhd,bhld->bhl", qd, kd) / math.sqrt(q.shape[-1])
    return torch.einsum("bhl,bhld->bhd", s.softmax(-1), vd)

for spec in sys.argv[1:]:
    parts = spec.split(":")
    batch, kv_len = (int(x) for x in parts[0].split("x"))
    group, forced = 4, []
    for x in parts[1:]:
        if x[0] == "g": group = int(x[1:])
        if x[0] == "s": forced = [int(y) for y in x[1:].split(",")]
    kvh, qoh = 8, 8 * group
    shape_kv = (batch, kvh, kv_len, HD)
    fp8_bytes = batch * kvh * kv_len * HD * 2
    n = inputs.num_copies(fp8_bytes, 4 * l2, limit=16)
    copies = []
    for _ in range(n):
        q = inputs.randn((batch, qoh, HD), torch.bfloat16, dev, gen)
        k = inputs.fp8_exact(inputs.randn(shape_kv, torch.bfloat16, dev, gen))
        v = inputs.fp8_exact(inputs.randn(shape_kv, torch.bfloat16, dev, gen))
        pc = inputs.paged_copy(inputs.DecodeCopy(q, k, v), 16, "HND", gen)
        f8 = inputs.fp8_paged_copy(pc)
        copies.append((pc, f8, k[:2], v[:2]))
    outs = [torch.empty_like(c[0].q) for c in copies]
    def call(i, fp8, splits=None):
        pc, f8, _, _ = copies[i]
        c = f8 if fp8 else pc
        kw = dict(k_scale=inputs.FP8_SCALE, v_scale=inputs.FP8_SCALE) if fp8 else {}
        if splits: kw["num_splits"] = splits
        return splitkv.paged_attention(c.q, c.kv_cache, c.block_tables, c.seq_lens, ws, out=outs[i], max_q_len=1, **kw)
    ref = ref64(copies[0][0].q[:2], copies[0][2], copies[0][3], 1.0, 1.0, group)
    f0 = copies[0][1]
    planned = splitkv.plan_paged_attention(f0.q, f0.kv_cache, f0.block_tables, f0.seq_lens, ws, max_q_len=1,
                                           k_scale=inputs.FP8_SCALE, v_scale=inputs.FP8_SCALE).num_splits
    configs = [("bf16", False, 0)] + [(f"fp8 m{m} planned {planned}", True, m) for m in MODES]
    configs += [(f"fp8 m{MODES[0]} {sp} splits", True, (MODES[0], sp)) for sp in forced]
    times = {c[0]: [] for c in configs}
    errs = {}
    for rnd in range(2):
        for name, fp8, mode in configs:
            mode, sp = mode if isinstance(mode, tuple) else (mode, None)
            os.environ["SPLITKV_PROBE_D64FP8"] = str(mode)
            outs[0].fill_(float("nan"))
            call(0, fp8, sp); torch.cuda.synchronize()
            e = (outs[0][:2].double() - ref).abs().max().item()
            errs[name] = max(errs.get(name, 0.0), e) if e == e else float("nan")
            calls = [lambda i=i, fp8=fp8, sp=sp: call(i, fp8, sp) for i in range(n)]
            for c in calls: c()
            t, how = timing.time_calls(calls, dev, 3, 15)
            times[name].append(t)
    bf = min(times["bf16"])
    for name, fp8, mode in configs:
        t = min(times[name])
        print(f"| d{HD} {spec} | {name} | {t*1e6:.1f} ({' / '.join(f'{x*1e6:.1f}' for x in times[name])}) | x{t/bf:.3f} of bf16 | fp8 TB/s {fp8_bytes/t/1e12:.2f} | err {errs[name]:.1e} |", flush=True)
    del copies, outs
    torch.cuda.empty_cache()
