"""Does a query row's result depend on the other rows of its tile? A measurement for the
batch-invariant mode's plan (issue 16, docs/perf_log.md 2026-12-02: route every invariant call
through the wgmma prefill tiles), in the default mode's kernels.

    python3 tools/gpu/row_independence_probe.py                 # CUDA (the wgmma prefill on sm_90)
    python3 tools/gpu/row_independence_probe.py --device=cpu    # the same checks on the CPU backend

One causal prompt of `length` tokens (bf16, 32 qo / 8 kv heads, head_dim 128) is prefilled by
ragged_attention. Then, for each cut c, the rows below c are compared bit for bit with:
  - `tail`: the same prompt with every token from c on replaced by fresh random q/k/v (rows
    below c see the same keys; their tile-mates at and past c change);
  - `cut`: the prompt cut to its first c tokens (the tile holding row c - 1 loses its rows
    past it);
  - `batch`: the prompt second in a batch behind a random request (only cu_seqlens moves);
  - `paged`: the same prompt through paged_attention (num_splits=1) over a page-16 cache, as
    one chunk (every row), and as the chunk of rows c..length-1 alone (against the ragged
    call's rows c..: same keys, other tiles). A chunk whose rows fit a decode tile (group x
    rows <= 16) runs the decode kernel, another kernel than the ragged call's: its line says
    so, and a difference there is not about tile-mates.
Each line: how many rows differ in any bit, and the largest |difference|. Every call runs
one split (num_splits=1), so only the tiles differ.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)

import torch  # noqa: E402
from absl import app, flags  # noqa: E402

import splitkv  # noqa: E402
from tools.bench import inputs  # noqa: E402

_DEVICE = flags.DEFINE_enum("device", "cuda", ["cuda", "cpu"], "Backend to probe.")
_LENGTH = flags.DEFINE_integer("length", 2100, "Prompt length (tokens).")
_CUTS = flags.DEFINE_list("cuts", ["1", "77", "128", "200", "1023", "1024", "1500", "2099"], "Cut points.")

_QO_HEADS, _KV_HEADS, _HEAD_DIM, _PAGE = 32, 8, 128, 16


def _rand(n, heads, gen, device):
    return inputs.randn((n, heads, _HEAD_DIM), torch.bfloat16, device, gen)


def _ragged(q, k, v, lengths, workspace):
    cu = inputs.cu_seqlens(lengths, q.device)
    return splitkv.ragged_attention(q, k, v, cu, cu, workspace, causal=True, max_q_len=max(lengths), num_splits=1)


def _paged(prompt, q_begin, workspace):
    """Rows q_begin.. of `prompt` (inputs.PagedPrefillCopy: the whole prompt's K/V in pages)
    as one chunk."""
    rows = prompt.q[q_begin:].contiguous()
    return splitkv.paged_attention(rows, prompt.kv_cache, prompt.block_tables, prompt.seq_lens, workspace,
                                   cu_seqlens_q=inputs.cu_seqlens([rows.shape[0]], rows.device),
                                   max_q_len=rows.shape[0], num_splits=1)


def _report(name, a, b):
    differ = (a.view(a.shape[0], -1).view(torch.int16) != b.view(b.shape[0], -1).view(torch.int16)).any(1)
    diff = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
    print(f"  {name:<18} rows {a.shape[0]:5d}  differing {int(differ.sum()):5d}  max |diff| {diff:.2e}", flush=True)


def main(argv):
    del argv
    device = torch.device(_DEVICE.value)
    gen = torch.Generator(device=device).manual_seed(0)
    workspace = splitkv.Workspace(256 << 20, _DEVICE.value)
    n = _LENGTH.value
    q, k, v = _rand(n, _QO_HEADS, gen, device), _rand(n, _KV_HEADS, gen, device), _rand(n, _KV_HEADS, gen, device)
    full = _ragged(q, k, v, [n], workspace)
    paged = inputs.paged_prefill_copy(inputs.PrefillCopy(q, k, v), [n], _PAGE, "HND", gen)
    _report("paged, one chunk", _paged(paged, 0, workspace), full)
    for c in (int(x) for x in _CUTS.value):
        if not 0 < c < n:
            raise app.UsageError(f"--cuts invalid: expected cuts in [1, {n - 1}] (--length={n}), got {c}")
        print(f"cut {c} of {n}:", flush=True)
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        q2[c:], k2[c:], v2[c:] = _rand(n - c, _QO_HEADS, gen, device), _rand(n - c, _KV_HEADS, gen, device), _rand(
            n - c, _KV_HEADS, gen, device)
        _report("tail", _ragged(q2, k2, v2, [n], workspace)[:c], full[:c])
        _report("cut", _ragged(q[:c], k[:c], v[:c], [c], workspace), full[:c])
        m = 333
        qa, ka, va = _rand(m, _QO_HEADS, gen, device), _rand(m, _KV_HEADS, gen, device), _rand(m, _KV_HEADS, gen, device)
        both = _ragged(torch.cat([qa, q[:c]]), torch.cat([ka, k[:c]]), torch.cat([va, v[:c]]), [m, c], workspace)
        _report("batch", both[m:], full[:c])
        decode = (n - c) * (_QO_HEADS // _KV_HEADS) <= 16
        _report("paged, rows c.." + (" (decode tile)" if decode else ""), _paged(paged, c, workspace), full[c:])


if __name__ == "__main__":
    sys.exit(app.run(main))
