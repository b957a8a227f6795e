"""The replay's checks: outputs against the float64 reference, and the workspace's counter region."""

import dataclasses

import torch

import splitkv_reference

# (atol, rtol) of an output against float64 on the same (rounded) inputs: the kernels
# accumulate in float32, so what is left is mostly the output's own rounding. An fp8 pool
# is compared on its dequantized values (stored * scale) with q's dtype's tolerances.
OUTPUT_TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.5e-2, 1.5e-2),
}
# LSE is float32 whatever the input dtype.
LSE_ATOL = 1e-3


@dataclasses.dataclass
class CheckStats:
    """What the output checks saw, per call kind ("prefill", "decode")."""

    calls: dict = dataclasses.field(default_factory=lambda: {"prefill": 0, "decode": 0})
    requests: int = 0
    max_out_error: float = 0.0
    max_lse_error: float = 0.0
    failures: list = dataclasses.field(default_factory=list)
    layer_requests: dict = dataclasses.field(default_factory=dict)  # request checks per layer name


# Bound on float64 K (or V) elements gathered at once for a batch of decode checks (128 MiB).
_MAX_DECODE_ELEMENTS = 1 << 24


def _compare(kind, step, seq, layer, q_len, kv_len, got_out, got_lse, ref_out, ref_lse, stats):
    """Updates stats with one request's errors; returns a failure message or None."""
    atol, rtol = OUTPUT_TOLERANCES[got_out.dtype]
    diff = (got_out.to(torch.float64) - ref_out).abs()
    # NaN counts as an infinite error: a kernel that read a NaN-filled unused slot fails.
    out_error = float(diff.nan_to_num(nan=float("inf")).max())
    lse_error = float((got_lse.to(torch.float64) - ref_lse).abs().nan_to_num(nan=float("inf")).max())
    stats.requests += 1
    stats.layer_requests[layer.name] = stats.layer_requests.get(layer.name, 0) + 1
    stats.max_out_error = max(stats.max_out_error, out_error)
    stats.max_lse_error = max(stats.max_lse_error, lse_error)
    if bool((diff <= atol + rtol * ref_out.abs()).all()) and lse_error <= LSE_ATOL:
        return None
    return (f"{kind} step {step} request {seq.request.index}{layer.tag} (q_len {q_len}, kv_len {kv_len}): "
            f"out max abs error {out_error:.3g} (tolerance {atol:g} + {rtol:g}*|ref|), "
            f"lse max abs error {lse_error:.3g} (tolerance {LSE_ATOL:g})")


def check_prefill(step, seqs, q, out, lse, layer, sm_scale, stats):
    """Compares a ragged prefill's out and lse, request by request, with float64 attention.

    The reference reads K/V back from the layer's paged cache (dequantized when fp8), not
    from the ragged k and v the kernel read, so this also confirms the prompt's tokens
    landed in the right pages; with the layer's window and sinks. Returns the failure
    messages (also appended to stats.failures).
    """
    stats.calls["prefill"] += 1
    messages = []
    offset = 0
    options = layer.reference_options()
    for seq in seqs:
        length = seq.request.context_tokens
        k, v = layer.reference_kv(*layer.cache.gather(seq.pages, length))
        ref_out, ref_lse = splitkv_reference.attention(q[offset:offset + length], k, v, causal=True,
                                                       sm_scale=sm_scale, **options)
        message = _compare("prefill", step, seq, layer, length, length, out[offset:offset + length],
                           lse[offset:offset + length], ref_out, ref_lse, stats)
        messages += [message] if message else []
        offset += length
    stats.failures.extend(messages)
    return messages


