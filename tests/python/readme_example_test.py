"""The README's Python example runs as written, and its outputs match float64 attention
(the first ```python block of README.md, executed as a new user would paste it)."""

import os
import re

import torch

import harness
import splitkv_reference

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def _example():
    with open(README) as f:
        text = f.read()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, f"{README}: no ```python block"
    return match.group(1)


def test_readme_example_runs_and_is_right():
    torch.manual_seed(0)
    scope = {}
    exec(compile(_example(), "README.md", "exec"), scope)
    # The paged decode: each request's token over its own pages (HND), in float64.
    q, kv_cache, tables, seq_lens = scope["q"], scope["kv_cache"], scope["block_tables"], scope["seq_lens"]
    page_size = kv_cache.shape[3]
    ks, vs = [], []
    for b, n in enumerate(seq_lens.tolist()):
        pages = kv_cache[tables[b].long()]  # [pages, 2, num_kv_heads, page_size, head_dim]
        kv = pages.permute(1, 0, 3, 2, 4).reshape(2, -1, *pages.shape[2:3], pages.shape[-1])[:, :n]
        ks.append(kv[0])
        vs.append(kv[1])
    cu_q = torch.arange(len(ks) + 1, dtype=torch.int32)
    cu_kv = torch.tensor([0] + seq_lens.cumsum(0).tolist(), dtype=torch.int32)
    want, want_lse = splitkv_reference.ragged_attention(q, torch.cat(ks), torch.cat(vs), cu_q, cu_kv, causal=True)
    harness.assert_close(scope["out"], want, torch.bfloat16)
    harness.assert_lse_close(scope["lse"], want_lse)
    assert page_size == 16
    # The ragged prefill.
    q_prefill, cu = scope["q_prefill"], scope["cu_seqlens"]
    want, _ = splitkv_reference.ragged_attention(q_prefill, scope["k"], scope["v"], cu, cu, causal=True)
    harness.assert_close(scope["out_prefill"], want, torch.bfloat16)
