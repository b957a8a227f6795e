"""Deterministic random Q/K/V for the replayed tokens (the trace has sizes, not text, and
there is no model). One seeded generator on the device draws every step's tokens in step
order, so a run is reproducible from --seed; standard normal values, never zeros."""

import torch

# Seed offset of the calibration sample's own generator: a sample of the same distribution
# that never consumes the token stream, so fp8 runs draw the same tokens as others. Within
# 32 bits: the CPU generator keeps only a seed's low 32 bits.
_CALIBRATION_SEED = 0x6A09E667


class TokenSource:
    def __init__(self, seed, device, dtype, num_qo_heads, num_kv_heads, head_dim):
        self._seed = seed
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(seed)
        self._device = device
        self._dtype = dtype
        self._shapes = (num_qo_heads, num_kv_heads, head_dim)

    def _draw(self, num_tokens, num_heads, head_dim, generator=None):
        x = torch.randn((num_tokens, num_heads, head_dim), generator=generator or self._generator,
                        device=self._device, dtype=torch.float32)
        return x.to(self._dtype)

    def draw(self, num_tokens):
        """q [num_tokens, num_qo_heads, head_dim], k and v [num_tokens, num_kv_heads, head_dim]."""
        num_qo_heads, num_kv_heads, head_dim = self._shapes
        return (self._draw(num_tokens, num_qo_heads, head_dim),
                self._draw(num_tokens, num_kv_heads, head_dim),
                self._draw(num_tokens, num_kv_heads, head_dim))

    def calibration_amax(self, num_tokens):
        """(k_amax, v_amax) [num_kv_heads]: largest |value| per kv head of num_tokens K and V
        tokens from the same distribution (own generator, seeded from this one's seed)."""
        _, num_kv_heads, head_dim = self._shapes
        generator = torch.Generator(device=self._device)
        generator.manual_seed(self._seed + _CALIBRATION_SEED)
        k = self._draw(num_tokens, num_kv_heads, head_dim, generator)
        v = self._draw(num_tokens, num_kv_heads, head_dim, generator)
        return k.float().abs().amax((0, 2)), v.float().abs().amax((0, 2))
