"""Tests of --kv_dtype=fp8_e4m3's pieces without the extension: the scales, the one
quantization (saturating, counted), the dequantization the checks use, and an fp8 pool's
writes and gathers (bitwise)."""

import sys

import pytest
import torch

from tools.replay import kv_quant
from tools.replay.paged_cache import PagedKvCache
from tools.replay.token_source import TokenSource

FP8 = torch.float8_e4m3fn


def test_scales_are_calibration_amax_over_448_and_values_round_trip():
    tokens = TokenSource(3, torch.device("cpu"), torch.bfloat16, 8, 2, 16)
    k_amax, v_amax = tokens.calibration_amax(kv_quant.CALIBRATION_TOKENS)
    assert k_amax.shape == (2,) and bool((k_amax > 3).all() and (k_amax < 7).all())
    quant = kv_quant.Fp8KvQuantizer(k_amax, v_amax)
    assert torch.equal(quant.k_scale, k_amax / 448) and quant.k_scale.dtype == torch.float32
    # The calibration sample has its own generator: the token stream is not consumed by it.
    fresh = TokenSource(3, torch.device("cpu"), torch.bfloat16, 8, 2, 16)
    assert all(torch.equal(a, b) for a, b in zip(tokens.draw(5), fresh.draw(5)))
    _, k, v = tokens.draw(300)
    k8, v8 = quant.quantize(k, v)
    assert k8.dtype == FP8 and v8.dtype == FP8 and k8.shape == k.shape
    k64, v64 = quant.dequantize(k8, v8)
    # e4m3 keeps 3 mantissa bits: within 2^-4 relative, and subnormal steps near zero.
    for x, x64, scale in ((k, k64, quant.k_scale), (v, v64, quant.v_scale)):
        step = (2.0 ** -9) * scale.double()[:, None]
        assert bool(((x64 - x.double()).abs() <= x.double().abs() / 16 + step).all())
    assert quant.values == k.numel() and quant.saturated() == (0, 0)


def test_values_past_the_amax_saturate_and_are_counted():
    # amax 448 * 2^-n: exact scales 1/256, 1/128 (K) and 1/64 (V).
    quant = kv_quant.Fp8KvQuantizer(torch.tensor([1.75, 3.5]), torch.tensor([7.0, 7.0]))
    k = torch.tensor([[[0.5, 3.0], [-5.0, 1.0]]])  # [1 token, 2 heads, 2]: 3.0 and -5.0 past the amax
    v = torch.tensor([[[4.0, -4.0], [0.0, 1.0]]])
    k8, v8 = quant.quantize(k, v)
    k64, v64 = quant.dequantize(k8, v8)
    assert k64.tolist() == [[[0.5, 1.75], [-3.5, 1.0]]]
    assert v64.tolist() == [[[4.0, -4.0], [0.0, 1.0]]]
    assert quant.saturated() == (2, 0)


def test_zero_amax_is_refused():
    with pytest.raises(ValueError, match="replay: fp8 calibration invalid: expected amax > 0 per kv head"):
        kv_quant.Fp8KvQuantizer(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]))


@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
def test_fp8_pool_writes_and_gathers_bitwise(kv_layout):
    cache = PagedKvCache(4, 2, 4, 8, FP8, torch.device("cpu"), kv_layout, 1, 3)
    assert bool(cache.kv_cache.float().isnan().all())  # unwritten slots read NaN
    gen = torch.Generator().manual_seed(1)
    k = (torch.randn(6, 2, 8, generator=gen) * 50).to(FP8)
    v = (torch.randn(6, 2, 8, generator=gen) * 50).to(FP8)
    pages = [2, 0]
    positions = torch.arange(6)
    cache.write(torch.tensor(pages)[positions // 4], positions % 4, k, v)
    got_k, got_v = cache.gather(pages, 6)
    assert torch.equal(got_k.view(torch.uint8), k.view(torch.uint8))
    assert torch.equal(got_v.view(torch.uint8), v.view(torch.uint8))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
