"""Replays the Azure LLM inference trace through splitkv with continuous batching.

    ./tools/bazel run //:replay -- --max_requests=20

See tools/replay/README.md for the model of time, the scheduler and the checks. Exits 0
when every check passed, 1 when one failed (or a call raised), 2 for a refused option or
trace (absl's own flag parsing errors exit 1).
"""

import dataclasses
import math
import os
import sys

from absl import app
from absl import flags
import torch

import splitkv
from tools.replay import presets
from tools.replay.runner import FAULTS, ReplayConfig, run_replay
from tools.replay.context_parallel import control_group, gather_outcomes, outcome
from tools.replay.summary import context_parallel_rows, format_summary, summary_rows
from tools.replay.trace import load_trace

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DEFAULT_TRACE = "data/azure_llm_inference_2023/conv.csv"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

FLAGS = flags.FLAGS
flags.DEFINE_string("trace", _DEFAULT_TRACE,
                    "Trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens); the default is the Azure "
                    "conversation trace in the repository (CC BY 4.0, see its README.md).")
flags.DEFINE_integer("max_requests", 200, "Requests replayed from the top of the trace; 0 replays all.")
flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"],
                  "auto: cuda when torch sees a GPU and splitkv has its CUDA backend, else cpu.")
flags.DEFINE_enum("model", presets.DEFAULT_PRESET, sorted(presets.PRESETS),
                  "Attention shape preset: " + "; ".join(
                      f"{name}: {p.num_qo_heads}/{p.num_kv_heads} heads, head_dim {p.head_dim}, "
                      f"page {p.page_size} ({p.description})" for name, p in sorted(presets.PRESETS.items())))
flags.DEFINE_enum("dtype", "bfloat16", sorted(_DTYPES), "Q/K/V and output dtype.")
flags.DEFINE_enum("kv_dtype", "same", ["same", "fp8_e4m3"],
                  "Dtype of the paged KV pool and the ragged prefills' K/V: same (--dtype) or fp8_e4m3 "
                  "(torch.float8_e4m3fn with per-kv-head k_scale/v_scale = amax / 448 of a seeded "
                  "calibration sample, fixed before the first token is written; --dtype bfloat16 or "
                  "float16). The checks compare with float64 attention on the dequantized K/V.")
flags.DEFINE_enum("kv_layout", "HND", ["HND", "NHD"], "Layout of the paged KV cache.")
flags.DEFINE_integer("page_size", 0, "Tokens per page; 0 takes the preset's.")
flags.DEFINE_integer("num_pages", 8192, "Pages in the KV pool (a request waits while its pages do not fit).")
flags.DEFINE_integer("max_batch_size", 128, "Most requests prefilling or decoding in one step.")
flags.DEFINE_integer("max_prefill_tokens", 16384,
                     "Most prompt tokens prefilled in one step (one request is always admitted).")
flags.DEFINE_float("step_ms", 20.0, "Simulated time one step takes; maps trace timestamps to steps.")
flags.DEFINE_integer("max_generated_tokens", 0,
                     "Cap on GeneratedTokens replayed per request; 0 replays the trace's counts. "
                     "The summary prints the cap in force.")
flags.DEFINE_integer("check_every", 10,
                     "Check every Nth prefill call and every Nth decode call (from the first) "
                     "against float64; 0 turns output checks off (the counter region is checked "
                     "after every step regardless).")
flags.DEFINE_integer("seed", 0, "Seeds the Q/K/V values and the page allocator's order.")
flags.DEFINE_integer("workspace_mb", 128, "Workspace size in MiB (counter region included).")
flags.DEFINE_integer("prefill_num_splits", 0, "Forces num_splits on the ragged prefills; 0 lets the planner choose.")
flags.DEFINE_integer("decode_num_splits", 0, "Forces num_splits on the paged decodes; 0 lets the planner choose.")
flags.DEFINE_integer("torch_threads", 1,
                     "Threads for the replay's own CPU torch work (token data, cache writes, float64 "
                     "checks); 0 keeps torch's default, and at most the machine's CPU count (far more "
                     "crashed torch's thread pool). splitkv's CPU backend has its own pool "
                     "(SPLITKV_NUM_THREADS). One thread keeps these small ops from fighting that pool "
                     "for the cores, which made them 5-20x slower with two.")
