"""Shared test helpers: devices, tolerances, a pairwise case picker, and random problems.

A problem holds the tensors of one call plus the copies the float64 reference
(splitkv_reference, computed on the CPU) needs, and knows how to run (and plan) itself on a
workspace, so tests state only what they check.
"""

import dataclasses
import itertools
import math
import random

import pytest
import torch

import splitkv
import splitkv_reference

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# (atol, rtol) of outputs against the float64 reference: a few units of the output's last
# place (values are averages of unit normals, |out| < 4). LSE is float32 in every case.
OUT_TOLERANCE = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (1.5e-3, 2e-3),
    torch.bfloat16: (1e-2, 8e-3),
}
LSE_TOLERANCE = (1e-4, 2e-5)

DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


# Marks of the running test, set before each test by tests/python/conftest.py (None where no
# conftest records them).
CURRENT_TEST_MARKS = None


# Batches at the wgmma prefill's edges (prefill_sm90_test, paged_prefill_sm90_test), name ->
# (q_lens, kv_lens): "ragged": several 128-key blocks and partial tiles; "suffix": queries at
# the end of a longer KV; "short_kv": more queries than keys (causal rows with no key);
# "empty": zero-length requests around real ones; "long": a 2-stage ring reused many times.
PREFILL_SM90_BATCHES = {
    "ragged": ([37, 130, 5, 257], [37, 130, 5, 257]),
    "suffix": ([20, 1, 90, 129], [300, 64, 95, 700]),
    "short_kv": ([200, 64], [40, 63]),
    "empty": ([12, 0, 0, 9, 3, 140], [40, 25, 0, 9, 0, 140]),
    "long": ([1000], [1100]),
}


def require(device, dtype=None, head_dim=None, backend=True):
    """Skips what a device cannot run: no GPU, a CPU-only build (when the test launches
    attention: backend=True), CPU-only dtypes and head_dims. A test that needs CUDA without
    the `gpu` mark fails here, on any machine: `pytest -m gpu` (the GPU run) would never
    select it, and elsewhere it would only ever skip."""
    if device == "cuda":
        if CURRENT_TEST_MARKS is not None and "gpu" not in CURRENT_TEST_MARKS:
            pytest.fail("this test needs CUDA but has no gpu mark, so `pytest -m gpu` never runs it: "
                        "add @pytest.mark.gpu (or parametrize over harness.DEVICES)")
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        if backend and not splitkv.cuda_backend_available():
            pytest.skip("splitkv was built without --config=cuda")
        if dtype == torch.float32:
            pytest.skip("float32 runs on the CPU backend only")
        if head_dim is not None and head_dim not in (64, 128, 256):
            pytest.skip(f"head_dim {head_dim} runs on the CPU backend only")


_WORKSPACES = {}


def shared_workspace(device):
    """One Workspace per device for a whole test process, never re-zeroed."""
    if device not in _WORKSPACES:
        _WORKSPACES[device] = splitkv.Workspace(64 << 20, device)
    return _WORKSPACES[device]


def assert_close(actual, expected, dtype):
    atol, rtol = OUT_TOLERANCE[dtype]
    torch.testing.assert_close(actual.cpu().to(torch.float64), expected, atol=atol, rtol=rtol)


def assert_lse_close(actual, expected):
    assert actual.dtype == torch.float32
    atol, rtol = LSE_TOLERANCE
    torch.testing.assert_close(actual.cpu().to(torch.float64), expected, atol=atol, rtol=rtol)


def assert_bitwise_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    assert torch.equal(a.contiguous().view(bits).cpu(), b.contiguous().view(bits).cpu())



def copier(how):
    """How a copy test copies an object: "copy", "deepcopy", "pickle" (the default protocol),
    "pickle0" (protocol 0) or "send" (torch.multiprocessing's pickler, which shares tensors'
    memory with the receiving process rather than copying it)."""
    import copy
    import multiprocessing.reduction
    import pickle
    import torch.multiprocessing  # noqa: F401 - registers torch's reductions
    return {"copy": copy.copy, "deepcopy": copy.deepcopy,
            "pickle": lambda x: pickle.loads(pickle.dumps(x)),
            "pickle0": lambda x: pickle.loads(pickle.dumps(x, protocol=0)),
            "send": lambda x: pickle.loads(multiprocessing.reduction.ForkingPickler.dumps(x))}[how]


