"""The problems the bench measures, grouped in presets (--shapes).

A decode case is `batch` requests of `kv_len` keys each with one new query token; a
prefill case is a ragged batch of causal self-attention over `seq_lens` (q_len == kv_len);
a merge case times one splitkv decode with num_splits forced to 1, left to the planner, and
forced above 1, so the cost of the split-KV merge shows apart from the attention itself.
"""

import csv
import dataclasses
import random

# Llama-3-8B on one GPU: 32 query heads share 8 KV heads (GQA group 4), head_dim 128.
NUM_QO_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
TRACE_COLUMN = "ContextTokens"


@dataclasses.dataclass(frozen=True)
class DecodeCase:
    batch: int
    kv_len: int
    head_dim: int = HEAD_DIM
    page_sizes: tuple = (16,)
    dtype: str = ""  # "": the --dtype flag's (or the device's default)
    num_qo_heads: int = NUM_QO_HEADS
    num_kv_heads: int = NUM_KV_HEADS

    section = "decode"

    def label(self):
        group = self.num_qo_heads // self.num_kv_heads
        return f"{self.batch} x {self.kv_len} d{self.head_dim}" + (f" g{group}" if group != 4 else "")

    def seq_lens(self):
        return (self.kv_len,) * self.batch


@dataclasses.dataclass(frozen=True)
class PrefillCase:
    lengths: tuple  # q_len == kv_len of each request
    name: str
    head_dim: int = HEAD_DIM
    dtype: str = ""
    causal: bool = True
    num_qo_heads: int = NUM_QO_HEADS
    num_kv_heads: int = NUM_KV_HEADS

    section = "prefill"

    def label(self):
        return f"{self.name} d{self.head_dim}"

    def seq_lens(self):
        return self.lengths


@dataclasses.dataclass(frozen=True)
class MergeCase:
    batch: int
    kv_len: int
    forced_splits: tuple = (2, 4)
    head_dim: int = HEAD_DIM
    page_size: int = 16
    dtype: str = ""
    num_qo_heads: int = NUM_QO_HEADS
    num_kv_heads: int = NUM_KV_HEADS

    section = "merge"

    def label(self):
        return f"{self.batch} x {self.kv_len} d{self.head_dim} p{self.page_size}"

    def seq_lens(self):
        return (self.kv_len,) * self.batch


def uniform_prefill(batch, seq_len, **kwargs):
    return PrefillCase((seq_len,) * batch, f"{batch} x {seq_len}", **kwargs)


def flops(case):
    """2 matmuls of 2 flops per multiply-add; a causal square request counted as half."""
    total = 0
    for kv_len in case.seq_lens():
        q_len = 1 if case.section in ("decode", "merge") else kv_len
        full = 4 * case.num_qo_heads * case.head_dim * q_len * kv_len
        total += full / 2 if case.section == "prefill" and case.causal else full
    return total


