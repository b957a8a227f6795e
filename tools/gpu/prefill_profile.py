"""Causal ragged prefill launches of splitkv and FlashAttention-3 on the same inputs, for ncu,
and a quick same-process timing of both.

    python3 tools/gpu/prefill_profile.py splitkv 1x16384 4x4096     # 2 launches each (for ncu)
    python3 tools/gpu/prefill_profile.py fa3 1x16384                # FA3's varlen call, the same
    python3 tools/gpu/prefill_profile.py --time 1x16384 4x4096      # both, CUDA graphs, TFLOP/s
    python3 tools/gpu/prefill_profile.py --time --nofa3 trace       # splitkv alone (A/B of builds)
    python3 tools/gpu/prefill_profile.py --invariant splitkv 1x4096 # batch_invariant=True calls
    python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=64 4x4096   # head_dim 64 or 256

A shape is BATCHxLEN (q_len == kv_len; bf16, 32 qo / 8 kv heads, head_dim 128 unless --head_dim
says otherwise: FA3's wheel has head_dim 128 only), or `trace`: the
bench's 16 prompt lengths drawn from the conversation trace (tools/bench/shapes.py), or
`trace:desc` / `trace:asc`, the same requests longest (shortest) first. FA3 needs
flash_attn_interface on the path (tools/gpu/install_peers.sh). With --time each call is timed
over rotated input copies (tools/bench/timing.py) and both outputs are compared with each
other (the bench checks each against float64).
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)

import torch  # noqa: E402

import splitkv  # noqa: E402
from tools.bench import inputs, shapes, timing  # noqa: E402

_TRACE = "data/azure_llm_inference_2023/conv.csv"


def make_calls(impl, case, copies, workspace, invariant=False):
    cu = inputs.cu_seqlens(case.lengths, torch.device("cuda", 0))
    longest = max(case.lengths)
    outs = [torch.empty_like(c.q) for c in copies]
    if impl == "fa3":
        import flash_attn_interface as fa3

        def call(i):
            c = copies[i]
            return fa3.flash_attn_varlen_func(c.q, c.k, c.v, cu, cu, longest, longest, causal=True)
    else:
        def call(i):
            c = copies[i]
            return splitkv.ragged_attention(c.q, c.k, c.v, cu, cu, workspace, causal=True, out=outs[i],
                                            max_q_len=longest, batch_invariant=invariant)
    return call


def main(argv):
    timed = "--time" in argv
    args = [a for a in argv if not a.startswith("--")]
    impls = ["splitkv"] if "--nofa3" in argv else ["splitkv", "fa3"] if timed else [args.pop(0)]
    head_dim = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--head_dim=")), shapes.HEAD_DIM)
    gen = torch.Generator(device="cuda").manual_seed(0)
    workspace = splitkv.Workspace(1 << 30, "cuda")  # room for invariant partials where a call needs them
    for spec in args:
        if spec in ("trace", "trace:desc", "trace:asc"):
            case = shapes.trace_prefill(os.path.join(_ROOT, _TRACE), 16, head_dim=head_dim)
            if spec != "trace":  # the same requests, longest (shortest) first
                lengths = tuple(sorted(case.lengths, reverse=spec == "trace:desc"))
                case = shapes.PrefillCase(lengths, spec, head_dim=head_dim)
        else:
            batch, length = (int(x) for x in spec.split("x"))
            case = shapes.PrefillCase((length,) * batch, spec, head_dim=head_dim)
        copies = inputs.prefill_copies(case, torch.bfloat16, torch.device("cuda", 0), 4 if timed else 1, gen)
        results = {}
        for impl in impls:
            call = make_calls(impl, case, copies, workspace, "--invariant" in argv)
            if not timed:
                for _ in range(2):
                    call(0)
                torch.cuda.synchronize()
                print(f"{impl} {spec}: launched", flush=True)
                continue
            results[impl] = call(0).clone()
            t, _ = timing.time_calls([lambda i=i: call(i) for i in range(len(copies))], torch.device("cuda", 0),
                                     5, 30)
            print(f"{impl:<8} {spec:<10} {t * 1e3:8.4f} ms  {shapes.flops(case) / t / 1e12:6.1f} TFLOP/s", flush=True)
        if len(results) == 2:
            diff = float((results["splitkv"].float() - results["fa3"].float()).abs().max())
            print(f"{spec}: max |splitkv - fa3| {diff:.2e}{'  BAD' if not diff < 2e-2 else ''}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
