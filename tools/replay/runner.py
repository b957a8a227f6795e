"""The replay loop: schedule a step, write its tokens into the paged cache, run its ragged
prefill and paged decode through splitkv with one workspace (for each replayed layer:
layers.py), check, repeat."""

import contextlib
import dataclasses
import math
import os
import time

import torch
import tqdm

import splitkv
from tools.replay import checks
from tools.replay.context_parallel import ShardedCalls, any_rank
from tools.replay import invariance
from tools.replay.invariance import InvarianceStats
from tools.replay.layers import make_layers
from tools.replay.presets import layers as layer_kinds
from tools.replay.page_allocator import PageAllocator
from tools.replay.scheduler import Scheduler
from tools.replay.timing import AttentionTimer

FAULTS = ("none", "output", "counter")


@dataclasses.dataclass
class ReplayConfig:
    requests: list  # TraceRequest
    shape: object  # presets.AttentionShape
    device: torch.device
    dtype: torch.dtype
    kv_layout: str = "HND"
    # The paged pool's (and the ragged K/V's) dtype: None for dtype, or torch.float8_e4m3fn
    # (per-kv-head scales from the data: kv_quant.py).
    kv_dtype: torch.dtype = None
    num_pages: int = 8192
    max_batch_size: int = 128
    max_prefill_tokens: int = 16384
    step_seconds: float = 0.02
    max_generated_tokens: int = 0
    check_every: int = 10
    seed: int = 0
    workspace_bytes: int = 128 << 20
    prefill_num_splits: int = 0
    decode_num_splits: int = 0
    # Every call with batch_invariant=True, and sampled requests re-run alone (invariance.py)
    # at the calls the float64 checks sample.
    batch_invariant: bool = False
    inject_fault: str = "none"  # testing the checks themselves
    progress: bool = True
    # --context_parallel: this rank of a default process group of `context_parallel` ranks
    # (tools/replay/context_parallel.py); 1 runs the single-process replay.
    context_parallel: int = 1
    rank: int = 0


@dataclasses.dataclass
class ReplayResult:
    steps: int = 0
    prefill_calls: int = 0
    decode_calls: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    finished: int = 0
    simulated_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    wall_s: float = 0.0
    peak_batch_size: int = 0
    peak_waiting: int = 0
    peak_pages_in_use: int = 0
    workspace_bytes: int = 0
    counter_region_bytes: int = 0
    counter_steps_checked: int = 0
    counter_failure: str = None
    check_stats: checks.CheckStats = None
    invariance: InvarianceStats = None  # with --batch_invariant
    error: str = None  # an exception from a call, which stops the replay
    # Calls whose plan split the KV (num_splits > 1, so they used counters), and the most splits.
    split_calls: dict = dataclasses.field(default_factory=lambda: {"prefill": 0, "decode": 0})
    max_num_splits: dict = dataclasses.field(default_factory=lambda: {"prefill": 1, "decode": 1})
    layers: list = None  # layers.Layer of each replayed layer (their names, windows, fp8 scales)

    @property
    def ok(self) -> bool:
        return (self.error is None and self.counter_failure is None and not self.check_stats.failures
                and (self.invariance is None or not self.invariance.failures))


def workspace_buffer(workspace) -> torch.Tensor:
    return workspace if isinstance(workspace, torch.Tensor) else workspace.tensor