def assert_counter_region_zero(workspace):
    workspace.check_counter_region()
    assert int(workspace.counter_region().count_nonzero()) == 0


def run_and_check(problem, workspace, options, poison_out=False, **run_options):
    """Runs `problem` with the attention `options` (which the float64 reference gets too:
    kv_offsets and full_seq_lens included) and `run_options` (num_splits, ...), into a
    NaN-poisoned `out` when `poison_out` (every element must be written, and the result is
    that tensor), and asserts the output, the LSE and a zero counter region. Returns
    (out, lse)."""
    out = torch.full_like(problem.q, float("nan")) if poison_out else None
    got, lse = problem.run(workspace, return_lse=True, out=out, **run_options, **options)
    if out is not None:
        assert got is out
    expected, expected_lse = problem.reference(**options)
    assert_close(got, expected, problem.dtype)
    assert_lse_close(lse, expected_lse)
    assert_counter_region_zero(workspace)
    return got, lse


def assert_plan_keeps_counter_region(plan):
    """The layout invariant: counters at [0, 8 MiB), no other region overlapping them."""
    regions = plan.layout.regions()
    assert regions["counter"] == (0, splitkv.COUNTER_REGION_BYTES)
    for name in ("softmax", "scratch"):
        begin, end = regions[name]
        assert begin >= splitkv.COUNTER_REGION_BYTES, (name, regions)
        assert begin % splitkv.WORKSPACE_ALIGNMENT == 0
    assert regions["softmax"][1] <= regions["scratch"][0]
    assert regions["scratch"][1] <= plan.layout.required_bytes


def fill_garbage(workspace, value=float("nan")):
    """Fills every byte past the counter region (softmax stats and scratch)."""
    tail = workspace.tensor[splitkv.COUNTER_REGION_BYTES:]
    tail.view(torch.float32).fill_(value)


