"""--context_parallel=N: each request's pages dealt across the ranks of a process group.

Rank r holds a contiguous run of each request's logical pages: of the P pages the request
will ever hold (prompt + decodes, reserved at admission), pages floor(P * r / N) ..
floor(P * (r + 1) / N) - 1. Early ranks fill first; a rank whose run the KV has not reached
yet holds no key of that request (lse -inf). Every rank replays the same schedule and
tokens (same seed), writes only its own pages into its own pool (the others stay NaN), and
makes every attention call through splitkv.distributed.paged_attention: the ragged prefill
becomes a paged chunked prefill over the prompt's pages (cu_seqlens_q), the decode a paged
decode; both merged over the group. Windows, sinks and fp8 scales pass through as the
layer's options (the core takes the shard's absolute positions; rank 0's launch alone
adds the sink).
"""

import torch
import torch.distributed as dist

import splitkv
from tools.replay.paged_cache import PagedKvCache
from tools.replay.scheduler import pages_for


class ShardedCalls:
    """This rank's pages and its calls of splitkv.distributed.paged_attention.

    Parameters
    ----------
    rank, world : int
        This rank and the group's size (the default process group).
    cache_args : tuple
        PagedKvCache's arguments: this rank's own pool, same shape as the full one.
    """

    def __init__(self, rank, world, cache_args):
        self.rank = rank
        self.world = world
        self.control = control_group()
        self.local = PagedKvCache(*cache_args)
        self.page_size = self.local.page_size

    def page_range(self, seq):
        """[lo, hi): the logical pages of seq this rank holds."""
        total = pages_for(seq.total_tokens, self.page_size)
        return total * self.rank // self.world, total * (self.rank + 1) // self.world

    def _owned(self, seqs, positions):
        """Bool mask (device) of the tokens on this rank: seqs[i]'s at positions[i] (a range)."""
        owned = []
        for seq, pos in zip(seqs, positions):
            lo, hi = self.page_range(seq)
            pages = torch.arange(pos.start, pos.stop) // self.page_size
            owned.append((pages >= lo) & (pages < hi))
        return torch.cat(owned).to(self.local.device)

    def write(self, seqs, positions, page, offset, k, v):
        mask = self._owned(seqs, positions)
        self.local.write(page[mask], offset[mask], k[mask], v[mask])

    def shard(self, seqs, full_lens):
        """(block_tables, seq_lens, kv_offsets, full_seq_lens) of this rank, on the device."""
        rows, lens, offsets = [], [], []
        for seq, full in zip(seqs, full_lens):
            lo, hi = self.page_range(seq)
            begin = min(lo * self.page_size, full)
            end = min(hi * self.page_size, full)
            rows.append(seq.pages[lo:lo + pages_for(end - begin, self.page_size)])
            lens.append(end - begin)
            offsets.append(begin)
        width = max([1] + [len(row) for row in rows])
        table = torch.zeros((len(rows), width), dtype=torch.int32)
        for i, row in enumerate(rows):
            table[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
        device = self.local.device
        as_int = lambda xs: torch.tensor(xs, dtype=torch.int32).to(device)
        return table.to(device), as_int(lens), as_int(offsets), as_int(full_lens)

    def call(self, q, seqs, full_lens, **options):
        """(op, plan_op, args, kwargs) of this rank's distributed call: plan_op plans its local
        launch, for the split statistics."""
        tables, lens, offsets, full = self.shard(seqs, full_lens)
        kv = self.local.kv_cache
        options.update(kv_layout=self.local.kv_layout, causal=True)
        args = (q, kv, tables, lens, offsets, full)

        def plan(q, kv, tables, lens, offsets, full, workspace, **kwargs):
            return splitkv.plan_paged_attention(q, kv, tables, lens, workspace, kv_offsets=offsets,
                                                full_seq_lens=full, **kwargs)

        return splitkv.distributed.paged_attention, plan, args, options


def control_group():
    """A gloo group over the default group's ranks for the replay's own host-side agreement
    (stop flags, the closing outcomes); the default group when that is gloo already."""
    return None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")


def any_rank(flag, group):
    """True on every rank when `flag` is True on any (one tiny all_reduce on the host)."""
    value = torch.tensor([int(bool(flag))])
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())


def outcome(result):
    """What the summary and the exit code need of one rank's ReplayResult, picklable."""
    stats = result.check_stats
    failures = list(stats.failures) + (list(result.invariance.failures) if result.invariance else [])
    return dict(ok=result.ok, failures=failures, counter_failure=result.counter_failure,
                error=result.error, counter_steps_checked=result.counter_steps_checked,
                max_out_error=stats.max_out_error, max_lse_error=stats.max_lse_error,
                requests_checked=stats.requests, backend=dist.get_backend() if dist.is_initialized() else None)


def gather_outcomes(result, group):
    """Every rank's outcome(result), in rank order."""
    outcomes = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, outcome(result), group=group)
    return outcomes
