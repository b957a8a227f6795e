"""Checks an installed splitkv wheel from inside the environment it was installed into.

Run with that environment's python, from a directory outside the source tree:

    python installed_check.py --reference python/splitkv_reference/__init__.py
        --expect_prefix "$VENV" [--compile] [--device cuda]

It imports splitkv (refusing a copy outside --expect_prefix), runs paged and ragged
attention on random problems against the float64 reference (splitkv_reference, plain
torch, loaded from its file: the directory above it holds splitkv's sources, which must
not shadow the installed copy), checks the counter region is zero after every call, runs
the same calls through splitkv.ops (eager, and with --compile under
torch.compile(fullgraph=True)) and, on CUDA, replays them from a CUDA graph. Exits non-zero
on the first failure.

Only torch and the standard library are imported (argparse, not absl): the environments
under test hold torch and splitkv, nothing else.
"""

import argparse
import importlib.util
import math
import os
import sys

import torch

# (atol, rtol) against the float64 reference, as in tests/python/harness.py.
_TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (1e-2, 8e-3),
              torch.float16: (1.5e-3, 2e-3)}
_LSE_TOLERANCE = (1e-4, 2e-5)


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reference", required=True,
                        help="path of python/splitkv_reference/__init__.py")
    parser.add_argument("--expect_prefix", required=True,
                        help="splitkv must be imported from below this directory")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--compile", action="store_true", help="also run under torch.compile")
    return parser.parse_args(argv)


def _random(shape, dtype, generator):
    return torch.randn(shape, generator=generator).to(dtype)


def _cu_seqlens(lengths, device):
    values = [0]
    for n in lengths:
        values.append(values[-1] + n)
    return torch.tensor(values, dtype=torch.int32, device=device)


def make_paged(seq_lens, page_size, num_kv_heads, group, head_dim, dtype, device, seed):
    """An HND paged cache with pages in shuffled order and NaN in every unused slot."""
    generator = torch.Generator().manual_seed(seed)
    pages_per_seq = [max(1, math.ceil(n / page_size)) for n in seq_lens]
    num_pages = sum(pages_per_seq) + 1
    order = torch.randperm(num_pages, generator=generator).tolist()
    cache = torch.full((num_pages, 2, num_kv_heads, page_size, head_dim), float("nan"),
                       dtype=dtype)
    block_tables = torch.full((len(seq_lens), max(pages_per_seq)), order[-1], dtype=torch.int32)
    keys, values, next_page = [], [], 0
    for b, kv_len in enumerate(seq_lens):
        k = _random((kv_len, num_kv_heads, head_dim), dtype, generator)
        v = _random((kv_len, num_kv_heads, head_dim), dtype, generator)
        keys.append(k)
        values.append(v)
        for p in range(pages_per_seq[b]):
            page = order[next_page]
            next_page += 1
            block_tables[b, p] = page
            lo, hi = p * page_size, min(kv_len, (p + 1) * page_size)
            cache[page, 0, :, :hi - lo] = k[lo:hi].transpose(0, 1)
            cache[page, 1, :, :hi - lo] = v[lo:hi].transpose(0, 1)
    q = _random((len(seq_lens), num_kv_heads * group, head_dim), dtype, generator)
    tensors = (q.to(device), cache.to(device), block_tables.to(device),
               torch.tensor(seq_lens, dtype=torch.int32, device=device))
    return tensors, keys, values


def make_ragged(q_lens, kv_lens, num_kv_heads, group, head_dim, dtype, device, seed):
    generator = torch.Generator().manual_seed(seed)
    q = _random((sum(q_lens), num_kv_heads * group, head_dim), dtype, generator)
    k = _random((sum(kv_lens), num_kv_heads, head_dim), dtype, generator)
    v = _random((sum(kv_lens), num_kv_heads, head_dim), dtype, generator)
    return tuple(x.to(device) for x in (q, k, v)) + (_cu_seqlens(q_lens, device),
                                                      _cu_seqlens(kv_lens, device))


def _close(name, actual, expected, tolerance):
    atol, rtol = tolerance
    torch.testing.assert_close(actual.cpu().to(torch.float64), expected, atol=atol, rtol=rtol,
                               msg=lambda m: f"{name}: {m}")


def _same(name, a, b):
    if not torch.equal(a.cpu(), b.cpu()):
        raise AssertionError(f"{name}: results differ between two ways of running one call")