flags.DEFINE_integer("context_parallel", 1,
                     "Ranks sharing each request's KV pages (context parallelism); > 1 needs "
                     "`torchrun --nproc_per_node=N` with the same N (gloo on the CPU, NCCL on GPUs, "
                     "one GPU per rank). Every rank runs the checks; rank 0 prints the summary.")
flags.DEFINE_bool("batch_invariant", False,
                  "Run every call with batch_invariant=True and, at the calls the float64 checks sample, "
                  "re-run requests alone (every request of a prefill; the first, middle and last of a "
                  "decode) and compare out and lse bitwise. On CUDA the workspace grows to what the "
                  "invariant splits need.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.DEFINE_enum("inject_fault", "none", list(FAULTS),
                  "Testing the checks only: 'output' perturbs the first checked output, 'counter' "
                  "leaves a counter nonzero after step 0; either must make the replay exit 1.")


def _user_path(path):
    """A relative --trace is taken from where `bazel run` was started; the default from the repo."""
    if os.path.isabs(path):
        return path
    if path != _DEFAULT_TRACE and "BUILD_WORKING_DIRECTORY" in os.environ:
        return os.path.join(os.environ["BUILD_WORKING_DIRECTORY"], path)
    return os.path.join(_REPO_ROOT, path)


def _device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() and splitkv.cuda_backend_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise _refuse("replay: --device invalid: expected a device torch can use, got 'cuda' "
                             "(torch.cuda.is_available() is False); use --device=cpu")
    return torch.device(name)


def _refuse(message):
    """A refused option: absl prints the message and exits 2."""
    return app.UsageError(message, exitcode=2)


def _positive(name, value, low=1):
    if value < low:
        raise _refuse(f"replay: --{name} invalid: expected >= {low}, got {value}")


def _context_parallel(n, device):
    """(rank, device) of this process; with n > 1, after joining torchrun's process group."""
    if n == 1:
        return 0, device
    world = os.environ.get("WORLD_SIZE")
    if world != str(n):
        raise _refuse(f"replay: --context_parallel={n} invalid: expected a launch by torchrun "
                      f"--nproc_per_node={n} (WORLD_SIZE {n}), got WORLD_SIZE {world or 'unset'}")
    import datetime

    import torch.distributed as dist

    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # A rank that raises leaves the others waiting in a collective: they give up after this.
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=300))
    return dist.get_rank(), device


def _report(result, rank_prefix=""):
    """Prints one rank's failed checks and errors to stderr."""
    failures = result["failures"]
    for message in failures[:10]:
        print(f"{rank_prefix}check failed: " + message, file=sys.stderr)
    if len(failures) > 10:
        print(f"{rank_prefix}... and {len(failures) - 10} more failed checks", file=sys.stderr)
    if result["counter_failure"]:
        print(f"{rank_prefix}check failed: " + result["counter_failure"], file=sys.stderr)
    if result["error"]:
        print(f"{rank_prefix}replay stopped: " + result["error"], file=sys.stderr)


