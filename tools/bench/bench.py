"""bench: splitkv beside its peers (FlashInfer and FlashAttention-3 where they import, torch
SDPA cuDNN/flash, gather + SDPA, flex_attention, varlen_attn; torch's CPU SDPA on the CPU) in
one process, on the same random inputs.

    ./tools/bazel run //tools/bench -- --device=cpu                  # this machine's CPU
    PYTHONPATH=.device python3 tools/bench/bench.py --device=cuda    # GPU machine, no Bazel

Prints a markdown table (time from a CUDA graph and eager, KV bandwidth, % of the same run's
copy bandwidth, FLOP/s, max error against a float64 reference and against SDPA) and on CUDA
splitkv against the fastest peer of each case, writes bench.json, bench.md and bench.png
(decode bandwidth against KV length, prefill FLOP/s) to --out_dir. Exits 1 when a splitkv
output is outside tolerance or a splitkv call fails. See tools/bench/README.md.
"""

import os
import re
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(os.path.dirname(_HERE))
if __package__ in (None, "") and sys.path and os.path.abspath(sys.path[0]) == _HERE:
    # Run as a script (the GPU machine): import as tools.bench.*, not as top-level modules.
    sys.path[0] = _REPO_ROOT

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import torch  # noqa: E402

import splitkv  # noqa: E402
from tools.bench import inputs  # noqa: E402
from tools.bench import plot  # noqa: E402
from tools.bench import report  # noqa: E402
from tools.bench import runner  # noqa: E402
from tools.bench import serving_peers  # noqa: E402
from tools.bench import shapes  # noqa: E402
from tools.bench import timing  # noqa: E402

_DEFAULT_TRACE = "data/azure_llm_inference_2023/conv.csv"

FLAGS = flags.FLAGS
flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "Where to run; auto: cuda when present.")
flags.DEFINE_enum("shapes", "auto", ["auto"] + sorted(shapes.PRESETS),
                  "Preset: quick (GPU key targets, ~2 min), full (issue 6's grid), cpu (the CPU "
                  "backend beside torch's CPU SDPA), tiny (seconds, for the test); auto: quick on "
                  "cuda, cpu on the CPU.")
flags.DEFINE_string("out_dir", "/tmp/splitkv_bench", "Where bench.json, bench.md and bench.png go.")
flags.DEFINE_integer("warmup", -1, "Warm-up rounds before timing; -1: 5 on cuda, 1 on the CPU.")
flags.DEFINE_integer("iters", -1, "Timed rounds (the median is reported); -1: 30 on cuda, 10 on the CPU.")
flags.DEFINE_enum("dtype", "", ["", "float32", "float16", "bfloat16"],
                  "Overrides every case's dtype; empty: the preset's (bfloat16 on cuda).")
flags.DEFINE_enum("kv_layout", "HND", ["HND", "NHD"], "Layout of the paged KV cache.")
flags.DEFINE_integer("workspace_mb", 0, "splitkv workspace MiB (one, reused); 0: 256 on cuda, 64 on CPU.")
flags.DEFINE_integer("rotate_mb", 0, "Input copies are rotated until they exceed this many MiB; "
                     "0: max(4 x L2, 256 MiB) on cuda, 64 MiB on the CPU.")
flags.DEFINE_float("max_case_gb", 32.0, "Cases whose KV (one copy) exceeds this many GiB are skipped.")
flags.DEFINE_float("max_gather_gb", 8.0, "gather+sdpa is skipped above this many GiB of KV (it "
                   "allocates the gathered KV twice per call).")
flags.DEFINE_float("max_impl_s", 3.0, "An implementation whose rounds would take longer than this "
                   "many seconds in total gets fewer timed rounds than --iters (at least 3).")
flags.DEFINE_bool("flex", True, "Time flex_attention on decode (cuda).")
flags.DEFINE_bool("serving_peers", True, "Time FlashInfer and FlashAttention-3 (cuda) where they "
                  "import; rows say why one is skipped.")
flags.DEFINE_bool("flashinfer_jit", False, "Let FlashInfer JIT-compile the modules its wheel lacks "
                  "(minutes each, needs nvcc); otherwise those rows are skipped.")
