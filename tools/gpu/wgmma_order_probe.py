"""Batch-invariant paged decode tiles in the wgmma prefill's order against the wgmma prefill (issue 16).

Checks, on the H200:
  bits:  each token's row from a batch-invariant paged decode / verify (the decode kernel's
         wgmma-order path) against the same token's row of a default-mode ragged causal prefill
         (the wgmma kernel, num_splits=1), for prompts of at most 1024 keys (one invariant split):
         torch.equal on out and lse;
  value: invariant decodes of long requests (several 1024-key splits) against float64;
  batch: a request's invariant decode alone and inside a batch, bitwise.
Prints one line per case and a summary; exit status 1 when any check fails.
"""
import random
import sys

import torch

sys.path.insert(0, "tests/python")
import batch_invariant_test as bi  # noqa: E402  (its Request / paged helpers)
import harness  # noqa: E402
import splitkv  # noqa: E402

dev = "cuda"
failures = 0


def check(name, ok, detail=""):
    global failures
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)


def prefill_rows(requests, r, n, ws, **options):
    """Default-mode ragged causal prefill of request r's first n tokens: (out, lse) on the CPU."""
    req = requests[r]
    q, k, v = req.q[:n].to(dev), req.k[:n].to(dev), req.v[:n].to(dev)
    cu = harness.cu_seqlens([n], dev)
    out, lse = splitkv.ragged_attention(q, k, v, cu, cu, ws, causal=True, return_lse=True, num_splits=1, **options)
    return out.cpu(), lse.cpu()


ws = splitkv.Workspace(256 << 20, dev)
option_sets = {"plain": {}, "cap": {"logits_soft_cap": 30.0}}
for dtype in (torch.bfloat16, torch.float16):
    for head_dim, group in ((128, 4), (64, 8), (128, 1), (64, 2)):
        lengths = [1024, 700, 333, 129, 17]
        requests = bi.make_requests(lengths, num_kv_heads=2, group=group, head_dim=head_dim, dtype=dtype,
                                    seed=head_dim + group)
        sinks = torch.randn(2 * group, generator=torch.Generator().manual_seed(5)).to(dev)
        sets = dict(option_sets, sinks={"sinks": sinks})
        for oname, options in sets.items():
            for r, n in enumerate(lengths):
                whole = prefill_rows(requests, r, n, ws, **options)
                bad = []
                # one-token decodes at several positions, and a verify of up to 3 tokens
                for t in sorted({0, 1, n // 3, n // 2, n - 2, n - 1} - {-1}):
                    if t < 0:
                        continue
                    got = bi.paged(requests, [(r, t + 1, t)], ws, device=dev, causal=True, **options)[0]
                    if not (torch.equal(got[0], whole[0][t:t + 1]) and torch.equal(got[1], whole[1][t:t + 1])):
                        d = (got[0].float() - whole[0][t:t + 1].float()).abs().max().item()
                        bad.append(f"t={t} (max |diff| {d:.3g})")
                    if t >= 2:
                        got = bi.paged(requests, [(r, t + 1, t - 2)], ws, device=dev, causal=True, **options)[0]
                        if not (torch.equal(got[0], whole[0][t - 2:t + 1]) and torch.equal(got[1], whole[1][t - 2:t + 1])):
                            bad.append(f"verify t={t}")
                check(f"bits {dtype} d{head_dim} group {group} {oname} prompt {n}", not bad, " ".join(bad[:4]))

# Long requests: several invariant splits; values against float64; alone == in a batch.
for dtype, head_dim, group in ((torch.bfloat16, 128, 4), (torch.float16, 64, 8)):
    lengths = [5000, 1025, 3000, 17, 2048, 9000]
    requests = bi.make_requests(lengths, num_kv_heads=2, group=group, head_dim=head_dim, dtype=dtype, seed=3)
    alone = [bi.paged(requests, [(r, n, n - 1)], ws, device=dev)[0] for r, n in enumerate(lengths)]
    for r, n in enumerate(lengths):
        exp, exp_lse = bi.reference(requests[r], n, n - 1)
        err = (alone[r][0].double() - exp.double()).abs().max().item()
        try:
            harness.assert_close(alone[r][0], exp, dtype)
            harness.assert_lse_close(alone[r][1], exp_lse)
            ok = True
        except AssertionError:
            ok = False
        check(f"value {dtype} d{head_dim} group {group} kv {n}", ok, f"max err {err:.3g}")
    rng = random.Random(1)
    same = True
    for trial in range(6):
        members = rng.sample(range(len(lengths)), rng.randint(2, len(lengths)))
        got = bi.paged(requests, [(r, lengths[r], lengths[r] - 1) for r in members], ws, device=dev, seed=trial)
        for r, g in zip(members, got):
            same &= torch.equal(g[0], alone[r][0]) and torch.equal(g[1], alone[r][1])
    check(f"batch {dtype} d{head_dim} group {group}", same)

print(f"{failures} failed", flush=True)
sys.exit(1 if failures else 0)