def main(argv):
    if len(argv) > 1:
        raise _refuse(f"replay: unexpected arguments: expected only flags, got {argv[1:]}")
    for name, low in (("max_requests", 0), ("num_pages", 1), ("max_batch_size", 1),
                      ("max_prefill_tokens", 1), ("max_generated_tokens", 0), ("check_every", 0),
                      ("workspace_mb", 1), ("page_size", 0), ("prefill_num_splits", 0),
                      ("decode_num_splits", 0), ("torch_threads", 0), ("context_parallel", 1)):
        _positive(name, getattr(FLAGS, name), low)
    # splitkv takes num_splits and page indices as int32; torch's generators take a seed that
    # fits 64 bits (the replay adds offsets of up to 2**33 per layer, so int64 is the range).
    for name, high in (("prefill_num_splits", 2**31 - 1), ("decode_num_splits", 2**31 - 1),
                       ("num_pages", 2**31 - 1), ("torch_threads", os.cpu_count() or 1)):
        if getattr(FLAGS, name) > high:
            raise _refuse(f"replay: --{name} invalid: expected <= {high}, got {getattr(FLAGS, name)}")
    if not -2**63 <= FLAGS.seed < 2**63:
        raise _refuse(f"replay: --seed invalid: expected -2**63 .. 2**63 - 1 (int64), got {FLAGS.seed}")
    if FLAGS.inject_fault == "output" and FLAGS.check_every == 0:
        raise _refuse("replay: --inject_fault=output conflicts with --check_every=0: expected output "
                      "checks on (--check_every >= 1), or the fault is never injected nor caught")
    if FLAGS.batch_invariant and (FLAGS.prefill_num_splits or FLAGS.decode_num_splits):
        raise _refuse("replay: --batch_invariant conflicts with a forced num_splits: expected "
                      "--prefill_num_splits=0 and --decode_num_splits=0, got "
                      f"{FLAGS.prefill_num_splits} and {FLAGS.decode_num_splits}")
    fp8 = FLAGS.kv_dtype == "fp8_e4m3"
    if fp8 and FLAGS.dtype == "float32":
        raise _refuse("replay: --kv_dtype=fp8_e4m3 conflicts with --dtype=float32: expected --dtype "
                      "bfloat16 or float16 (splitkv takes fp8 K/V with 16-bit q)")
    if not (FLAGS.step_ms > 0 and math.isfinite(FLAGS.step_ms)):
        raise _refuse(f"replay: --step_ms invalid: expected a finite value > 0, got {FLAGS.step_ms}")
    if FLAGS.torch_threads:
        torch.set_num_threads(FLAGS.torch_threads)
    shape = presets.get_preset(FLAGS.model)
    if FLAGS.page_size:
        shape = dataclasses.replace(shape, page_size=FLAGS.page_size)
    trace_path = _user_path(FLAGS.trace)
    try:
        requests = load_trace(trace_path, FLAGS.max_requests)
    except ValueError as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    rank, device = _context_parallel(FLAGS.context_parallel, _device(FLAGS.device))
    config = ReplayConfig(
        requests=requests, shape=shape, device=device, dtype=_DTYPES[FLAGS.dtype],
        kv_dtype=torch.float8_e4m3fn if fp8 else None, kv_layout=FLAGS.kv_layout, num_pages=FLAGS.num_pages, max_batch_size=FLAGS.max_batch_size,
        max_prefill_tokens=FLAGS.max_prefill_tokens, step_seconds=FLAGS.step_ms / 1e3,
        max_generated_tokens=FLAGS.max_generated_tokens, check_every=FLAGS.check_every,
        seed=FLAGS.seed, workspace_bytes=FLAGS.workspace_mb << 20,
        prefill_num_splits=FLAGS.prefill_num_splits, decode_num_splits=FLAGS.decode_num_splits,
        batch_invariant=FLAGS.batch_invariant, inject_fault=FLAGS.inject_fault,
        progress=FLAGS.progress and rank == 0, context_parallel=FLAGS.context_parallel, rank=rank)
    try:
        result = run_replay(config)
    except ValueError as e:  # options the scheduler or splitkv refuse before the first step
        print(f"replay: {e}", file=sys.stderr)
        return 2
    shown = FLAGS.trace if FLAGS.trace == _DEFAULT_TRACE else trace_path
    which = f"first {len(requests)}" if FLAGS.max_requests else f"all {len(requests)}"
    rows = summary_rows(config, result, f"{shown} ({which} requests)", FLAGS.model)
    outcomes = [outcome(result)]
    if FLAGS.context_parallel > 1:
        outcomes = gather_outcomes(result, control_group())
        rows = context_parallel_rows(rows, outcomes)
    if rank == 0:
        print(format_summary(rows))
    _report(outcomes[rank], f"rank {rank}: " if FLAGS.context_parallel > 1 else "")
    if FLAGS.context_parallel > 1:
        # The group's threads must end before the interpreter does: left running, they
        # crashed a rank at exit now and then (std::terminate, SIGSEGV) after a PASS.
        torch.distributed.destroy_process_group()
    return 0 if all(o["ok"] for o in outcomes) else 1


if __name__ == "__main__":
    app.run(main)
