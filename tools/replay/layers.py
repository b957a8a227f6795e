"""The attention layers the replay runs at every step (presets.layers()): one for most
presets, a windowed and a full one for gpt-oss-20b. Each has its own K/V pool (the same
block tables: a request's pages are reserved once for every layer, as in a server), its
own token stream, its window and sinks, and with --kv_dtype=fp8_e4m3 its fp8 scales."""

import torch

from tools.replay import kv_quant
from tools.replay.paged_cache import PagedKvCache
from tools.replay.presets import layers as layer_kinds
from tools.replay.token_source import TokenSource

# Seed offsets: layer i's tokens come from seed + i * _LAYER_SEED (layer 0 draws what a
# one-layer replay draws), its sinks from seed + _SINKS_SEED + i. Odd 32-bit constants: the
# CPU generator keeps only a seed's low 32 bits, so 1 << 32 would repeat layer 0's stream.
_LAYER_SEED = 0x9E3779B9
_SINKS_SEED = 0xBB67AE85
# Sinks are uniform in [_SINKS_LOW, _SINKS_HIGH) (natural-log units): against the ~e^0.5
# each key brings (standard normal q, k; sm_scale 1/sqrt(head_dim)), from a negligible
# share of a short row's softmax to most of it, and always visible in the LSE.
_SINKS_LOW, _SINKS_HIGH = -2.0, 6.0


def _sinks(seed, index, num_qo_heads, device):
    generator = torch.Generator().manual_seed(seed + _SINKS_SEED + index)
    sinks = torch.rand(num_qo_heads, generator=generator) * (_SINKS_HIGH - _SINKS_LOW) + _SINKS_LOW
    return sinks.to(device)  # float32 [num_qo_heads]


class Layer:
    """One replayed attention layer.

    Attributes: name ("full", "sliding"), window_left, sinks (float32 [num_qo_heads] or
    None), cache (PagedKvCache), tokens (TokenSource), quant (kv_quant.Fp8KvQuantizer or
    None), tag (" (sliding layer)" in messages when the step runs several layers, else ""),
    shards (context_parallel.ShardedCalls under --context_parallel, set by the runner; else None).
    """

    def __init__(self, kind, index, num_layers, config, cache_args):
        shape = config.shape
        self.name = kind.name
        self.window_left = kind.window_left
        self.tag = f" ({kind.name} layer)" if num_layers > 1 else ""
        self.sinks = _sinks(config.seed, index, shape.num_qo_heads, config.device) if kind.sinks else None
        self.tokens = TokenSource(config.seed + index * _LAYER_SEED, config.device, config.dtype,
                                  shape.num_qo_heads, shape.num_kv_heads, shape.head_dim)
        self.quant = None
        if config.kv_dtype == kv_quant.FP8:
            # Scales fixed before the first token is written.
            self.quant = kv_quant.Fp8KvQuantizer(*self.tokens.calibration_amax(kv_quant.CALIBRATION_TOKENS))
        self.cache = PagedKvCache(*cache_args)
        self.shards = None

    def draw(self, num_tokens):
        """q, and k, v as stored (fp8 with --kv_dtype=fp8_e4m3): what the cache and the calls get."""
        q, k, v = self.tokens.draw(num_tokens)
        if self.quant is not None:
            k, v = self.quant.quantize(k, v)
        return q, k, v

    def call_options(self):
        """This layer's keyword arguments of every splitkv call (none for a plain layer)."""
        options = {}
        if self.window_left >= 0:
            options["window_left"] = self.window_left
        if self.sinks is not None:
            options["sinks"] = self.sinks
        if self.quant is not None:
            options.update(k_scale=self.quant.k_scale, v_scale=self.quant.v_scale)
        return options

    def reference_options(self):
        """The same semantics for splitkv_reference (it takes dequantized K/V instead of scales)."""
        options = {}
        if self.window_left >= 0:
            options["window_left"] = self.window_left
        if self.sinks is not None:
            options["sinks"] = self.sinks
        return options

    def reference_kv(self, k, v):
        """K/V read back from the cache as the reference takes them: stored * scale for fp8."""
        return (k, v) if self.quant is None else self.quant.dequantize(k, v)


def make_layers(config, cache_args):
    """The Layer of each kind config.shape's preset replays, in call order."""
    kinds = layer_kinds(config.shape)
    return [Layer(kind, i, len(kinds), config, cache_args) for i, kind in enumerate(kinds)]