def capture_graph(fn):
    """Runs ``fn()`` once on a side stream (warm-up: module loads, first-call caches), then
    captures a second call in a CUDA graph, as torch's capture notes ask. Returns the graph
    and what the captured call returned (tensors its replays write)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn()
    return graph, captured


def pairwise(factors, seed=0):
    """A small list of cases covering every pair of values of any two factors.

    factors: {name: [values]}. Greedy all-pairs: each new case is the candidate (of a few
    random ones) covering the most still-uncovered pairs; deterministic for a seed.
    """
    names = list(factors)
    sizes = [len(factors[n]) for n in names]
    uncovered = {(i, a, j, b) for i, j in itertools.combinations(range(len(names)), 2)
                 for a in range(sizes[i]) for b in range(sizes[j])}
    rng = random.Random(seed)
    cases = []

    def gain(row):
        return sum((i, row[i], j, row[j]) in uncovered
                   for i, j in itertools.combinations(range(len(names)), 2))

    while uncovered:
        best, best_gain = None, -1
        for _ in range(20):
            i, a, j, b = rng.choice(sorted(uncovered))
            row = [None] * len(names)
            row[i], row[j] = a, b
            for k in rng.sample(range(len(names)), len(names)):
                if row[k] is not None:
                    continue
                scores = []
                for value in range(sizes[k]):
                    row[k] = value
                    scores.append(sum((min(k, m), row[min(k, m)], max(k, m), row[max(k, m)])
                                      in uncovered for m in range(len(names))
                                      if m != k and row[m] is not None))
                top = max(scores)
                row[k] = rng.choice([v for v, s in enumerate(scores) if s == top])
            if gain(row) > best_gain:
                best, best_gain = row, gain(row)
        uncovered -= {(i, best[i], j, best[j])
                      for i, j in itertools.combinations(range(len(names)), 2)}
        cases.append({n: factors[n][v] for n, v in zip(names, best)})
    return cases


def case_id(case):
    def short(value):
        if isinstance(value, torch.dtype):
            return DTYPE_NAMES[value]
        return str(value)
    return "-".join(f"{k}={short(v)}" for k, v in case.items())


def _random(shape, dtype, generator):
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)


def cu_seqlens(lengths, device):
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                        device=device)


def _reference_options(options):
    return {k: v for k, v in options.items()
            if k in ("causal", "sm_scale", "window_left", "logits_soft_cap", "sinks")}


@dataclasses.dataclass
class PagedProblem:
    """A paged_attention call: tensors, and per request the keys/values the reference sees."""

    q: torch.Tensor
    kv_cache: object  # 5-D tensor or (k, v)
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor  # or None: one query per request
    kv_layout: str
    q_lens: list
    keys: list  # per request [kv_len, num_kv_heads, head_dim], q's dtype, CPU
    values: list

    @property
    def dtype(self):
        return self.q.dtype

    def kwargs(self, **options):
        return dict(cu_seqlens_q=self.cu_seqlens_q, kv_layout=self.kv_layout, **options)

    def run(self, workspace, **options):
        return splitkv.paged_attention(self.q, self.kv_cache, self.block_tables, self.seq_lens,
                                       workspace, **self.kwargs(**options))

    def plan(self, workspace, **options):
        return splitkv.plan_paged_attention(self.q, self.kv_cache, self.block_tables,
                                            self.seq_lens, workspace, **self.kwargs(**options))

    def reference(self, kv_offsets=None, full_seq_lens=None, **options):
        """float64 (out, lse) on the CPU; options: the call's (those not about attention's
        values are left out). kv_offsets / full_seq_lens (per request, ints or int tensors,
        both or neither) place request b's keys at positions kv_offsets[b] .. of a request of
        full_seq_lens[b] keys and its queries at the last q_len of those, as paged_attention
        does; each row is then at its local position in the shard."""
        options = _reference_options(options)
        q = self.q.cpu()
        outs, lses = [], []
        begin = 0
        for b, (q_len, k, v) in enumerate(zip(self.q_lens, self.keys, self.values)):
            positions = {}
            if kv_offsets is not None:
                start = int(full_seq_lens[b]) - int(kv_offsets[b]) - q_len
                positions = dict(positions=torch.arange(start, start + q_len))
            out, lse = splitkv_reference.attention(q[begin:begin + q_len], k, v, **positions, **options)
            outs.append(out)
            lses.append(lse)
            begin += q_len
        return torch.cat(outs), torch.cat(lses)


def make_paged(seq_lens, *, page_size, num_kv_heads=2, group=1, head_dim=64,
               dtype=torch.float32, device="cpu", kv_layout="HND", kv_form="5d", q_lens=None,
               seed=0):
    """A random paged problem.

    Pages are handed out in a random order; unused slots and unlisted pages hold NaN (the
    tail of each last page, spare pages, and the block-table padding points at a spare
    page), so reading them would show. kv_form: "5d" (one contiguous cache), "pair"
    (separate k and v tensors), "strided" (a 5-D view whose head_dim is padded and whose
    page/slot/head order in memory is the other layout's: no dimension but head_dim is
    where a contiguous tensor would put it). q_lens None: one query per request and no
    cu_seqlens_q.
    """
    generator = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    pages_per_seq = [math.ceil(n / page_size) for n in seq_lens]
    spare = 2
    num_pages = sum(pages_per_seq) + spare
    order = torch.randperm(num_pages, generator=generator).tolist()
    max_pages = max(pages_per_seq + [1]) + 1  # + a padding column
    block_tables = torch.full((batch, max_pages), order[-1], dtype=torch.int32)
    # Canonical HND storage first, then rearranged into the requested form.
    cache = torch.full((num_pages, 2, num_kv_heads, page_size, head_dim), float("nan"),
                       dtype=dtype)
    keys, values = [], []
    next_page = 0
    for b, kv_len in enumerate(seq_lens):
        k = _random((kv_len, num_kv_heads, head_dim), dtype, generator)
        v = _random((kv_len, num_kv_heads, head_dim), dtype, generator)
        keys.append(k)
        values.append(v)
        for p in range(pages_per_seq[b]):
            page = order[next_page]
            next_page += 1
            block_tables[b, p] = page
            chunk = slice(p * page_size, min(kv_len, (p + 1) * page_size))
            slots = chunk.stop - chunk.start
            cache[page, 0, :, :slots] = k[chunk].transpose(0, 1)
            cache[page, 1, :, :slots] = v[chunk].transpose(0, 1)

    nhd = cache.permute(0, 1, 3, 2, 4)  # [pages, 2, page_size, heads, head_dim]
    layout_view = cache if kv_layout == "HND" else nhd
    if kv_form == "5d":
        kv_cache = layout_view.contiguous()
    elif kv_form == "pair":
        kv_cache = (layout_view[:, 0].contiguous(), layout_view[:, 1].contiguous())
    elif kv_form == "strided":
        other = nhd if kv_layout == "HND" else cache
        padded = torch.full(other.shape[:-1] + (head_dim + 8,), float("nan"), dtype=dtype)
        padded[..., :head_dim] = other
        storage = padded[..., :head_dim]
        kv_cache = storage.permute(0, 1, 3, 2, 4)  # back to kv_layout's shape
        assert not kv_cache.is_contiguous() and kv_cache.stride(-1) == 1
    else:
        raise ValueError(kv_form)
    if isinstance(kv_cache, tuple):
        kv_cache = tuple(x.to(device) for x in kv_cache)
    else:
        kv_cache = kv_cache.to(device)

    num_qo_heads = num_kv_heads * group
    q_counts = [1] * batch if q_lens is None else list(q_lens)
    q = _random((sum(q_counts), num_qo_heads, head_dim), dtype, generator).to(device)
    return PagedProblem(
        q=q, kv_cache=kv_cache, block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        cu_seqlens_q=None if q_lens is None else cu_seqlens(q_lens, device),
        kv_layout=kv_layout, q_lens=q_counts, keys=keys, values=values)


@dataclasses.dataclass
class RaggedProblem:
    """A ragged_attention call."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor

    @property
    def dtype(self):
        return self.q.dtype

    def run(self, workspace, **options):
        return splitkv.ragged_attention(self.q, self.k, self.v, self.cu_seqlens_q,
                                        self.cu_seqlens_kv, workspace, **options)

    def plan(self, workspace, **options):
        return splitkv.plan_ragged_attention(self.q, self.k, self.v, self.cu_seqlens_q,
                                             self.cu_seqlens_kv, workspace, **options)

    def reference(self, **options):
        """float64 (out, lse) on the CPU, as PagedProblem.reference."""
        return splitkv_reference.ragged_attention(
            self.q.cpu(), self.k.cpu(), self.v.cpu(), self.cu_seqlens_q, self.cu_seqlens_kv,
            **_reference_options(options))