class _StepRunner:
    """Runs the attention calls of one step, layer by layer, and the sampled checks."""

    def __init__(self, config, layers, workspace, timer, stats, result):
        self.config = config
        # Each layer's cache holds every token (with shards: for the checks; the calls read
        # its shards').
        self.layers = layers
        self.workspace = workspace
        self.timer = timer
        self.stats = stats
        self.result = result
        self.sm_scale = 1.0 / math.sqrt(config.shape.head_dim)
        self.fault_pending = config.inject_fault == "output"

    def _attend(self, kind, op, plan_op, *args, **kwargs):
        """Runs op timed, after asking plan_op (same arguments) how many splits it will use."""
        if self.config.batch_invariant:
            kwargs["batch_invariant"] = True
        num_splits = plan_op(*args, **kwargs).num_splits
        if num_splits > 1:
            self.result.split_calls[kind] += 1
            self.result.max_num_splits[kind] = max(self.result.max_num_splits[kind], num_splits)
        self.timer.start()
        out, lse = op(*args, return_lse=True, **kwargs)
        self.timer.stop(kind)
        return out, lse

    def _sharded_alone(self, layer, q, seqs, full_lens, options, **kwargs):
        """(out, lse) of seqs' distributed call by themselves (every rank makes the same call:
        the schedule and the sampled requests are the same on every rank)."""
        op, _, args, call_options = layer.shards.call(q, seqs, full_lens, sm_scale=self.sm_scale, **kwargs,
                                                      **options)
        return op(*args, self.workspace, return_lse=True, batch_invariant=True, **call_options)

    def _should_check(self, calls_so_far):
        return self.config.check_every > 0 and calls_so_far % self.config.check_every == 0

    def _faulty(self, out):
        """out, or with --inject_fault=output at the first check a copy with one wrong value."""
        if not self.fault_pending:
            return out
        self.fault_pending = False
        out = out.clone()
        out[0, 0, 0] += 1.0
        return out

    def prefill(self, step, seqs):
        lens = [seq.request.context_tokens for seq in seqs]
        total = sum(lens)
        cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(self.config.device)
        num_splits = self.config.prefill_num_splits or None
        check = self._should_check(self.result.prefill_calls)
        for layer in self.layers:
            # With an fp8 pool k, v are the fp8 values stored, and the ragged call reads those
            # same values (with the scales): prefill and decode see the same keys.
            q, k, v = layer.draw(total)
            page, offset = layer.cache.prompt_slots(seqs)
            layer.cache.write(page, offset, k, v)
            options = layer.call_options()
            if layer.shards is None:
                out, lse = self._attend(
                    "prefill", splitkv.ragged_attention, splitkv.plan_ragged_attention,
                    q, k, v, cu, cu, self.workspace, causal=True, sm_scale=self.sm_scale,
                    num_splits=num_splits, max_q_len=max(lens), **options)
            else:
                layer.shards.write(seqs, [range(n) for n in lens], page, offset, k, v)
                op, plan_op, args, call_options = layer.shards.call(
                    q, seqs, lens, cu_seqlens_q=cu, sm_scale=self.sm_scale, num_splits=num_splits,
                    max_q_len=max(lens), **options)
                out, lse = self._attend("prefill", op, plan_op, *args, self.workspace, **call_options)
            if check:
                checks.check_prefill(step, seqs, q, self._faulty(out), lse, layer, self.sm_scale, self.stats)
                if self.config.batch_invariant:
                    if layer.shards is None:
                        alone = invariance.ragged_alone(q, k, v, self.workspace, self.sm_scale, options)
                    else:
                        alone = lambda seq, rows, n: self._sharded_alone(
                            layer, q[rows], [seq], [n], options, max_q_len=n,
                            cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device=q.device))
                    invariance.check_prefill(step, seqs, out, lse, self.result.invariance, alone, layer.tag)
        self.result.prefill_calls += 1
        self.result.prefill_tokens += total

    def decode(self, step, seqs):
        kv_lens = [seq.kv_len + 1 for seq in seqs]
        seq_lens = torch.tensor(kv_lens, dtype=torch.int32).to(self.config.device)
        num_splits = self.config.decode_num_splits or None
        check = self._should_check(self.result.decode_calls)
        for layer in self.layers:
            q, k, v = layer.draw(len(seqs))
            page, offset = layer.cache.next_token_slots(seqs)
            layer.cache.write(page, offset, k, v)
            options = layer.call_options()
            if layer.shards is None:
                block_tables = layer.cache.block_tables(seqs)
                out, lse = self._attend(
                    "decode", splitkv.paged_attention, splitkv.plan_paged_attention,
                    q, layer.cache.kv_cache, block_tables, seq_lens, self.workspace,
                    kv_layout=self.config.kv_layout, causal=True, sm_scale=self.sm_scale,
                    num_splits=num_splits, max_q_len=1, **options)
            else:
                layer.shards.write(seqs, [range(seq.kv_len, seq.kv_len + 1) for seq in seqs], page, offset,
                                   k, v)
                op, plan_op, args, call_options = layer.shards.call(
                    q, seqs, kv_lens, sm_scale=self.sm_scale, num_splits=num_splits, max_q_len=1, **options)
                out, lse = self._attend("decode", op, plan_op, *args, self.workspace, **call_options)
            if check:
                checks.check_decode(step, seqs, kv_lens, q, self._faulty(out), lse, layer, self.sm_scale,
                                    self.stats)
                if self.config.batch_invariant:
                    if layer.shards is None:
                        alone = invariance.paged_alone(q, layer.cache.kv_cache, block_tables, seq_lens,
                                                       self.workspace, self.config.kv_layout, self.sm_scale,
                                                       options)
                    else:
                        alone = lambda i: self._sharded_alone(layer, q[i:i + 1], [seqs[i]], [kv_lens[i]],
                                                              options, max_q_len=1)
                    invariance.check_decode(step, seqs, out, lse, self.result.invariance, alone, layer.tag)
        self.result.decode_calls += 1
        self.result.decode_tokens += len(seqs)