flags.DEFINE_bool("flex_compile", True, "torch.compile flex_attention (eager otherwise: slow, for tests).")
flags.DEFINE_float("flex_compile_budget_s", 60.0, "Once flex_attention's first calls (compiles) have "
                   "taken this long in total, flex is skipped for the remaining cases.")
flags.DEFINE_float("time_budget_s", 0.0, "Cases starting after this many seconds are skipped (the "
                   "table and files are still written); 0: no limit.")
flags.DEFINE_string("only", "", "Regular expression: run only the preset's cases whose "
                    "'<section> <shape>' (e.g. 'decode 64 x 4096 d128') it matches.")
flags.DEFINE_string("trace", _DEFAULT_TRACE, "Trace CSV whose ContextTokens give the trace prefill batch.")
flags.DEFINE_integer("seed", 0, "Seeds the random inputs and the sampled rows.")
flags.DEFINE_bool("plot", True, "Save bench.png (needs matplotlib; skipped with a message otherwise).")


def _user_path(path):
    """Relative paths are taken from where `bazel run` was started; the default trace from the repo."""
    if os.path.isabs(path):
        return path
    if path != _DEFAULT_TRACE and "BUILD_WORKING_DIRECTORY" in os.environ:
        return os.path.join(os.environ["BUILD_WORKING_DIRECTORY"], path)
    return os.path.join(_REPO_ROOT, path) if path == _DEFAULT_TRACE else os.path.abspath(path)


def _usage(message):
    print(f"bench: {message}", file=sys.stderr)
    sys.exit(2)


def _device():
    name = FLAGS.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        _usage("--device invalid: expected a device torch can see, got cuda (torch.cuda.is_available() "
               "is False)")
    return torch.device(name, 0) if name == "cuda" else torch.device("cpu")


def _meta(device, preset, warmup, iters, rotate_bytes):
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = f"{props.name}, {props.multi_processor_count} SMs, CUDA {torch.version.cuda}, " \
               f"cuDNN {torch.backends.cudnn.version()}"
    else:
        name = f"CPU, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, " \
               f"SPLITKV_NUM_THREADS={os.environ.get('SPLITKV_NUM_THREADS', 'unset')}"
    return dict(device_type=device.type, device_name=name, preset=preset, torch_version=torch.__version__,
                splitkv_version=splitkv.__version__, splitkv_cuda=splitkv.cuda_backend_available(),
                warmup=warmup, iters=iters, rotate_bytes=rotate_bytes, kv_layout=FLAGS.kv_layout,
                load_average_start=list(os.getloadavg()), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                argv=sys.argv[1:], notes=[])


def _rotate_bytes(device):
    if FLAGS.rotate_mb > 0:
        return FLAGS.rotate_mb << 20
    if device.type != "cuda":
        return 64 << 20
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 60 << 20)
    return max(4 * l2, 256 << 20)


def _progress(row):
    if row["status"] in ("ok", "FAIL") and row["seconds"]:
        figure = f"{row['seconds'] * 1e3:9.3f} ms {row['bytes_per_s'] / 1e9:9.1f} GB/s " \
                 f"{row['flops_per_s'] / 1e12:7.2f} TFLOP/s ({row['timing']}) eager " \
                 f"{row['eager_seconds'] * 1e3:.3f} ms err {row['max_abs_err']:.1e}" + \
                 (f" {row['status']}" if row["status"] != "ok" else "")
    else:
        figure = f"{row['status']}: {row['note']}"
    page = row["case"].get("page_size")
    print(f"  {row['section']:<8}{row['shape']:<28}{row['dtype']:<9}{row['impl']:<24}"
          f"{'p' + str(page) if page else '':<5}{figure}", flush=True)


