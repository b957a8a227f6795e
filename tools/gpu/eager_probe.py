"""Why a long prefill's eager figure trails its graph figure (docs/perf_log.md 2026-12-05,
session 40: ~190 us of GPU time at d128 1 x 16384 for splitkv and cuDNN, ~35 for FA3).

    PYTHONPATH=.device:/tmp/site python3 tools/gpu/eager_probe.py [splitkv] [fa3]

Times one causal ragged prefill (bf16, 32 qo / 8 kv heads, head_dim 128; the shapes below)
over four rotated input copies, in these ways (microseconds per call, medians):
  graph      tools/bench/timing.py's graph figure (calls back to back, host out of the way)
  idle       the bench's eager figure: event, call, event, synchronize, from an idle GPU
  queued     the same behind a ~1 ms sleep kernel, so the host's launch work is hidden
  idle_sleep idle after 5 ms of host sleep (clocks and power state after a pause)
  eager_b2b  four eager calls back to back behind the sleep, per call
  after_same the same copy twice in a row, the second timed (its inputs warm in L2)
If queued matches graph, the gap is the host's or the launch's; if it matches idle, it is
the kernel's own start from an idle GPU.
"""

import os
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)

import torch  # noqa: E402

import splitkv  # noqa: E402
from tools.bench import inputs, shapes, timing  # noqa: E402
from tools.gpu import prefill_profile  # noqa: E402

_SHAPES = ("1x16384", "4x4096")
_COPIES = 4
_SAMPLES = 24
_SLEEP_CYCLES = 2_000_000


def _event():
    return torch.cuda.Event(enable_timing=True)


def _timed(call, before=None):
    """Microseconds from an event recorded after `before` to the end of `call`'s work."""
    start, end = _event(), _event()
    if before is not None:
        before()
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _median_per_call(calls, before):
    times = []
    for i in range(_SAMPLES):
        torch.cuda.synchronize()
        times.append(_timed(calls[i % len(calls)], before))
    return statistics.median(times)


def probe(calls):
    # graph, idle and eager_b2b are tools/bench/timing.py's own figures (graph replays, the
    # bench's eager column, an eager round behind its sleep), so they read as the bench does.
    cuda = torch.device("cuda", 0)
    result = {"graph": timing.time_calls(calls, cuda, 5, 20)[0] * 1e6,
              "idle": timing.time_eager(calls, 0, _SAMPLES) * 1e6}
    result["queued"] = _median_per_call(calls, lambda: torch.cuda._sleep(_SLEEP_CYCLES))
    result["idle_sleep"] = _median_per_call(calls, lambda: time.sleep(0.005))
    result["eager_b2b"] = timing.time_calls(calls, cuda, 1, 6, use_graph=False)[0] * 1e6
    result["after_same"] = statistics.median([_timed(calls[0], calls[0]) for _ in range(12)])
    return result


def main(argv):
    impls = argv or ["splitkv", "fa3"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    workspace = splitkv.Workspace(1 << 30, "cuda")
    for spec in _SHAPES:
        batch, length = (int(x) for x in spec.split("x"))
        case = shapes.PrefillCase((length,) * batch, spec)
        copies = inputs.prefill_copies(case, torch.bfloat16, torch.device("cuda", 0), _COPIES, gen)
        for impl in impls:
            try:
                call = prefill_profile.make_calls(impl, case, copies, workspace)
                calls = [lambda i=i: call(i) for i in range(_COPIES)]
                for c in calls:
                    c()
                torch.cuda.synchronize()
            except ImportError as exc:
                print(f"{impl:<8} {spec:<8} skipped: {exc}", flush=True)
                continue
            figures = probe(calls)
            print(f"{impl:<8} {spec:<8} " + "  ".join(f"{k} {v:8.1f}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
