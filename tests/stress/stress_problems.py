"""Random problems for the stress run: paged and ragged calls of random shapes, each with its
float64 reference computed once, so that every later launch of it is checked for free.

Shapes are drawn per device: the CPU profile keeps a launch to a few milliseconds on two
cores; the CUDA profile uses the head_dims and dtypes the kernels support and longer KV.
Unused KV bytes (page tails, spare pages, block-table padding) hold NaN, so a kernel that
reads them shows it in the result.
"""

import dataclasses
import math

import torch

import harness

# Per device: the ranges shapes are drawn from.
PROFILES = {
    "cpu": dict(dtypes=(torch.float32, torch.float16, torch.bfloat16),
                head_dims=(32, 64, 64, 128, 16, 80), max_batch=5, max_kv_len=400,
                max_prefill_q=48, max_spec_q=8, long_kv_len=4000, kv_heads=(1, 2, 4),
                groups=(1, 2, 4),
                page_sizes=(1, 4, 16, 64)),
    "cuda": dict(dtypes=(torch.float16, torch.bfloat16), head_dims=(64, 128, 256),
                 max_batch=16, max_kv_len=3000, max_prefill_q=128, max_spec_q=8,
                 long_kv_len=32768,
                 kv_heads=(1, 2, 4, 8), groups=(1, 2, 4), page_sizes=(1, 8, 16, 64)),
}


@dataclasses.dataclass
class Entry:
    """One problem of the pool, its call options and its reference."""

    index: int
    kind: str                 # "paged" or "ragged"
    problem: object           # harness.PagedProblem or harness.RaggedProblem
    options: dict             # causal, window_left, logits_soft_cap, max_q_len
    out_ref: torch.Tensor     # [total_q, num_qo_heads, head_dim] float64, on the device
    lse_ref: torch.Tensor     # [total_q, num_qo_heads] float64, on the device
    shape: tuple              # what makes two entries the same shape (for the counts)
    planned_splits: int = 1   # the planner's choice on the full workspace

    @property
    def dims(self):
        """(total_q, num_qo_heads, head_dim): what the workspace layout depends on."""
        return tuple(self.problem.q.shape)

    def describe(self):
        return f"#{self.index} {self.kind} {self.shape} {self.options}"


def _lengths(rng, batch, longest, zero_chance=0.1):
    """Lengths with some 0s, some short and some long ones."""
    lengths = []
    for _ in range(batch):
        roll = rng.random()
        if roll < zero_chance:
            lengths.append(0)
        elif roll < 0.35:
            lengths.append(rng.randint(1, 16))
        else:
            lengths.append(rng.randint(1, longest))
    return lengths


def _options(rng, max_q_len):
    options = {"causal": rng.random() < 0.8, "max_q_len": max_q_len}
    if rng.random() < 0.2:
        options["window_left"] = rng.choice([0, 1, 7, 64, 200])
    if rng.random() < 0.15:
        options["logits_soft_cap"] = rng.choice([5.0, 30.0])
    return options


def _paged(rng, profile, dtype, head_dim, num_kv_heads, group, device, seed):
    batch = rng.randint(1, profile["max_batch"])
    page_size = rng.choice(profile["page_sizes"])
    seq_lens = _lengths(rng, batch, profile["max_kv_len"])
    mode = rng.choice(["decode", "decode", "spec", "chunk", "long"])
    if mode == "long":  # few long requests: the planner splits them, and lowers to fit
        seq_lens = [rng.randint(1, profile["long_kv_len"]) for _ in range(rng.randint(1, 2))]
        page_size = max(page_size, 16)
        q_lens = None
    elif mode == "decode":
        q_lens = None
    else:  # speculative decode or a chunk of prefill: the queries end the sequence
        longest = profile["max_spec_q"] if mode == "spec" else profile["max_prefill_q"]
        q_lens = [rng.randint(1, longest) for _ in seq_lens]
        # Mostly kv_len >= q_len; sometimes fewer keys (rows that see none: 0 and -inf).
        seq_lens = [max(n, q) if rng.random() < 0.9 else n for n, q in zip(seq_lens, q_lens)]
    kv_layout = rng.choice(["HND", "NHD"])
    kv_form = rng.choice(["5d", "pair", "strided"])
    problem = make_paged(seq_lens, q_lens, page_size=page_size, num_kv_heads=num_kv_heads,
                         group=group, head_dim=head_dim, dtype=dtype, device=device,
                         kv_layout=kv_layout, kv_form=kv_form, seed=seed)
    max_q_len = max(q_lens) if q_lens else 1
    shape = ("paged", harness.DTYPE_NAMES[dtype], tuple(seq_lens), tuple(q_lens or ()),
             page_size, num_kv_heads, group, head_dim, kv_layout, kv_form)
    return problem, max_q_len, shape