def _physical_memory_bytes() -> int:
    """The memory available now (Linux's MemAvailable), else the machine's, else no bound."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 2**63


def _out_of_memory(error) -> bool:
    """Whether error is an allocation failure (torch.OutOfMemoryError is a RuntimeError; the
    CPU allocator raises a plain one, "can't allocate memory")."""
    return (isinstance(error, (MemoryError, torch.OutOfMemoryError))
            or "allocate" in str(error))


@contextlib.contextmanager
def _refuse_out_of_memory(what, device, got, lower):
    """An allocation failure inside becomes "run_replay: <what> too large" naming the flags
    to `lower`; other errors pass through."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if not _out_of_memory(e):
            raise
        raise ValueError(f"run_replay: {what} too large: expected one that {device} can allocate, got "
                         f"{got} ({type(e).__name__}); lower {lower}") from None


def run_replay(config: ReplayConfig) -> ReplayResult:
    """Replays config.requests; returns what happened (never raises for a failed check)."""
    if config.inject_fault not in FAULTS:
        raise ValueError(f"replay: inject_fault invalid: expected one of {FAULTS}, got {config.inject_fault!r}")
    if config.kv_dtype == config.dtype:
        config = dataclasses.replace(config, kv_dtype=None)
    wall_start = time.perf_counter()
    shape = config.shape
    pool_bytes = (config.num_pages * 2 * shape.num_kv_heads * shape.page_size * shape.head_dim
                  * (config.kv_dtype or config.dtype).itemsize * len(layer_kinds(shape))
                  * (2 if config.context_parallel > 1 else 1))  # a rank's shard pool and the full one
    available = _physical_memory_bytes() if config.device.type == "cpu" else None
    if available is not None and pool_bytes > available:
        # The pool is filled with NaN when made: past the machine's memory that is the OOM
        # killer, not an exception.
        raise ValueError(
            f"run_replay: KV pool too large: expected at most the {available} bytes "
            f"of memory available, got {pool_bytes} (num_pages {config.num_pages}, page_size {shape.page_size}); "
            f"lower --num_pages or --page_size")
    allocator = PageAllocator(config.num_pages, seed=config.seed)
    scheduler = Scheduler(config.requests, allocator, shape.page_size, config.max_batch_size,
                          config.max_prefill_tokens, config.step_seconds, config.max_generated_tokens)
    cache_args = (config.num_pages, shape.num_kv_heads, shape.page_size, shape.head_dim,
                  config.kv_dtype or config.dtype, config.device, config.kv_layout, scheduler.num_slots,
                  scheduler.max_pages_per_seq)
    with _refuse_out_of_memory("KV pool", config.device,
                               f"num_pages {config.num_pages} x page_size {shape.page_size} x "
                               f"{shape.num_kv_heads} kv heads x head_dim {shape.head_dim}",
                               "--num_pages or --page_size"):
        layers = make_layers(config, cache_args)
        if config.context_parallel > 1:
            for layer in layers:
                layer.shards = ShardedCalls(config.rank, config.context_parallel, cache_args)
    # One workspace for the whole replay, zeroed once here and never again. Batch-invariant
    # calls on CUDA need room for every split's partials (the CPU runs splits in one task).
    workspace_bytes = config.workspace_bytes
    if config.batch_invariant and config.device.type == "cuda":
        workspace_bytes = max(workspace_bytes, invariance.workspace_bytes_needed(
            config.requests, shape, config.max_prefill_tokens, scheduler.num_slots, scheduler.max_pages_per_seq))
    with _refuse_out_of_memory("workspace", config.device, f"{workspace_bytes} bytes", "--workspace_mb"):
        workspace = splitkv.Workspace(workspace_bytes, config.device)
    buffer = workspace_buffer(workspace)
    monitor = checks.CounterRegionMonitor(buffer, splitkv.COUNTER_REGION_BYTES)
    timer = AttentionTimer(config.device)
    stats = checks.CheckStats()
    result = ReplayResult(check_stats=stats, workspace_bytes=buffer.numel(),
                          counter_region_bytes=splitkv.COUNTER_REGION_BYTES,
                          invariance=InvarianceStats() if config.batch_invariant else None, layers=layers)
    runner = _StepRunner(config, layers, workspace, timer, stats, result)

    bar = tqdm.tqdm(total=len(config.requests), unit="req", desc="replay", disable=not config.progress,
                    dynamic_ncols=True)
    steps_run = 0  # beyond the completed steps
    while not scheduler.done():
        plan = scheduler.next_step()
        for layer in layers:
            layer.cache.add_pages(plan.new_pages)
        try:
            if plan.prefill:
                runner.prefill(plan.step, plan.prefill)
            if plan.decode:
                runner.decode(plan.step, plan.decode)
        except (ValueError, TypeError, RuntimeError) as e:
            result.error = f"step {plan.step}: {type(e).__name__}: {e}"
            break
        if config.inject_fault == "counter" and plan.step == 0:
            buffer[4 * 1000] = 1  # counter 1000 left nonzero, as a broken merge would
        stop = not monitor.after_step(plan.step)
        if layers[0].shards is not None:  # every rank stops at the same step, or the others would hang
            stop = any_rank(stop, layers[0].shards.control)
        if stop:
            steps_run += 1  # its calls ran and were checked: count it
            break
        finished = scheduler.complete_step(plan)
        if finished:
            bar.update(len(finished))
        if plan.step % 64 == 0:
            bar.set_postfix(step=plan.step, batch=len(plan.decode) + len(plan.prefill), refresh=False)
    monitor.flush()
    bar.close()

    result.steps = scheduler.step + steps_run
    result.finished = scheduler.finished
    result.simulated_s = scheduler.clock_s - config.requests[0].arrival_s
    result.prefill_s = timer.seconds("prefill")
    result.decode_s = timer.seconds("decode")
    result.peak_batch_size = scheduler.peak_batch_size
    result.peak_waiting = scheduler.peak_waiting
    result.peak_pages_in_use = allocator.peak_pages_in_use
    result.counter_steps_checked = monitor.steps_checked
    result.counter_failure = monitor.failure
    result.wall_s = time.perf_counter() - wall_start
    return result
