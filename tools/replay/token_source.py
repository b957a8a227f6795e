"""Deterministic random Q/K/V for the replayed tokens (the trace has sizes, not text, and
there is no model). One seeded generator on the device draws every step's tokens in step
order, so a run is reproducible from --seed; standard normal values, never zeros."""

import torch


class TokenSource:
    def __init__(self, seed, device, dtype, num_qo_heads, num_kv_heads, head_dim):
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(seed)
        self._device = device
        self._dtype = dtype
        self._shapes = (num_qo_heads, num_kv_heads, head_dim)

    def _draw(self, num_tokens, num_heads, head_dim):
        x = torch.randn((num_tokens, num_heads, head_dim), generator=self._generator,
                        device=self._device, dtype=torch.float32)
        return x.to(self._dtype)

    def draw(self, num_tokens):
        """q [num_tokens, num_qo_heads, head_dim], k and v [num_tokens, num_kv_heads, head_dim]."""
        num_qo_heads, num_kv_heads, head_dim = self._shapes
        return (self._draw(num_tokens, num_qo_heads, head_dim),
                self._draw(num_tokens, num_kv_heads, head_dim),
                self._draw(num_tokens, num_kv_heads, head_dim))
