"""Which split count should the planner pick? Paged decode at forced split counts beside
FlashInfer, in one process, on the GPU machine (not shipped; tools/gpu/README.md).

    source tools/gpu/install_peers.sh .peers      # FlashInfer's wheels, or it is skipped
    PYTHONPATH=.device:tests/python:. python3 tools/gpu/decode_split_probe.py \\
        --head_dim=256 --splits=1,2,3,4,8 24x8192 8x16384
    ... --kv_dtype=fp8_e4m3 ...     # the cache as fp8 e4m3, beside the bf16 cache's planned call

For each BATCHxKV_LEN shape (bf16, 32 qo / 8 kv heads, HND, --page_size) it times FlashInfer's
tensor-core decode (BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=True) when importable,
splitkv's planned call and splitkv at each forced split count, every one twice in alternation
(the first row timed after a shape's cache is built can run slow), and prints the faster of the
two, both figures, the gap to FlashInfer and the largest difference from the first output.
One copy of each input, reused: shapes whose KV is under 4x the L2 cache print a warning.
"""

import torch
from absl import app, flags

import splitkv
from tools.bench import inputs, timing

FLAGS = flags.FLAGS
flags.DEFINE_list("splits", ["1", "2", "4", "8"], "Forced split counts timed beside the planned one.")
flags.DEFINE_integer("page_size", 16, "Page size of the paged cache.")
flags.DEFINE_integer("head_dim", 128, "head_dim (64, 128 or 256).")
flags.DEFINE_integer("iters", 20, "Timed samples per row (median).")
flags.DEFINE_enum("kv_dtype", "bfloat16", ["bfloat16", "fp8_e4m3"],
                  "The cache's dtype. fp8_e4m3: the cache stored as fp8 (scales FP8_SCALE), "
                  "its planned and forced rows beside the bf16 cache's planned call; FlashInfer's "
                  "fp8 decode is not in the wheel (skipped).")

NUM_QO_HEADS, NUM_KV_HEADS = 32, 8


def _flashinfer_decode(p, kv_len, fi_workspace):
    """A call of FlashInfer's tensor-core decode over p's cache, or None if it is not installed."""
    try:
        import flashinfer
    except ImportError as e:
        print(f"flashinfer skipped: {e}")
        return None
    batch, page = p.q.shape[0], FLAGS.page_size
    used = -(-kv_len // page)
    indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * used
    indices = p.block_tables[:, :used].reshape(-1).contiguous()
    last = torch.full((batch,), kv_len - (used - 1) * page, dtype=torch.int32, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(fi_workspace, kv_layout="HND", use_tensor_cores=True)
    wrapper.plan(indptr, indices, last, NUM_QO_HEADS, NUM_KV_HEADS, FLAGS.head_dim, page,
                 q_data_type=p.q.dtype, kv_data_type=p.kv_cache.dtype)
    out = torch.empty_like(p.q)
    return lambda: wrapper.run(p.q, p.kv_cache, out=out)


def main(argv):
    shapes = argv[1:]
    if not shapes:
        raise app.UsageError("give one or more BATCHxKV_LEN shapes")
    gen = torch.Generator(device="cuda").manual_seed(0)
    workspace = splitkv.Workspace(512 << 20, torch.device("cuda"))
    fi_workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"head_dim {FLAGS.head_dim}, page {FLAGS.page_size}; us (both runs), TB/s of KV bytes, gap to FlashInfer")
    for shape in shapes:
        batch, kv_len = (int(x) for x in shape.split("x"))
        shape_of = (batch, NUM_KV_HEADS, kv_len, FLAGS.head_dim)
        q = inputs.randn((batch, NUM_QO_HEADS, FLAGS.head_dim), torch.bfloat16, torch.device("cuda"), gen)
        k = inputs.fp8_exact(inputs.randn(shape_of, torch.bfloat16, torch.device("cuda"), gen))
        v = inputs.fp8_exact(inputs.randn(shape_of, torch.bfloat16, torch.device("cuda"), gen))
        fp8 = FLAGS.kv_dtype == "fp8_e4m3"
        nbytes = 2 * k.numel() * (1 if fp8 else k.element_size())
        if nbytes < 4 * l2:
            print(f"warning: {shape}'s KV ({nbytes >> 20} MiB) is under 4x the L2 cache; its repeated reads partly hit it")
        p16 = inputs.paged_copy(inputs.DecodeCopy(q, k, v), FLAGS.page_size, "HND", gen)
        del k, v
        p = inputs.fp8_paged_copy(p16) if fp8 else p16
        scales = {"k_scale": inputs.FP8_SCALE, "v_scale": inputs.FP8_SCALE} if fp8 else {}
        out = torch.empty_like(q)

        def splitkv_call(num_splits, copy=p, extra=scales):
            return lambda: splitkv.paged_attention(copy.q, copy.kv_cache, copy.block_tables, copy.seq_lens,
                                                   workspace, out=out, max_q_len=1, num_splits=num_splits,
                                                   **extra)

        planned = splitkv.plan_paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace,
                                               max_q_len=1, **scales).num_splits
        configs = [(f"planned ({planned})", splitkv_call(None), out)]
        configs += [(f"{s} splits", splitkv_call(int(s)), out) for s in FLAGS.splits]
        if fp8:  # the bf16 cache's planned call, for the fp8 / bf16 ratio of the same run
            configs.insert(0, ("bf16 cache, planned", splitkv_call(None, p16, {}), out))
        fi = None if fp8 else _flashinfer_decode(p, kv_len, fi_workspace)
        if fi is not None:
            configs.insert(0, ("flashinfer tc", fi, None))
        times = {name: [] for name, _, _ in configs}
        diffs = dict.fromkeys(times, 0.0)
        ref = None
        for _ in range(2):
            for name, call, into in configs:
                if into is not None:
                    into.fill_(float("nan"))  # an element left unwritten shows as NaN
                result = call()
                torch.cuda.synchronize()
                result = result if into is None else into
                if ref is None:
                    ref = result.float().clone()
                diffs[name] = max(diffs[name], float((result.float() - ref).abs().max()))
                seconds, _ = timing.time_calls([call], torch.device("cuda"), 3, FLAGS.iters)
                times[name].append(seconds)
        fi_best = min(times["flashinfer tc"]) if fi is not None else None
        for name, runs in times.items():
            best = min(runs)
            gap = f"{100 * (fi_best / best - 1):+.1f}%" if fi_best else "-"
            print(f"| {shape} | {name} | {best * 1e6:.1f} ({' / '.join(f'{t * 1e6:.1f}' for t in runs)}) | "
                  f"{nbytes / best / 1e12:.2f} | {gap} | diff {diffs[name]:.1e} |", flush=True)
        if fp8:
            bf16 = min(times["bf16 cache, planned"])
            print(f"| {shape} | fp8 / bf16 (planned) | {min(times[configs[1][0]]) / bf16:.3f} | best forced "
                  f"{min(min(times[f'{s} splits']) for s in FLAGS.splits) / bf16:.3f} |", flush=True)
        del p, p16, out, ref, configs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    app.run(main)
