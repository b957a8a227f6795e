"""One randomized launch of the stress run: what it chooses, the call, and its checks.

A launch picks its split count (forced or planned), the workspace bytes it is given (the whole
workspace, exactly what it needs, one alignment unit less, only the counter region, or an
odd size), the garbage left in the workspace past the counters, and whether ``out=`` and
the LSE are used. Checks that need the result stay on the device as 0-d tensors until the
runner syncs (every launch on the CPU, every few hundred on a GPU), so a GPU run is not
paced by host round trips.
"""

import dataclasses
import re

import torch

import harness
import splitkv

COUNTER_BYTES = splitkv.COUNTER_REGION_BYTES
ALIGNMENT = splitkv.WORKSPACE_ALIGNMENT

# Failure kinds, in the order the summary lists them.
FAILURES = {
    "out": "output off the reference",
    "lse": "LSE off the reference",
    "counters": "counter region not zero after the call",
    "nondeterministic": "bits differ from an earlier launch with the same splits",
    "plan": "plan broke the layout or fit rules",
    "refusal": "refused wrongly, or not refused",
    "error": "unexpected exception",
}
FORCED_SPLITS = (1, 2, 2, 3, 4, 5, 7, 8, 13, 16, 64, 100)
WORKSPACE_MODES = (("full", 50), ("exact", 15), ("short", 15), ("counters_only", 10), ("odd", 10))
POISON_BYTES = (0xFF, 0x7F, 0x00, 0x80, 0xA5)  # NaN, 3.4e38, 0, -4.7e-38, noise (as fp32)


@dataclasses.dataclass
class Launch:
    number: int
    entry: object               # stress_problems.Entry
    num_splits: object          # None: planned
    workspace_mode: str
    nbytes: int
    poison: int
    use_out: bool
    return_lse: bool
    expected_refusal: str = ""  # a regex the ValueError must match, or "" (must run)
    used_splits: int = 0
    lowered: bool = False
    failures: dict = dataclasses.field(default_factory=dict)   # kind -> detail (host)
    pending: dict = dataclasses.field(default_factory=dict)    # kind -> 0-d bool tensor
    out_error: object = None    # 0-d float64 tensor: max |out - reference|
    lse_error: object = None

    def fail(self, kind, detail):
        self.failures.setdefault(kind, detail)

    def resolve(self):
        """Turns the device-side checks into failures (call after a sync)."""
        for kind, flag in self.pending.items():
            if bool(flag):
                self.fail(kind, "see the errors" if kind in ("out", "lse") else "")
        self.pending = {}
        errors = [None if e is None else float(e) for e in (self.out_error, self.lse_error)]
        self.out_error, self.lse_error = errors
        return self.failures

    def describe(self):
        return (f"launch {self.number}: {self.entry.describe()} num_splits={self.num_splits} "
                f"(used {self.used_splits}) workspace={self.workspace_mode}:{self.nbytes} "
                f"poison=0x{self.poison:02X} out={self.use_out} lse={self.return_lse} "
                f"errors out={self.out_error} lse={self.lse_error}")


def _weighted(rng, choices):
    total = sum(weight for _, weight in choices)
    roll = rng.uniform(0, total)
    for value, weight in choices:
        roll -= weight
        if roll <= 0:
            return value
    return choices[-1][0]


def choose(number, rng, entry, workspace):
    """The random choices of one launch of `entry` on `workspace` (a splitkv.Workspace)."""
    num_splits = rng.choice(FORCED_SPLITS) if rng.random() < 0.5 else None
    target = num_splits or entry.planned_splits
    need = splitkv.required_workspace_bytes(*entry.dims, target)
    mode = _weighted(rng, WORKSPACE_MODES)
    nbytes = {
        "full": workspace.nbytes,
        "exact": need,
        "short": need - ALIGNMENT,
        "counters_only": COUNTER_BYTES,
        "odd": need + rng.randint(1, ALIGNMENT - 1),
    }[mode]
    nbytes = max(COUNTER_BYTES, min(workspace.nbytes, nbytes))
    launch = Launch(number, entry, num_splits, mode, nbytes, rng.choice(POISON_BYTES),
                    use_out=rng.random() < 0.5, return_lse=rng.random() < 0.7)
    if num_splits is not None and need > nbytes:
        op = f"{entry.kind}_attention"
        launch.expected_refusal = (rf"{op}: workspace too small: need {need} bytes for "
                                   rf"num_splits={num_splits}, got {nbytes}; .*")
    return launch


def _mismatch(actual, expected, atol, rtol):
    """(failed, max error) as 0-d device tensors; infinities must match exactly."""
    if expected.numel() == 0:
        zero = torch.zeros((), dtype=torch.float64, device=expected.device)
        return zero.bool(), zero
    a = actual.to(torch.float64)
    equal = a == expected
    diff = torch.where(equal, torch.zeros_like(a), (a - expected).abs())
    close = equal | (diff <= atol + rtol * expected.abs())
    return ~close.all(), diff.max()


