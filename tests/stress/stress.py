"""Stress run: thousands of randomized paged and ragged launches on one workspace.

Every launch draws a problem from a pool of random shapes (paged decode, speculative
decode and chunked prefill over caches of any layout and form; ragged prefill with empty
and short requests), a split count (forced, or planned), the workspace bytes it is given
(near the limit included: exactly what it needs, one alignment unit less, the counter
region only) and garbage for the workspace past the counters. After each launch the
counter region must be zero, the output and LSE must match the float64 reference, a forced
split count the bytes cannot hold must be refused with its message, and a repeat of a
(problem, split count) must give the same bits. It ends with a table of counts and exits
nonzero on any failure.

    python3 tests/stress/stress.py                                  # CPU, CI size (20,000)
    python3 tests/stress/stress.py --launches=20000 --seed=7       # bigger
    python3 tests/stress/stress.py --device=cuda --launches=100000 # on the GPU machine

Needs `splitkv` and `splitkv_reference` importable (Bazel's runfiles, PYTHONPATH=.device on
the GPU machine, or a local build found like tests/python/conftest.py does) and tests/python
(found from here).
"""

import collections
import os
import random
import sys
import time

from absl import app
from absl import flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "python"))  # harness
try:
    import splitkv
except ImportError:  # a source checkout: conftest finds the extension built by Bazel
    import conftest  # noqa: F401
    import splitkv

import torch  # noqa: E402

import harness  # noqa: E402

import stress_launch  # noqa: E402
import stress_problems  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("launches", 20000, "Launches to make (the CI size by default).")
flags.DEFINE_integer("seed", 0, "Seed of every random choice (shapes, options, sizes).")
flags.DEFINE_string("device", "cpu", "Device of the tensors and the workspace: cpu or cuda.")
flags.DEFINE_integer("problems", 0, "Problems in the pool (0: launches / 8, at most "
                     "1000 on the CPU and 800 on CUDA).")
flags.DEFINE_integer("workspace_mib", 0, "Workspace size in MiB (0: 40 on the CPU, 256 on CUDA).")
flags.DEFINE_integer("sync_every", 0, "Launches between syncs that resolve device-side "
                     "checks (0: 1 on the CPU, 250 on CUDA).")
flags.DEFINE_integer("show_failures", 10, "Failing launches printed in full.")
flags.DEFINE_enum("profile", None, sorted(stress_problems.PROFILES),
                  "Shapes to draw (default: the device's); --profile=cuda on the CPU tries "
                  "the GPU run's shapes on the CPU backend.")