def check_decode(step, seqs, kv_lens, q, out, lse, layer, sm_scale, stats):
    """Compares a paged decode's out and lse with float64 attention, in padded batches.

    The reference gathers each request's pages with plain indexing from its own page list,
    independent of the kernel's walk of block_tables (dequantized when fp8), with the
    layer's window and sinks. Returns the failure messages.
    """
    stats.calls["decode"] += 1
    messages = []
    cache = layer.cache
    options = layer.reference_options()
    per_token = q.shape[2] * cache.kv_cache.shape[2 if cache.kv_layout == "HND" else 3]
    # Shortest first, so each padded batch holds requests of similar length.
    order = sorted(range(len(seqs)), key=lambda i: kv_lens[i])
    begin = 0
    while begin < len(order):
        end = begin + 1
        while end < len(order) and (end + 1 - begin) * kv_lens[order[end]] * per_token <= _MAX_DECODE_ELEMENTS:
            end += 1
        chunk = order[begin:end]
        index = torch.tensor(chunk, device=q.device)
        k, v = layer.reference_kv(*cache.gather_padded([seqs[i] for i in chunk], [kv_lens[i] for i in chunk]))
        lens = torch.tensor([kv_lens[i] for i in chunk], device=q.device)
        ref_out, ref_lse = splitkv_reference.decode_attention(q[index], k, v, lens, sm_scale=sm_scale,
                                                              **options)
        got_out, got_lse = out[index], lse[index]
        for j, i in enumerate(chunk):
            message = _compare("decode", step, seqs[i], layer, 1, kv_lens[i], got_out[j:j + 1], got_lse[j:j + 1],
                               ref_out[j:j + 1], ref_lse[j:j + 1], stats)
            messages += [message] if message else []
        begin = end
    stats.failures.extend(messages)
    return messages


class CounterRegionMonitor:
    """Checks after every step that the workspace's counter region is all zero.

    On a GPU the per-step counts stay on the device and are read back every
    `sync_every` steps (and at flush()), so the check adds no sync per step.
    """

    def __init__(self, workspace_buffer, counter_region_bytes, sync_every=256):
        self._region = workspace_buffer[:counter_region_bytes]
        self._on_host = workspace_buffer.device.type == "cpu"
        # Counted as 8-byte words. On the CPU numpy scans them on one thread in ~0.3 ms, where
        # torch's count_nonzero takes several ms (and far more when other work holds the cores).
        if self._on_host:
            import numpy  # only here: a GPU machine's torch may come without it

            self._words = self._region.numpy().view(numpy.uint64)
            self._count_nonzero = numpy.count_nonzero
        else:
            self._words = self._region.view(torch.int64)
        self._sync_every = sync_every
        self._pending = []  # (step, device count of nonzero words)
        self.steps_checked = 0
        self.failure = None  # message of the first failing step

    @property
    def ok(self) -> bool:
        return self.failure is None

    def after_step(self, step) -> bool:
        """Records the count after `step`; returns False once a failure is known."""
        if self._on_host:
            self.steps_checked += 1
            if self._count_nonzero(self._words) and self.failure is None:
                self.failure = f"counter region not zero after step {step}: " + self._describe()
            return self.ok
        self._pending.append((step, torch.count_nonzero(self._words)))
        if len(self._pending) >= self._sync_every:
            self.flush()
        return self.ok

    def flush(self) -> None:
        if not self._pending:
            return
        steps = [step for step, _ in self._pending]
        counts = torch.stack([count for _, count in self._pending]).cpu().tolist()
        self._pending = []
        for step, count in zip(steps, counts):
            self.steps_checked += 1
            if count and self.failure is None:
                self.failure = f"counter region not zero after step {step}: " + self._describe()
                return

    def _describe(self):
        counters = self._region.view(torch.int32)
        nonzero = torch.nonzero(counters).flatten().cpu()
        if nonzero.numel() == 0:  # already zero again by the time a GPU count is read
            return "nonzero when counted, zero now"
        first = int(nonzero[0])
        return (f"{nonzero.numel()} nonzero counters in bytes [0, {self._region.numel()}), the first "
                f"counter {first} (byte {4 * first}) = {int(counters[first])}")
