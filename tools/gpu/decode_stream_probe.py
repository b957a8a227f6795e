"""Where does paged decode's streaming rate stop? A probe for the next decode change, on the
GPU machine (not shipped; tools/gpu/README.md).

    PYTHONPATH=.device:. python3 tools/gpu/decode_stream_probe.py [--shapes=64x4096,16x4096]

For each decode shape (bf16, 32 qo / 8 kv heads, --head_dim, HND) it times, in one process
and with the bench's timing (tools/bench/timing.py):
  - splitkv over pages in a random order (the bench's cache) and in order (each request's
    pages one contiguous run), planned and at forced split counts;
  - torch SDPA (cuDNN) over the same KV, contiguous;
  - a read of the same bytes with nothing computed (k.sum() + v.sum() over the contiguous KV):
    the read-only rate the card gives torch's reduction kernels;
and prints TB/s of KV bytes, and the ratio to a device-to-device copy measured in the run.
Unlike the bench it keeps one copy of each input: use shapes whose KV is well past the L2
cache (the default shapes hold 134 MB to 4.3 GB); smaller ones print a warning.
"""

import torch
import torch.nn.functional as F
from absl import app, flags

import splitkv
from tools.bench import inputs, timing

FLAGS = flags.FLAGS
flags.DEFINE_list("shapes", ["64x4096", "256x4096", "16x4096", "16x8192"], "BATCHxKV_LEN decode shapes.")
flags.DEFINE_list("splits", ["2", "4"], "Forced split counts timed beside the planned one.")
flags.DEFINE_integer("page_size", 16, "Page size of the paged cache.")
flags.DEFINE_integer("head_dim", 128, "head_dim.")
flags.DEFINE_integer("iters", 20, "Timed samples per row (median).")
flags.DEFINE_bool("peers", True, "Also time cuDNN and the read-only reductions.")
flags.DEFINE_bool("in_order", True, "Also time the cache with its pages in table order.")


def _time(calls):
    for call in calls:
        call()
    torch.cuda.synchronize()
    seconds, _ = timing.time_calls(calls, torch.device("cuda"), warmup=3, iters=FLAGS.iters)
    return seconds


def main(argv):
    del argv
    gen = torch.Generator(device="cuda").manual_seed(0)
    copy, _ = timing.copy_bandwidth(torch.device("cuda"), 3, FLAGS.iters)
    print(f"copy {copy / 1e12:.2f} TB/s (read + write); head_dim {FLAGS.head_dim}, page {FLAGS.page_size}")
    print("| shape | what | us | TB/s | % copy |\n|---|---|---|---|---|")
    workspace = splitkv.Workspace(256 << 20, torch.device("cuda"))
    for shape in FLAGS.shapes:
        batch, kv_len = (int(x) for x in shape.split("x"))
        q = inputs.randn((batch, 32, FLAGS.head_dim), torch.bfloat16, torch.device("cuda"), gen)
        k = inputs.randn((batch, 8, kv_len, FLAGS.head_dim), torch.bfloat16, torch.device("cuda"), gen)
        v = inputs.randn((batch, 8, kv_len, FLAGS.head_dim), torch.bfloat16, torch.device("cuda"), gen)
        nbytes = 2 * k.numel() * k.element_size()
        if nbytes < 4 * torch.cuda.get_device_properties(0).L2_cache_size:
            print(f"warning: {shape}'s KV ({nbytes >> 20} MiB) is under 4x the L2 cache; "
                  "its repeated reads partly hit it", flush=True)

        def row(what, seconds):
            rate = nbytes / seconds
            print(f"| {shape} | {what} | {seconds * 1e6:.1f} | {rate / 1e12:.2f} | {100 * rate / copy:.0f} |",
                  flush=True)

        if FLAGS.peers:
            row("sdpa cuDNN, contiguous", _sdpa(q, k, v))
            row("read only: k.sum() + v.sum()", _time([lambda: (k.sum(), v.sum())]))
        paged = inputs.paged_copy(inputs.DecodeCopy(q, k, v), FLAGS.page_size, "HND", gen)
        pages = paged.block_tables.numel()
        del k, v
        # The same page contents stored in table order: request r's page i at r * n + i.
        order = paged.block_tables.reshape(-1).long()
        in_order = inputs.PagedCopy(q, paged.kv_cache[order],
                                    torch.arange(pages, dtype=torch.int32, device="cuda").view_as(paged.block_tables),
                                    paged.seq_lens)
        out = torch.empty_like(q)
        ref = None
        for name, p in (("random", paged), ("in order", in_order))[:2 if FLAGS.in_order else 1]:
            for num_splits in [None] + [int(s) for s in FLAGS.splits]:
                def call(p=p, num_splits=num_splits):
                    return splitkv.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace,
                                                   out=out, max_q_len=1, num_splits=num_splits)
                plan = splitkv.plan_paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace,
                                                    max_q_len=1, num_splits=num_splits)
                call()
                if ref is None:
                    ref = out.clone()
                elif not torch.allclose(out.float(), ref.float(), atol=2e-2):
                    raise SystemExit(f"{shape} {name} splits {num_splits}: differs from the first run")
                row(f"splitkv, page {FLAGS.page_size} {name}, {plan.num_splits} splits" + ("" if num_splits else " (planned)"),
                    _time([call]))
        del paged, in_order, p, call
        torch.cuda.empty_cache()


def _sdpa(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q4 = q.unsqueeze(2)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return _time([lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)])


if __name__ == "__main__":
    app.run(main)