def _ragged(rng, profile, dtype, head_dim, num_kv_heads, group, device, seed):
    batch = rng.randint(1, profile["max_batch"])
    q_lens = _lengths(rng, batch, profile["max_prefill_q"])

    def kv_len(q_len):
        if rng.random() < 0.1:  # fewer keys than queries: some rows see none
            return rng.randint(0, max(q_len, 1))
        cached = rng.randint(0, profile["max_kv_len"] // 2) if rng.random() < 0.5 else 0
        return cached + q_len  # a prefill after a cached prefix, or from scratch

    kv_lens = [kv_len(q) for q in q_lens]
    strided = rng.random() < 0.3
    problem = harness.make_ragged(q_lens, kv_lens, num_kv_heads=num_kv_heads, group=group,
                                  head_dim=head_dim, dtype=dtype, device=device,
                                  strided=strided, seed=seed)
    shape = ("ragged", harness.DTYPE_NAMES[dtype], tuple(q_lens), tuple(kv_lens),
             num_kv_heads, group, head_dim, strided)
    return problem, max(q_lens + [0]), shape


def make_entry(index, rng, device, workspace, profile=None):
    """A random problem of a profile (default: the device's), with its reference and its
    planned split count on `workspace`."""
    profile = PROFILES[profile or torch.device(device).type]
    dtype = rng.choice(profile["dtypes"])
    head_dim = rng.choice(profile["head_dims"])
    num_kv_heads = rng.choice(profile["kv_heads"])
    group = rng.choice(profile["groups"])
    seed = rng.randrange(2**31)
    kind = rng.choice(["paged", "ragged"])
    build = _paged if kind == "paged" else _ragged
    problem, max_q_len, shape = build(rng, profile, dtype, head_dim, num_kv_heads, group,
                                      device, seed)
    options = _options(rng, max_q_len)
    out_ref, lse_ref = problem.reference(**options)
    entry = Entry(index, kind, problem, options, out_ref.to(device), lse_ref.to(device), shape)
    entry.planned_splits = problem.plan(workspace, **options).num_splits
    return entry


def make_paged(seq_lens, q_lens, *, page_size, num_kv_heads, group, head_dim, dtype, device,
               kv_layout, kv_form, seed):
    """harness.make_paged's problem (same forms, NaN in every unused byte), built with
    tensor ops instead of a loop over pages: pools of thousands stay quick to make."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    pages_per_seq = [math.ceil(n / page_size) for n in seq_lens]
    num_pages = sum(pages_per_seq) + 2  # + spare pages, never listed for a request's keys
    order = torch.randperm(num_pages, generator=generator)
    max_pages = max(pages_per_seq + [1]) + 1  # + a padding column pointing at a spare page
    block_tables = torch.full((batch, max_pages), int(order[-1]), dtype=torch.int32)
    first = 0
    for b, count in enumerate(pages_per_seq):
        block_tables[b, :count] = order[first:first + count].to(torch.int32)
        first += count

    total = sum(seq_lens)
    keys = torch.randn((total, num_kv_heads, head_dim), generator=generator).to(dtype)
    values = torch.randn((total, num_kv_heads, head_dim), generator=generator).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    request = torch.repeat_interleave(torch.arange(batch), lens)
    starts = torch.cumsum(lens, 0) - lens
    position = torch.arange(total) - starts[request]
    page = block_tables.to(torch.int64)[request, position // page_size]
    slot = position % page_size
    cache = torch.full((num_pages, 2, num_kv_heads, page_size, head_dim), float("nan"),
                       dtype=dtype)
    cache[page, 0, :, slot] = keys
    cache[page, 1, :, slot] = values

    nhd = cache.permute(0, 1, 3, 2, 4)
    layout_view = cache if kv_layout == "HND" else nhd
    if kv_form == "5d":
        kv_cache = layout_view.contiguous().to(device)
    elif kv_form == "pair":
        kv_cache = (layout_view[:, 0].contiguous().to(device),
                    layout_view[:, 1].contiguous().to(device))
    else:  # "strided": padded head_dim, the other layout's order in memory
        other = nhd if kv_layout == "HND" else cache
        padded = torch.full(other.shape[:-1] + (head_dim + 8,), float("nan"), dtype=dtype)
        padded[..., :head_dim] = other
        kv_cache = padded.to(device)[..., :head_dim].permute(0, 1, 3, 2, 4)

    q_counts = [1] * batch if q_lens is None else list(q_lens)
    q = torch.randn((sum(q_counts), num_kv_heads * group, head_dim), generator=generator)
    return harness.PagedProblem(
        q=q.to(dtype).to(device), kv_cache=kv_cache, block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        cu_seqlens_q=None if q_lens is None else harness.cu_seqlens(q_lens, device),
        kv_layout=kv_layout, q_lens=q_counts, keys=list(torch.split(keys, seq_lens)),
        values=list(torch.split(values, seq_lens)))