def check_paged(splitkv, reference, workspace, device, compiled):
    dtypes = [torch.bfloat16] + ([torch.float32] if device == "cpu" else [torch.float16])
    for dtype in dtypes:
        for page_size, num_splits in ((16, None), (1, 4)):
            name = f"paged {dtype} page_size={page_size} num_splits={num_splits}"
            (q, cache, block_tables, seq_lens), keys, values = make_paged(
                [1, 97, 300], page_size, num_kv_heads=2, group=4, head_dim=128, dtype=dtype,
                device=device, seed=page_size)
            out, lse = splitkv.paged_attention(q, cache, block_tables, seq_lens, workspace,
                                               num_splits=num_splits, return_lse=True)
            workspace.check_counter_region()
            for b in range(q.shape[0]):
                ref_out, ref_lse = reference.attention(q[b:b + 1].cpu(), keys[b], values[b])
                _close(f"{name} out[{b}]", out[b:b + 1], ref_out, _TOLERANCE[dtype])
                _close(f"{name} lse[{b}]", lse[b:b + 1], ref_lse, _LSE_TOLERANCE)
            args = (q, cache, block_tables, seq_lens, workspace)
            op_out, op_lse = splitkv.ops.paged_attention(*args, num_splits=num_splits,
                                                         return_lse=True)
            _same(f"{name} ops", op_out, out)
            _same(f"{name} ops lse", op_lse, lse)
            if compiled is not None:
                c_out, c_lse = compiled["paged"](*args, num_splits)
                _same(f"{name} compiled", c_out, out)
                _same(f"{name} compiled lse", c_lse, lse)
            workspace.check_counter_region()
            print(f"ok  {name}")


def check_ragged(splitkv, reference, workspace, device, compiled):
    dtype = torch.bfloat16
    q, k, v, cu_q, cu_kv = make_ragged([3, 0, 50], [3, 7, 300], num_kv_heads=2, group=2,
                                       head_dim=64, dtype=dtype, device=device, seed=7)
    for num_splits in (None, 3):
        name = f"ragged {dtype} num_splits={num_splits}"
        out, lse = splitkv.ragged_attention(q, k, v, cu_q, cu_kv, workspace,
                                            num_splits=num_splits, return_lse=True)
        workspace.check_counter_region()
        ref_out, ref_lse = reference.ragged_attention(q.cpu(), k.cpu(), v.cpu(), cu_q, cu_kv)
        _close(f"{name} out", out, ref_out, _TOLERANCE[dtype])
        _close(f"{name} lse", lse, ref_lse, _LSE_TOLERANCE)
        args = (q, k, v, cu_q, cu_kv, workspace)
        op_out = splitkv.ops.ragged_attention(*args, num_splits=num_splits)
        _same(f"{name} ops", op_out, out)
        if compiled is not None:
            _same(f"{name} compiled", compiled["ragged"](*args, num_splits), out)
        workspace.check_counter_region()
        print(f"ok  {name}")


def check_cuda_graph(splitkv, workspace):
    """A captured ops.paged_attention call replays on new inputs and leaves counters zero."""
    (q, cache, block_tables, seq_lens), keys, values = make_paged(
        [5, 700, 2049], 16, num_kv_heads=2, group=4, head_dim=128, dtype=torch.bfloat16,
        device="cuda", seed=3)
    out = torch.empty_like(q)
    splitkv.ops.paged_attention(q, cache, block_tables, seq_lens, workspace, out=out,
                                num_splits=4)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        splitkv.ops.paged_attention(q, cache, block_tables, seq_lens, workspace, out=out,
                                    num_splits=4, max_q_len=1)
    generator = torch.Generator().manual_seed(11)
    for replay in range(3):
        q.copy_(_random(q.shape, q.dtype, generator))
        graph.replay()
        torch.cuda.synchronize()
        workspace.check_counter_region()
        eager = splitkv.paged_attention(q, cache, block_tables, seq_lens, workspace, num_splits=4)
        _same(f"cuda graph replay {replay}", out, eager)
    print("ok  cuda graph replays")


def _compiled_functions(splitkv):
    @torch.compile(fullgraph=True)
    def paged(q, cache, block_tables, seq_lens, workspace, num_splits):
        return splitkv.ops.paged_attention(q, cache, block_tables, seq_lens, workspace,
                                           num_splits=num_splits, return_lse=True)

    @torch.compile(fullgraph=True)
    def ragged(q, k, v, cu_q, cu_kv, workspace, num_splits):
        return splitkv.ops.ragged_attention(q, k, v, cu_q, cu_kv, workspace,
                                            num_splits=num_splits)

    return {"paged": paged, "ragged": ragged}


def main(argv):
    args = _parse_args(argv)
    spec = importlib.util.spec_from_file_location("splitkv_reference", args.reference)
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    import splitkv

    where = os.path.realpath(splitkv.__file__)
    if not where.startswith(os.path.realpath(args.expect_prefix) + os.sep):
        raise SystemExit(f"installed_check: splitkv imported from {where}: expected a copy "
                         f"installed below {args.expect_prefix}")
    print(f"splitkv {splitkv.__version__} from {where}")
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"cuda backend {splitkv.cuda_backend_available()}")
    if args.device == "cuda" and not (torch.cuda.is_available()
                                      and splitkv.cuda_backend_available()):
        raise SystemExit("installed_check: --device cuda needs a GPU and a +cuda wheel")

    workspace = splitkv.Workspace(64 << 20, args.device)
    compiled = _compiled_functions(splitkv) if args.compile else None
    check_paged(splitkv, reference, workspace, args.device, compiled)
    check_ragged(splitkv, reference, workspace, args.device, compiled)
    if args.device == "cuda":
        check_cuda_graph(splitkv, workspace)
    print("installed_check: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
