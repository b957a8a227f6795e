"""Small transformers models built in code with random weights: nothing is downloaded.

Shared by tests/python/transformers_integration_test.py and tools/bench/transformers_bench.py.
Each builder gives a config; :func:`build` makes the model with seeded random weights.
"""

import torch
from transformers import GptOssConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def llama_gqa_config(num_layers=2, vocab_size=512):
    """A tiny Llama with grouped-query attention: 8 qo heads over 2 kv heads, head_dim 64."""
    return LlamaConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=num_layers, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=64, max_position_embeddings=2048, rms_norm_eps=1e-5)


def qwen2_like_config(num_layers=4, sliding_window=12, vocab_size=512):
    """A tiny Qwen2 (q/k/v biases, GQA 4:1) whose upper half of the layers use a sliding
    window of `sliding_window` tokens (use_sliding_window, max_window_layers): a model with
    a full-attention and a sliding-window layer group in transformers' paged cache."""
    return Qwen2Config(vocab_size=vocab_size, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=num_layers, num_attention_heads=8, num_key_value_heads=2,
                       max_position_embeddings=2048, use_sliding_window=True,
                       sliding_window=sliding_window, max_window_layers=num_layers // 2)


def llama3_8b_attention_config(num_layers=4, vocab_size=32000):
    """Llama-3-8B's attention shape (32 qo heads, 8 kv heads, head_dim 128, hidden 4096)
    and MLP width, with `num_layers` layers and a smaller vocabulary."""
    return LlamaConfig(vocab_size=vocab_size, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=num_layers, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, max_position_embeddings=8192, rope_theta=500000.0,
                       rms_norm_eps=1e-5)


def gpt_oss_like_config(num_layers=4, sliding_window=12, vocab_size=512):
    """A tiny gpt-oss: attention sinks on every layer, sliding (window `sliding_window`,
    not a multiple of the 16-slot blocks) and full layers alternating through
    ``layer_types``, q/k/v biases, a 4-expert mixture (top 2) kept small for the CPU."""
    return GptOssConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=128,
                        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, sliding_window=sliding_window, num_local_experts=4,
                        num_experts_per_tok=2)


def build(config, seed=0, dtype=torch.float32, device="cpu"):
    """The causal LM of `config` with seeded random weights, in eval mode (gpt-oss: sinks
    drawn from N(0.5, 1.5^2) per head)."""
    classes = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}
    if config.model_type == "gpt_oss":
        from transformers import GptOssForCausalLM
        classes["gpt_oss"] = GptOssForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = classes[config.model_type](config)
        if config.model_type == "gpt_oss":
            # transformers initialises sinks near 0 (std 0.02); real gpt-oss sinks are
            # spread over a few units, and a sink that weighs from a fraction to several
            # times a row's keys is what a test of them needs.
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.self_attn.sinks.normal_(0.5, 1.5)
    return model.to(dtype).eval()


def random_prompts(lengths, vocab_size, seed=1):
    """One list of token ids per length, uniform over the vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in lengths]