def _defaults(device):
    cuda = device.type == "cuda"
    problems = FLAGS.problems or max(1, min(FLAGS.launches // 8, 800 if cuda else 1000))
    workspace_mib = FLAGS.workspace_mib or (256 if cuda else 40)
    sync_every = FLAGS.sync_every or (250 if cuda else 1)
    return problems, workspace_mib, sync_every


class Tally:
    """Counts of what ran and what failed."""

    def __init__(self):
        self.counts = collections.Counter()
        self.splits = collections.Counter()
        self.failures = collections.Counter()
        self.failed = []
        self.out_error = collections.defaultdict(float)  # dtype name -> max
        self.lse_error = 0.0
        self.combos = set()

    def add(self, launch):
        entry = launch.entry
        c = self.counts
        c["launches"] += 1
        c[entry.kind] += 1
        c["forced" if launch.num_splits is not None else "planned"] += 1
        c["mode " + launch.workspace_mode] += 1
        c["with out="] += launch.use_out
        c["with lse"] += launch.return_lse
        if launch.expected_refusal:
            c["refused as expected"] += not launch.failures
        else:
            self.splits[launch.used_splits] += 1
            c["lowered to fit"] += launch.lowered
            self.combos.add((entry.index, launch.used_splits))
        dtype = harness.DTYPE_NAMES[entry.problem.dtype]
        if launch.out_error is not None:
            self.out_error[dtype] = max(self.out_error[dtype], launch.out_error)
        if launch.lse_error is not None:
            self.lse_error = max(self.lse_error, launch.lse_error)
        for kind in launch.failures:
            self.failures[kind] += 1
        if launch.failures:
            self.failed.append(launch)

    @property
    def failed_launches(self):
        return len(self.failed)


def _flush(pending, tally, workspace):
    if not pending:
        return
    if workspace.device.type == "cuda":
        torch.cuda.synchronize(workspace.device)
    try:  # the library's own check too, once per sync
        workspace.check_counter_region()
    except ValueError as error:
        pending[-1].fail("counters", str(error))
    for launch in pending:
        launch.resolve()
        tally.add(launch)
    pending.clear()


def _table(rows):
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def _summary(tally, pool, device, seed, times, workspace_mib):
    c = tally.counts
    launches = c["launches"]
    shapes = len({entry.shape for entry in pool})
    splits = ", ".join(f"{n}: {count}" for n, count in sorted(tally.splits.items()))
    modes = ", ".join(f"{mode} {c['mode ' + mode]}" for mode, _ in stress_launch.WORKSPACE_MODES)
    errors = ", ".join(f"{dtype} {error:.2e}" for dtype, error in sorted(tally.out_error.items()))
    failures = ", ".join(f"{kind} {tally.failures[kind]}" for kind in stress_launch.FAILURES)
    per_launch = 1e3 * times["launches"] / max(launches, 1)
    rows = [
        ("device / seed", f"{device} / {seed}"),
        ("launches", f"{launches} ({c['paged']} paged, {c['ragged']} ragged, interleaved)"),
        ("shapes", f"{shapes} distinct in a pool of {len(pool)} problems; "
                   f"{len(tally.combos)} (problem, num_splits) pairs run"),
        ("num_splits", f"{c['forced']} forced, {c['planned']} planned "
                       f"({c['lowered to fit']} lowered to fit)"),
        ("num_splits used", splits),
        ("workspace bytes", f"{modes} (of {workspace_mib} MiB)"),
        ("refused as expected", f"{c['refused as expected']} (forced num_splits too big)"),
        ("out= / return_lse", f"{c['with out=']} / {c['with lse']}"),
        ("max |out - ref|", errors),
        ("max |lse - ref|", f"{tally.lse_error:.2e}"),
        ("failures", f"{tally.failed_launches} launches ({failures})"),
        ("time", f"pool {times['pool']:.1f} s, launches {times['launches']:.1f} s "
                 f"({per_launch:.2f} ms per launch and check)"),
    ]
    return "splitkv stress summary\n" + _table(rows)


def main(argv):
    del argv
    device = torch.device(FLAGS.device)
    if device.type == "cuda" and not splitkv.cuda_backend_available():
        raise app.UsageError("--device=cuda needs splitkv built with --config=cuda")
    problems, workspace_mib, sync_every = _defaults(device)
    rng = random.Random(FLAGS.seed)
    torch.manual_seed(FLAGS.seed)
    workspace = splitkv.Workspace(workspace_mib << 20, device)
    keep_bytes = (2 << 30) if device.type == "cuda" else (256 << 20)
    runner = stress_launch.Runner(workspace, keep_bytes)

    start = time.perf_counter()
    pool = [stress_problems.make_entry(i, rng, device, workspace, FLAGS.profile)
            for i in range(problems)]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times = {"pool": time.perf_counter() - start}
    print(f"pool: {len(pool)} problems in {times['pool']:.1f} s; {FLAGS.launches} launches "
          f"on one {workspace_mib} MiB workspace ({device})", flush=True)

    tally = Tally()
    pending = []
    start = time.perf_counter()
    report_every = max(1, FLAGS.launches // 10)
    for number in range(FLAGS.launches):
        entry = pool[rng.randrange(len(pool))]
        pending.append(runner.run(stress_launch.choose(number, rng, entry, workspace)))
        if len(pending) >= sync_every or number + 1 == FLAGS.launches:
            _flush(pending, tally, workspace)
        if (number + 1) % report_every == 0:
            print(f"  {number + 1} launches, {time.perf_counter() - start:.1f} s, "
                  f"{tally.failed_launches} failed", flush=True)
    times["launches"] = time.perf_counter() - start

    for launch in tally.failed[:FLAGS.show_failures]:
        print(f"FAILED {launch.describe()}\n    {launch.failures}")
    print(_summary(tally, pool, device, FLAGS.seed, times, workspace_mib))
    if tally.failed_launches or tally.counts["launches"] != FLAGS.launches:
        print(f"FAIL: {tally.failed_launches} of {FLAGS.launches} launches failed")
        return 1
    print(f"OK: {FLAGS.launches} launches, 0 failures")
    return 0


if __name__ == "__main__":
    app.run(main)
