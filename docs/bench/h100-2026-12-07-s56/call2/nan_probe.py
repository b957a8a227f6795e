import torch, splitkv
ws = splitkv.Workspace(256 << 20, "cuda")
for all_keys in (False, True):
    for inv in (False, True):
        for ns in ((None,) if inv else (None, 1, 2, 4)):
            for kv_len, inf_at in ((4096, 3000), (256, 200), (256, 100)):
                q = torch.zeros(1, 1, 64, dtype=torch.bfloat16); q[0, 0, 0], q[0, 0, 1] = 1e20, 1.0
                k = torch.zeros(kv_len, 1, 64, dtype=torch.bfloat16); k[:, 0, 1] = 0.5
                k[0 if all_keys else kv_len // 2:, 0, 0] = -1e20
                v = torch.randn(kv_len, 1, 64).to(torch.bfloat16); v[inf_at, 0, 3] = float("inf")
                cu_q = torch.tensor([0, 1], dtype=torch.int32); cu_kv = torch.tensor([0, kv_len], dtype=torch.int32)
                q, k, v, cu_q, cu_kv = (x.cuda() for x in (q, k, v, cu_q, cu_kv))
                for name, f in (("ragged", lambda: splitkv.ragged_attention(q, k, v, cu_q, cu_kv, ws, causal=False, return_lse=True, num_splits=ns, batch_invariant=inv, max_q_len=1)),):
                    out, lse = f()
                    print(f"all_keys={all_keys} inv={inv} splits={ns} kv={kv_len} inf_at={inf_at}: out[3]={out[0,0,3].item()} lse={lse[0,0].item():.4f} finite_rest={bool(torch.isfinite(out[0,0]).sum() >= 63)}")