def trace_lengths(path, count, seed=0, max_len=0):
    """`count` prompt lengths drawn (without replacement, seeded) from a trace CSV's
    ContextTokens column, each clipped to `max_len` when it is > 0."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if TRACE_COLUMN not in (reader.fieldnames or []):
            raise ValueError(f"bench: trace {path} has no {TRACE_COLUMN} column: expected it among "
                             f"{reader.fieldnames}")
        lengths = [int(row[TRACE_COLUMN]) for row in reader]
    if len(lengths) < count:
        raise ValueError(f"bench: trace {path} too short: expected >= {count} rows, got {len(lengths)}")
    drawn = random.Random(seed).sample(lengths, count)
    return tuple(min(n, max_len) if max_len > 0 else n for n in drawn)


def trace_prefill(path, count, max_len=0, **kwargs):
    lengths = trace_lengths(path, count, max_len=max_len)
    return PrefillCase(lengths, f"trace {count} reqs ({sum(lengths)} tok)", **kwargs)


def _quick(trace):
    """The key targets on one GPU in about two minutes: Llama-3-8B shapes, page 16."""
    # 24 x 8192: tiles between half a wave and one (where the planner once chose 26 splits).
    decode = [DecodeCase(b, n) for b, n in ((64, 4096), (1, 32768), (16, 4096), (16, 8192),
                                            (1, 131072), (24, 8192))]
    prefill = [uniform_prefill(4, 4096), uniform_prefill(1, 16384), trace_prefill(trace, 16)]
    merge = [MergeCase(64, 4096)]
    return decode + prefill + merge


def _full(trace):
    """The whole grid of issue 6 (tens of minutes on one GPU)."""
    cases = []
    for head_dim in (128, 64, 256):
        # 24: tiles between half a wave and one (8 kv heads), the planner's one-wave rule.
        for batch in (1, 8, 24, 64, 256):
            for kv_len in (1024, 2048, 4096, 8192, 16384, 32768):
                cases.append(DecodeCase(batch, kv_len, head_dim, page_sizes=(16, 64)))
        cases.append(DecodeCase(1, 131072, head_dim, page_sizes=(16, 64)))
        cases += [uniform_prefill(1, 16384, head_dim=head_dim),
                  uniform_prefill(4, 4096, head_dim=head_dim),
                  uniform_prefill(8, 2048, head_dim=head_dim),
                  trace_prefill(trace, 16, head_dim=head_dim)]
    cases += [MergeCase(64, 4096), MergeCase(256, 4096)]
    return cases


def _gqa8(trace):
    """Group 8 decode, page 16: 64 qo / 8 kv heads (Llama-3-70B at head_dim 128, gpt-oss at 64),
    whose split tiles' partials (32 splits x 8 rows) outgrow the decode kernel's shared memory
    in one piece (split_merge.cuh merges them in row chunks)."""
    return [DecodeCase(b, n, head_dim, num_qo_heads=64)
            for head_dim in (128, 64)
            for b, n in ((1, 8192), (1, 32768), (1, 131072), (4, 16384), (8, 8192), (16, 4096), (64, 4096))]


def _short_splits(trace):
    """Short-context decode at page 16, where FlashInfer's XQA kernel led the 2026-12-06 grids:
    each shape beside the peers, and a merge case of the same shape at forced split counts, so
    one run says whether the planner's split count or the kernel is behind."""
    shapes = {64: ((1, 1024), (1, 2048), (1, 4096), (8, 1024), (8, 2048)), 128: ((1, 1024), (8, 1024))}
    cases = []
    for head_dim, pairs in shapes.items():
        for b, n in pairs:
            cases.append(DecodeCase(b, n, head_dim))
            cases.append(MergeCase(b, n, forced_splits=(2, 4, 8, 16, 32), head_dim=head_dim))
    return cases


def _cpu(trace):
    """The 2-core CPU backend beside torch's CPU SDPA (BUILD_NOTES' figures)."""
    return [
        DecodeCase(8, 2048, dtype="float32"),
        DecodeCase(8, 2048, dtype="bfloat16"),
        uniform_prefill(1, 2048, dtype="float32"),
        uniform_prefill(1, 2048, dtype="bfloat16"),
        MergeCase(32, 2048, dtype="float32"),
    ]


def _tiny(trace):
    """A few seconds on the CPU: every section and code path, for the test."""
    small = dict(head_dim=64, num_qo_heads=8, num_kv_heads=2)
    return [
        DecodeCase(3, 300, page_sizes=(16, 64), dtype="float32", **small),
        DecodeCase(2, 200, dtype="bfloat16", **small),
        uniform_prefill(2, 100, dtype="float32", **small),
        trace_prefill(trace, 4, max_len=200, dtype="bfloat16", **small),  # + the fp8 rows
        MergeCase(8, 256, forced_splits=(2,), dtype="float32", **small),
    ]


PRESETS = {"quick": _quick, "full": _full, "gqa8": _gqa8, "short_splits": _short_splits, "cpu": _cpu,
           "tiny": _tiny}


def preset_cases(name, device_type, trace):
    """The cases of preset `name` ("auto": quick on CUDA, cpu on the CPU)."""
    if name == "auto":
        name = "quick" if device_type == "cuda" else "cpu"
    if name not in PRESETS:
        raise ValueError(f"bench: --shapes invalid: expected auto or one of {sorted(PRESETS)}, "
                         f"got {name!r}")
    return name, PRESETS[name](trace)
