"""Random inputs of a case, in as many copies as it takes to exceed the cache.

Every implementation reads the same values: a decode case's KV is drawn once as
contiguous `[batch, num_kv_heads, kv_len, head_dim]` tensors (what SDPA reads), and each
paged cache is scattered from them into randomly permuted pages (what splitkv reads); a
prefill case's ragged K/V likewise for its paged rows (paged_prefill_copy).
A 16-bit case's K/V values are ones an fp8 (e4m3) cache holds exactly at FP8_SCALE, so its
fp8 rows (fp8_paged_copy, fp8_prefill_copy) compute the same function as its 16-bit rows
and are checked against the same reference.
"""

import dataclasses
import math

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FP8 = torch.float8_e4m3fn
FP8_SCALE = 0.5  # a power of two: stored = value / FP8_SCALE, and back, exactly
FP8_Q_DTYPES = (torch.float16, torch.bfloat16)  # the q dtypes an fp8 cache serves


def randn(shape, dtype, device, generator):
    return torch.randn(shape, dtype=torch.float32 if device.type == "cpu" else dtype,
                       device=device, generator=generator).to(dtype)


def num_copies(copy_bytes, rotate_bytes, limit=64):
    """Copies whose total reaches rotate_bytes (at least 1, at most limit)."""
    return max(1, min(limit, math.ceil(rotate_bytes / max(1, copy_bytes))))


def kv_bytes(case, dtype):
    """Bytes of K and V the requests' tokens hold, each counted once."""
    element = torch.empty((), dtype=dtype).element_size()
    return sum(case.seq_lens()) * case.num_kv_heads * case.head_dim * 2 * element


@dataclasses.dataclass
class DecodeCopy:
    q: torch.Tensor  # [batch, num_qo_heads, head_dim]
    k: torch.Tensor  # [batch, num_kv_heads, kv_len, head_dim], contiguous
    v: torch.Tensor


def fp8_exact(x):
    """x (16-bit) rounded to the values an fp8 cache holds at FP8_SCALE; others unchanged."""
    if x.dtype not in FP8_Q_DTYPES:
        return x
    return (x / FP8_SCALE).to(FP8).to(x.dtype) * FP8_SCALE


def decode_copies(case, dtype, device, copies, generator):
    shape_kv = (case.batch, case.num_kv_heads, case.kv_len, case.head_dim)
    return [DecodeCopy(randn((case.batch, case.num_qo_heads, case.head_dim), dtype, device, generator),
                       fp8_exact(randn(shape_kv, dtype, device, generator)),
                       fp8_exact(randn(shape_kv, dtype, device, generator))) for _ in range(copies)]


@dataclasses.dataclass
class PagedCopy:
    q: torch.Tensor
    kv_cache: torch.Tensor  # HND [num_pages, 2, kv heads, page, d] or NHD [num_pages, 2, page, kv heads, d]
    block_tables: torch.Tensor  # [batch, pages_per_seq] int32
    seq_lens: torch.Tensor  # [batch] int32


def _page_pool(num_requests, pages_per_seq, num_kv_heads, page_size, head_dim, dtype, device,
               kv_layout, generator):
    """A cache of random pages, pages_per_seq per request in random order: (cache, the same
    storage seen as HND so one fill serves both layouts, the page order [num_requests,
    pages_per_seq], block_tables int32)."""
    num_pages = num_requests * pages_per_seq
    page_shape = ((num_kv_heads, page_size, head_dim) if kv_layout == "HND"
                  else (page_size, num_kv_heads, head_dim))
    cache = randn((num_pages, 2) + page_shape, dtype, device, generator)
    cache_hnd = cache if kv_layout == "HND" else cache.transpose(2, 3)
    order = torch.randperm(num_pages, device=device, generator=generator)
    pages = order.view(num_requests, pages_per_seq)
    return cache, cache_hnd, pages, pages.to(torch.int32)


