"""The replay's paged KV cache: the page pool tensor, the block table, token writes.

The pool starts filled with NaN rather than zeros: a kernel that reads a slot no token
was written to (a page's unused tail, a page past seq_len) turns its output into NaN,
which the float64 check catches. Freed pages keep their old tokens when reused, as in a
real server.
"""

import torch

KV_LAYOUTS = ("HND", "NHD")


class PagedKvCache:
    """A pool of KV pages plus the host copy of every running request's block-table row.

    Parameters
    ----------
    num_pages, num_kv_heads, page_size, head_dim : int
    dtype : torch.dtype
    device : torch.device
    kv_layout : str
        "HND": kv_cache is [num_pages, 2, num_kv_heads, page_size, head_dim];
        "NHD": [num_pages, 2, page_size, num_kv_heads, head_dim].
    num_slots : int
        Rows of the block table (the scheduler's max_batch_size).
    max_pages_per_seq : int
        Columns of the block table.
    """

    def __init__(self, num_pages, num_kv_heads, page_size, head_dim, dtype, device, kv_layout,
                 num_slots, max_pages_per_seq):
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"PagedKvCache: kv_layout invalid: expected one of {KV_LAYOUTS}, got {kv_layout!r}")
        self.page_size = page_size
        self.kv_layout = kv_layout
        self.device = device
        if kv_layout == "HND":
            shape = (num_pages, 2, num_kv_heads, page_size, head_dim)
        else:
            shape = (num_pages, 2, page_size, num_kv_heads, head_dim)
        self.kv_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        # Host side, int32 as the kernels take it; a row is valid up to its sequence's pages.
        self.block_table = torch.zeros((num_slots, max_pages_per_seq), dtype=torch.int32)

    def add_pages(self, new_pages) -> None:
        """Records (slot, logical page index, page) entries in the block table."""
        for slot, index, page in new_pages:
            self.block_table[slot, index] = page

    def block_tables(self, seqs) -> torch.Tensor:
        """block_tables [len(seqs), max pages among them] int32 on the device."""
        slots = torch.tensor([seq.slot for seq in seqs], dtype=torch.long)
        width = max(len(seq.pages) for seq in seqs)
        return self.block_table[slots, :width].to(self.device)

    def prompt_slots(self, seqs):
        """(page, offset in page) of every prompt token of each sequence, on the device."""
        pages, offsets = [], []
        for seq in seqs:
            positions = torch.arange(seq.request.context_tokens)
            pages.append(torch.tensor(seq.pages, dtype=torch.long)[positions // self.page_size])
            offsets.append(positions % self.page_size)
        return torch.cat(pages).to(self.device), torch.cat(offsets).to(self.device)

    def next_token_slots(self, seqs):
        """(page, offset in page) of each sequence's next token (position kv_len), on the device."""
        pages = [seq.pages[seq.kv_len // self.page_size] for seq in seqs]
        offsets = [seq.kv_len % self.page_size for seq in seqs]
        return (torch.tensor(pages, dtype=torch.long).to(self.device),
                torch.tensor(offsets, dtype=torch.long).to(self.device))

    def write(self, page, offset, k, v) -> None:
        """Stores tokens: k, v [num_tokens, num_kv_heads, head_dim] at (page, offset)."""
        if self.kv_layout == "HND":
            self.kv_cache[page, 0, :, offset] = k
            self.kv_cache[page, 1, :, offset] = v
        else:
            self.kv_cache[page, 0, offset] = k
            self.kv_cache[page, 1, offset] = v

    def gather(self, pages, kv_len):
        """The first kv_len tokens of a sequence with these pages: k, v [kv_len, num_kv_heads, head_dim].

        Plain indexing, independent of the kernels' page walk.
        """
        used = torch.tensor(pages[: -(-kv_len // self.page_size)], dtype=torch.long, device=self.device)
        blocks = self.kv_cache[used]
        if self.kv_layout == "HND":  # [pages, 2, heads, page_size, d] -> [2, pages * page_size, heads, d]
            tokens = blocks.permute(1, 0, 3, 2, 4)
        else:
            tokens = blocks.permute(1, 0, 2, 3, 4)
        tokens = tokens.reshape(2, -1, tokens.shape[-2], tokens.shape[-1])[:, :kv_len]
        return tokens[0], tokens[1]

    def gather_padded(self, seqs, kv_lens):
        """k, v [len(seqs), max(kv_lens), num_kv_heads, head_dim]: each sequence's first kv_len
        tokens, then whatever its pages (or page 0, as filler) hold past that."""
        width = -(-max(kv_lens) // self.page_size)
        table = [seq.pages[:width] + [0] * (width - len(seq.pages[:width])) for seq in seqs]
        blocks = self.kv_cache[torch.tensor(table, dtype=torch.long, device=self.device)]
        if self.kv_layout == "HND":  # [b, pages, 2, heads, page_size, d] -> [2, b, pages, page_size, heads, d]
            tokens = blocks.permute(2, 0, 1, 4, 3, 5)
        else:
            tokens = blocks.permute(2, 0, 1, 3, 4, 5)
        tokens = tokens.reshape(2, len(seqs), width * self.page_size, *tokens.shape[-2:])[:, :, :max(kv_lens)]
        return tokens[0], tokens[1]
