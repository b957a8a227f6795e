"""Test helpers for context parallelism: a random paged problem whose requests' keys are
cut into per-rank shards, and the process-group plumbing of the spawned test ranks.

Every rank builds the same full problem from the same seed, then keeps only its shard: the
keys of each request between two of the case's boundaries, written from slot 0 of pages of
its own cache (random page order, NaN in every slot it does not fill).
"""

import dataclasses
import os

import torch
import torch.distributed as dist

try:
    import splitkv
except ImportError:  # a spawned rank outside Bazel: conftest finds the built extension
    import conftest  # noqa: F401
    import splitkv
import splitkv_reference


@dataclasses.dataclass
class Case:
    """full_lens: keys of each request; bounds[b]: world + 1 absolute positions cutting
    request b's keys into the ranks' shards (rank r: bounds[b][r] .. bounds[b][r + 1]);
    q_lens None: decode (one query per request)."""

    full_lens: list
    bounds: list
    q_lens: list = None
    dtype: torch.dtype = torch.float32
    page_size: int = 16
    num_kv_heads: int = 2
    group: int = 2
    head_dim: int = 64
    causal: bool = True
    num_splits: int = None
    seed: int = 0
    window_left: int = -1
    sinks: bool = False  # random per-head sinks (from the seed), the same on every rank
    batch_invariant: bool = False


def even_bounds(full_lens, world, page_size=None):
    """Each request cut into `world` near-equal shards (whole pages when page_size)."""
    bounds = []
    for n in full_lens:
        unit = page_size or 1
        units = -(-n // unit)
        cuts = [min(n, (units * r // world) * unit) for r in range(world)] + [n]
        bounds.append(cuts)
    return bounds


def _random(shape, dtype, generator):
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)


@dataclasses.dataclass
class Problem:
    q: torch.Tensor
    cu_seqlens_q: torch.Tensor  # or None
    keys: list                  # per request [full_len, num_kv_heads, head_dim]
    values: list
    sinks: torch.Tensor = None  # float32 [num_qo_heads] on q's device, or None

    def paged(self, case, begin, end, device, seed):
        """(kv_cache, block_tables, seq_lens, kv_offsets, full_seq_lens) holding keys
        begin[b] .. end[b] - 1 of each request b (absolute positions), HND, on device."""
        generator = torch.Generator().manual_seed(seed)
        ps = case.page_size
        lens = [e - b for b, e in zip(begin, end)]
        pages = [-(-n // ps) for n in lens]
        num_pages = sum(pages) + 1
        order = torch.randperm(num_pages, generator=generator).tolist()
        width = max(pages + [1])
        tables = torch.full((len(lens), width), order[-1], dtype=torch.int32)
        cache = torch.full((num_pages, 2, case.num_kv_heads, ps, case.head_dim), float("nan"),
                           dtype=case.dtype)
        used = 0
        for b, n in enumerate(lens):
            for p in range(pages[b]):
                page = order[used]
                used += 1
                tables[b, p] = page
                lo, hi = begin[b] + p * ps, min(end[b], begin[b] + (p + 1) * ps)
                cache[page, 0, :, :hi - lo] = self.keys[b][lo:hi].transpose(0, 1)
                cache[page, 1, :, :hi - lo] = self.values[b][lo:hi].transpose(0, 1)
        as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)
        return (cache.to(device), tables.to(device), as_int(lens), as_int(begin),
                as_int(case.full_lens))

    def reference(self, case):
        """float64 out [total_q, qo heads, head_dim] and lse of the whole problem (CPU)."""
        outs, lses = [], []
        q = self.q.cpu()
        row = 0
        for b, n in enumerate(case.full_lens):
            q_len = 1 if case.q_lens is None else case.q_lens[b]
            out, lse = splitkv_reference.attention(q[row:row + q_len], self.keys[b], self.values[b],
                                                   causal=case.causal, window_left=case.window_left,
                                                   sinks=self.sinks)
            outs.append(out)
            lses.append(lse)
            row += q_len
        return torch.cat(outs), torch.cat(lses)


def make_problem(case, device):
    generator = torch.Generator().manual_seed(case.seed)
    num_qo_heads = case.num_kv_heads * case.group
    q_lens = case.q_lens or [1] * len(case.full_lens)
    q = _random((sum(q_lens), num_qo_heads, case.head_dim), case.dtype, generator).to(device)
    keys = [_random((n, case.num_kv_heads, case.head_dim), case.dtype, generator)
            for n in case.full_lens]
    values = [_random((n, case.num_kv_heads, case.head_dim), case.dtype, generator)
              for n in case.full_lens]
    cu = None
    if case.q_lens is not None:
        cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    sinks = None
    if case.sinks:
        sinks = (2 * torch.randn(num_qo_heads, generator=generator)).to(device)
    return Problem(q, cu, keys, values, sinks)


def run_sharded(case, problem, rank, workspace, device, group=None):
    """This rank's (its rank in `group`) splitkv.distributed.paged_attention of the case:
    (out, lse)."""
    begin = [bounds[rank] for bounds in case.bounds]
    end = [bounds[rank + 1] for bounds in case.bounds]
    kv, tables, lens, offsets, full = problem.paged(case, begin, end, device, seed=case.seed + rank)
    return splitkv.distributed.paged_attention(
        problem.q, kv, tables, lens, offsets, full, workspace, group=group,
        cu_seqlens_q=problem.cu_seqlens_q, causal=case.causal, window_left=case.window_left,
        sinks=problem.sinks, num_splits=case.num_splits, return_lse=True,
        batch_invariant=case.batch_invariant)


def sub_batch(case, problem, b):
    """Request b of (case, problem) alone: the same queries, keys, values and shards."""
    q_lens = case.q_lens or [1] * len(case.full_lens)
    row = sum(q_lens[:b])
    cu = None
    if case.q_lens is not None:
        cu = torch.tensor([0, q_lens[b]], dtype=torch.int32, device=problem.q.device)
    sub_case = dataclasses.replace(case, full_lens=[case.full_lens[b]], bounds=[case.bounds[b]],
                                   q_lens=None if case.q_lens is None else [q_lens[b]])
    sub_problem = Problem(problem.q[row:row + q_lens[b]], cu, [problem.keys[b]], [problem.values[b]],
                          problem.sinks)
    return sub_case, sub_problem, (row, row + q_lens[b])


def run_single(case, problem, workspace, device):
    """splitkv.paged_attention over every key on one device: (out, lse)."""
    n = len(case.full_lens)
    kv, tables, lens, _, _ = problem.paged(case, [0] * n, case.full_lens, device, seed=case.seed)
    return splitkv.paged_attention(problem.q, kv, tables, lens, workspace,
                                   cu_seqlens_q=problem.cu_seqlens_q, causal=case.causal,
                                   window_left=case.window_left, sinks=problem.sinks,
                                   num_splits=case.num_splits, return_lse=True,
                                   batch_invariant=case.batch_invariant)


def init_group(rank, world, store_path, backend):
    """The default process group of a spawned test rank, over a FileStore (no network)."""
    store = dist.FileStore(store_path, world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)


def same_on_every_rank(*tensors, group=None):
    """True when every rank of `group` holds bitwise the same tensors (compared on the bytes
    of the group's first rank)."""
    src = 0 if group is None else dist.get_process_group_ranks(group)[0]
    for x in tensors:
        bits = x.contiguous().view(torch.uint8).flatten()
        first = bits.clone()
        dist.broadcast(first, src=src, group=group)
        if not torch.equal(first, bits):
            return False
    return True


def store_path(tmp_path):
    return os.path.join(str(tmp_path), "store")