def paged_copy(copy, page_size, kv_layout, generator, chunk_bytes=512 << 20):
    """copy's KV scattered into pages in random order; the tails of last pages are random.

    Filled a few requests at a time, so the only memory beyond the cache is one chunk.
    """
    batch, num_kv_heads, kv_len, head_dim = copy.k.shape
    device, dtype = copy.k.device, copy.k.dtype
    cache, cache_hnd, pages, block_tables = _page_pool(
        batch, -(-kv_len // page_size), num_kv_heads, page_size, head_dim, dtype, device, kv_layout,
        generator)
    full, rem = divmod(kv_len, page_size)
    per_request = num_kv_heads * kv_len * head_dim * copy.k.element_size()
    step = max(1, chunk_bytes // max(1, per_request))
    for begin in range(0, batch, step):
        end = min(batch, begin + step)
        for half, x in enumerate((copy.k, copy.v)):
            chunk = x[begin:end]
            if full:
                src = chunk[:, :, :full * page_size].reshape(
                    end - begin, num_kv_heads, full, page_size, head_dim).transpose(1, 2)
                cache_hnd[pages[begin:end, :full].reshape(-1), half] = src.reshape(
                    -1, num_kv_heads, page_size, head_dim)
            if rem:
                cache_hnd[pages[begin:end, full], half, :, :rem] = chunk[:, :, full * page_size:]
    seq_lens = torch.full((batch,), kv_len, dtype=torch.int32, device=device)
    return PagedCopy(copy.q, cache, block_tables, seq_lens)


def fp8_paged_copy(copy):
    """The paged copy with its cache stored as fp8 e4m3 (value / FP8_SCALE): the same values
    (decode_copies draws fp8-exact ones; page tails may round)."""
    return PagedCopy(copy.q, (copy.kv_cache / FP8_SCALE).to(FP8), copy.block_tables, copy.seq_lens)


def gather_pages(kv_cache, block_tables, kv_len, kv_layout):
    """k and v as [batch, num_kv_heads, kv_len, head_dim] gathered from the pages: what a
    user without a paged kernel does before calling SDPA."""
    batch, pages_per_seq = block_tables.shape
    pages = kv_cache[block_tables.long()]  # [batch, pages_per_seq, 2, ...]
    if kv_layout == "NHD":  # [.., 2, page, kv heads, d] -> [.., 2, kv heads, page, d]
        pages = pages.transpose(3, 4)
    _, _, _, num_kv_heads, page_size, head_dim = pages.shape
    kv = pages.permute(2, 0, 3, 1, 4, 5).reshape(2, batch, num_kv_heads, pages_per_seq * page_size,
                                                 head_dim)
    return kv[0, :, :, :kv_len], kv[1, :, :, :kv_len]


@dataclasses.dataclass
class PrefillCopy:
    q: torch.Tensor  # [total, num_qo_heads, head_dim]
    k: torch.Tensor  # [total, num_kv_heads, head_dim]
    v: torch.Tensor


def prefill_copies(case, dtype, device, copies, generator):
    total = sum(case.lengths)
    shape_kv = (total, case.num_kv_heads, case.head_dim)
    return [PrefillCopy(randn((total, case.num_qo_heads, case.head_dim), dtype, device, generator),
                        fp8_exact(randn(shape_kv, dtype, device, generator)),
                        fp8_exact(randn(shape_kv, dtype, device, generator)))
            for _ in range(copies)]


def fp8_prefill_copy(copy):
    """The ragged copy with K and V stored as fp8 e4m3 (value / FP8_SCALE): the same values
    (prefill_copies draws fp8-exact ones)."""
    return PrefillCopy(copy.q, (copy.k / FP8_SCALE).to(FP8), (copy.v / FP8_SCALE).to(FP8))


@dataclasses.dataclass
class PagedPrefillCopy:
    q: torch.Tensor  # [total, num_qo_heads, head_dim]: every prompt token queries (one chunk)
    kv_cache: torch.Tensor  # as PagedCopy.kv_cache
    block_tables: torch.Tensor  # [batch, pages_per_seq] int32
    seq_lens: torch.Tensor  # [batch] int32: the prompts' lengths
    cu_seqlens_q: torch.Tensor  # [batch + 1] int32


def paged_prefill_copy(copy, lengths, page_size, kv_layout, generator):
    """copy's ragged K/V scattered into pages in random order (random page tails): a prompt
    prefilled as one chunk over a paged cache, as a serving engine's chunked prefill reads it."""
    device, dtype = copy.k.device, copy.k.dtype
    _, num_kv_heads, head_dim = copy.k.shape
    cache, cache_hnd, pages, block_tables = _page_pool(
        len(lengths), -(-max(lengths) // page_size), num_kv_heads, page_size, head_dim, dtype, device,
        kv_layout, generator)
    begin = 0
    for b, n in enumerate(lengths):
        used = -(-n // page_size)
        for half, x in enumerate((copy.k, copy.v)):
            tokens = torch.empty((used * page_size, num_kv_heads, head_dim), dtype=dtype, device=device)
            tokens[n:] = cache_hnd[pages[b, used - 1], half].transpose(0, 1)[
                n - (used - 1) * page_size:]  # the last page's tail keeps its random values
            tokens[:n] = x[begin:begin + n]
            cache_hnd[pages[b, :used], half] = tokens.view(
                used, page_size, num_kv_heads, head_dim).transpose(1, 2)
        begin += n
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return PagedPrefillCopy(copy.q, cache, block_tables, seq_lens, cu_seqlens(lengths, device))


def fp8_paged_prefill_copy(copy):
    """The paged prefill copy with its cache stored as fp8 e4m3 (value / FP8_SCALE)."""
    return dataclasses.replace(copy, kv_cache=(copy.kv_cache / FP8_SCALE).to(FP8))


def cu_seqlens(lengths, device):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)
