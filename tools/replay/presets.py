"""Attention shapes of a few models, as the replay's --model presets.

The default, llama3-8b-tp8, is what one GPU of an 8-way tensor-parallel Llama-3-8B
deployment runs: Llama-3-8B's 32 query and 8 KV heads split 8 ways give 4 query heads
and 1 KV head per GPU (GQA group 4), head_dim 128, pages of 16 tokens. It keeps the
real head_dim and group size at an eighth of the arithmetic of the whole model, which
makes the 2-core CPU replay of the trace's real prompt and generation lengths practical.

gpt-oss-20b alternates two kinds of attention layer, a 128-token sliding window and full
attention, both with learnable sinks: the replay runs one layer of each kind per step
(layers()), each with its own K/V pool, tokens and sinks.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    description: str
    # Tokens a query of a windowed layer sees, itself included (window_left = this - 1);
    # 0: the model has no windowed layers.
    sliding_window: int = 0
    # Learnable attention sinks (one logit per qo head) on every layer.
    sinks: bool = False


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """One attention layer the replay runs at every step."""

    name: str  # "full" or "sliding"
    window_left: int  # splitkv's window_left: -1 for none
    sinks: bool


PRESETS = {
    "llama3-8b-tp8": AttentionShape(4, 1, 128, 16, "Llama-3-8B, one GPU of 8-way tensor parallelism"),
    "llama3-8b": AttentionShape(32, 8, 128, 16, "Llama-3-8B (Llama-3.1-8B), one GPU"),
    "llama3-70b-tp8": AttentionShape(8, 1, 128, 16, "Llama-3-70B, one GPU of 8-way tensor parallelism"),
    "qwen2.5-7b": AttentionShape(28, 4, 128, 16, "Qwen2.5-7B, one GPU"),
    "gpt-oss-20b": AttentionShape(64, 8, 64, 16, "gpt-oss-20b, one GPU: sinks on every layer, a "
                                  "128-token window on every other", sliding_window=128, sinks=True),
}

DEFAULT_PRESET = "llama3-8b-tp8"


def get_preset(name: str) -> AttentionShape:
    if name not in PRESETS:
        raise ValueError(f"replay: --model invalid: expected one of {sorted(PRESETS)}, got {name!r}")
    return PRESETS[name]


def layers(shape: AttentionShape):
    """The layers replayed per step: one full-attention layer, or with a sliding window one
    windowed layer then one full layer (gpt-oss's order: its even layers are windowed)."""
    full = LayerKind("full", -1, shape.sinks)
    if not shape.sliding_window:
        return (full,)
    return (LayerKind("sliding", shape.sliding_window - 1, shape.sinks), full)