def main(argv):
    if len(argv) > 1:
        _usage(f"unexpected arguments: {argv[1:]}")
    device = _device()
    cuda = device.type == "cuda"
    warmup = FLAGS.warmup if FLAGS.warmup >= 0 else (5 if cuda else 1)
    iters = FLAGS.iters if FLAGS.iters > 0 else (30 if cuda else 10)
    if cuda:
        torch.cuda.set_device(device)
        if not splitkv.cuda_backend_available():
            print("bench: warning: this splitkv build has no CUDA backend; its rows will fail",
                  file=sys.stderr)
    trace = _user_path(FLAGS.trace)
    try:
        preset, cases = shapes.preset_cases(FLAGS.shapes, device.type, trace)
    except (OSError, ValueError) as e:
        _usage(str(e))
    if FLAGS.only:
        try:
            pattern = re.compile(FLAGS.only)
        except re.error as e:
            _usage(f"--only invalid: expected a regular expression, got {FLAGS.only!r} ({e})")
        cases = [c for c in cases if pattern.search(f"{c.section} {c.label()}")]
        if not cases:
            _usage(f"--only invalid: expected a pattern matching some case of preset {preset}, "
                   f"got {FLAGS.only!r}")
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    json_path = os.path.join(FLAGS.out_dir, "bench.json")

    start = time.perf_counter()
    rotate = _rotate_bytes(device)
    meta = _meta(device, preset, warmup, iters, rotate)
    torch.manual_seed(FLAGS.seed)
    meta["copy_bytes_per_s"], meta["copy_method"] = timing.copy_bandwidth(device, warmup, iters)
    workspace_mb = FLAGS.workspace_mb or (256 if cuda else 64)
    ctx = runner.Context(
        device=device, dtype=inputs.DTYPES[FLAGS.dtype] if FLAGS.dtype else None,
        workspace=splitkv.Workspace(workspace_mb << 20, device), kv_layout=FLAGS.kv_layout,
        warmup=warmup, iters=iters, rotate_bytes=rotate, copy_bytes_per_s=meta["copy_bytes_per_s"],
        max_case_bytes=int(FLAGS.max_case_gb * 2**30), max_gather_bytes=int(FLAGS.max_gather_gb * 2**30),
        flex=FLAGS.flex and cuda, flex_compile=FLAGS.flex_compile,
        flex_compile_budget_s=FLAGS.flex_compile_budget_s, seed=FLAGS.seed,
        max_impl_s=FLAGS.max_impl_s, serving_peers=FLAGS.serving_peers and cuda,
        flashinfer_jit=FLAGS.flashinfer_jit)
    meta["workspace_bytes"] = workspace_mb << 20
    print("\n".join(report.header_lines(meta)), flush=True)

    rows = []
    for case in cases:
        elapsed = time.perf_counter() - start
        if FLAGS.time_budget_s and elapsed > FLAGS.time_budget_s:
            rows.append(runner.case_row(ctx, case, "skipped",
                                        f"--time_budget_s={FLAGS.time_budget_s:g} spent"))
            _progress(rows[-1])
            continue
        for row in runner.run_case(ctx, case):
            rows.append(row)
            _progress(row)
        meta["elapsed_s"] = time.perf_counter() - start
        meta["flex_compile_s"] = ctx.flex_spent_s
        report.write_json(json_path, meta, rows)

    meta["elapsed_s"] = time.perf_counter() - start
    meta["flex_compile_s"] = ctx.flex_spent_s
    meta["load_average_end"] = list(os.getloadavg())
    meta["serving_peers"] = serving_peers.versions() if ctx.serving_peers else {}
    written = ["bench.json", "bench.md"]
    if FLAGS.plot:
        why_not = plot.save_plot(rows, meta, os.path.join(FLAGS.out_dir, "bench.png"))
        if why_not:
            meta["notes"].append(why_not)
        else:
            written.append("bench.png")
    report.write_json(json_path, meta, rows)
    text = "\n".join(report.header_lines(meta)) + "\n\n" + report.markdown_table(rows, device.type) + "\n"
    summary = report.peer_summary(rows, device.type)
    if summary:
        text += ("\nsplitkv against the fastest other implementation and the fastest FlashInfer / "
                 "FA3 row of each case (prefill: ragged rows at page '-', paged rows at their "
                 "page size):\n\n" + summary + "\n")
    with open(os.path.join(FLAGS.out_dir, "bench.md"), "w") as f:
        f.write(text)
    print("\n" + text + "".join(f"note: {n}\n" for n in meta["notes"]))
    print(f"wrote {', '.join(written)} to {FLAGS.out_dir} in {meta['elapsed_s']:.0f} s")
    bad = [r for r in rows if r["impl"].startswith("splitkv") and r["status"] in ("FAIL", "error")]
    if bad:
        print(f"bench: {len(bad)} splitkv row(s) failed: " + "; ".join(
            f"{r['shape']} {r['impl']}: {r['status']} {r['note']}" for r in bad), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