def make_ragged(q_lens, kv_lens, *, num_kv_heads=2, group=1, head_dim=64, dtype=torch.float32,
                device="cpu", strided=False, seed=0):
    """A random ragged problem; strided: k and v are views of one [total_kv, 2, H, D + 8]
    buffer (token and head strides of neither a contiguous k nor v)."""
    generator = torch.Generator().manual_seed(seed)
    total_q, total_kv = sum(q_lens), sum(kv_lens)
    num_qo_heads = num_kv_heads * group
    q = _random((total_q, num_qo_heads, head_dim), dtype, generator)
    if strided:
        kv = torch.full((total_kv, 2, num_kv_heads, head_dim + 8), float("nan"), dtype=dtype)
        kv[..., :head_dim] = _random((total_kv, 2, num_kv_heads, head_dim), dtype, generator)
        kv = kv.to(device)
        k, v = kv[:, 0, :, :head_dim], kv[:, 1, :, :head_dim]
    else:
        k = _random((total_kv, num_kv_heads, head_dim), dtype, generator).to(device)
        v = _random((total_kv, num_kv_heads, head_dim), dtype, generator).to(device)
    return RaggedProblem(q=q.to(device), k=k, v=v, cu_seqlens_q=cu_seqlens(q_lens, device),
                         cu_seqlens_kv=cu_seqlens(kv_lens, device))