def _bits_equal(a, b):
    """0-d bool tensor: a and b hold the same bits (NaN payloads included)."""
    if a.shape != b.shape:
        return torch.zeros((), dtype=torch.bool, device=a.device)
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return (a.contiguous().view(bits) == b.contiguous().view(bits)).all()


class Runner:
    """Runs launches on one workspace and remembers the first result of each (problem,
    split count) to check later ones bit for bit."""

    def __init__(self, workspace, keep_bytes):
        self.workspace = workspace
        self.first = {}
        self.kept_bytes = 0
        self.keep_bytes = keep_bytes

    def _buffer(self, launch):
        if launch.workspace_mode == "full":
            return self.workspace  # the Workspace itself (its in-use lock included)
        return self.workspace.tensor[:launch.nbytes]

    def _check_plan(self, launch, plan):
        entry = launch.entry
        regions = plan.layout.regions()
        if regions["counter"] != (0, COUNTER_BYTES):
            launch.fail("plan", f"counter region moved: {regions}")
        for name in ("softmax", "scratch"):
            if plan.num_splits > 1 and regions[name][0] < COUNTER_BYTES:
                launch.fail("plan", f"{name} overlaps the counters: {regions}")
        if plan.layout.required_bytes > launch.nbytes:
            launch.fail("plan", f"needs {plan.layout.required_bytes} of {launch.nbytes} bytes")
        if launch.num_splits is not None:
            if plan.num_splits != launch.num_splits:
                launch.fail("plan", f"forced {launch.num_splits}, planned {plan.num_splits}")
            return
        wanted = entry.planned_splits
        if plan.num_splits > wanted:
            launch.fail("plan", f"{plan.num_splits} splits, more than the {wanted} planned "
                        "on the full workspace")
        elif plan.num_splits < wanted:
            launch.lowered = True
            # Lowered to the largest count that fits, never further.
            more = splitkv.required_workspace_bytes(*entry.dims, plan.num_splits + 1)
            if more <= launch.nbytes:
                launch.fail("plan", f"lowered to {plan.num_splits} though "
                            f"{plan.num_splits + 1} fit in {launch.nbytes} bytes")

    def _poison(self, launch, plan):
        end = min(launch.nbytes, plan.layout.required_bytes + (64 << 10))
        if end > COUNTER_BYTES:
            self.workspace.tensor[COUNTER_BYTES:end].fill_(launch.poison)

    def _check_bits(self, launch, out, lse):
        key = (launch.entry.index, launch.used_splits)
        if key not in self.first:
            size = out.numel() * out.element_size()
            if self.kept_bytes + size <= self.keep_bytes:
                self.first[key] = (out.clone(), None if lse is None else lse.clone())
                self.kept_bytes += size
            return
        first_out, first_lse = self.first[key]
        differs = ~_bits_equal(first_out, out)
        if lse is not None and first_lse is not None:
            differs = differs | ~_bits_equal(first_lse, lse)
        launch.pending["nondeterministic"] = differs

    def run(self, launch):
        """Makes the call and queues its checks; host-side failures are recorded at once."""
        entry = launch.entry
        problem = entry.problem
        buffer = self._buffer(launch)
        options = dict(entry.options, num_splits=launch.num_splits)
        if launch.expected_refusal:
            try:
                problem.run(buffer, **options)
                launch.fail("refusal", "not refused")
            except ValueError as error:
                if not re.fullmatch(launch.expected_refusal, str(error)):
                    launch.fail("refusal", f"message {str(error)!r}")
            except Exception as error:  # noqa: BLE001 - any other type is a failure
                launch.fail("error", f"{type(error).__name__}: {error}")
        else:
            try:
                plan = problem.plan(buffer, **options)
                launch.used_splits = plan.num_splits
                self._check_plan(launch, plan)
                self._poison(launch, plan)
                out = torch.full_like(problem.q, float("nan")) if launch.use_out else None
                result = problem.run(buffer, out=out, return_lse=launch.return_lse, **options)
            except Exception as error:  # noqa: BLE001 - every exception is a failure here
                launch.fail("error", f"{type(error).__name__}: {error}")
            else:
                got, lse = result if launch.return_lse else (result, None)
                if launch.use_out and got is not out:
                    launch.fail("error", "out= was not the tensor returned")
                atol, rtol = harness.OUT_TOLERANCE[problem.dtype]
                launch.pending["out"], launch.out_error = _mismatch(got, entry.out_ref, atol, rtol)
                if lse is not None:
                    atol, rtol = harness.LSE_TOLERANCE
                    launch.pending["lse"], launch.lse_error = _mismatch(lse, entry.lse_ref,
                                                                        atol, rtol)
                self._check_bits(launch, got, lse)
        if self.workspace.device.type == "cpu":
            try:  # the library's scan: a few ms, where torch's any() takes several times that
                splitkv.check_counter_region(self.workspace)
            except ValueError as error:
                launch.fail("counters", str(error))
        else:  # stays on the GPU until the next sync
            counters = self.workspace.tensor[:COUNTER_BYTES].view(torch.int32)
            launch.pending["counters"] = counters.any()
        return launch
