"""transformers_bench: tokens/s of transformers' continuous batching (generate_batch) with
splitkv against transformers' default paged attention, same model, same prompts.

    ./tools/bazel run //tools/bench:transformers_bench -- --device=cpu       # tiny Llama, CPU
    ./tools/bazel run //tools/bench:transformers_bench -- --device=cpu --model=gpt_oss_tiny \
        --implementations='paged|eager,paged|splitkv'                       # sinks + window
    # GPU machine (no Bazel), from a staged CUDA package (tools/gpu/README.md):
    PYTHONPATH=.device:tests/python python3 tools/bench/transformers_bench.py --device=cuda \
        --model=llama3_8b_attention --num_prompts=64 --max_new_tokens=128

The model is built in code with random weights (tests/python/transformers_models.py):
nothing is downloaded. Greedy decoding without EOS, so every request generates exactly
--max_new_tokens tokens and both implementations run the same schedule. Each
implementation gets one warm-up generate_batch on a few prompts, then --repeats timed runs
of the whole batch; the table gives the best run's generated tokens/s, all tokens/s
(prompt + generated) and wall seconds, and how many requests' tokens equal the first
implementation's. Writes the same to --out_json. Exits 1 if a request fails.
"""

import json
import logging
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(os.path.dirname(_HERE))
# The models are built in code: nothing is fetched (an accidental download fails at once).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if __package__ in (None, ""):
    # Run as a script (the GPU machine): the model builders live with the tests.
    sys.path.append(os.path.join(_REPO_ROOT, "tests", "python"))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import torch  # noqa: E402
from transformers import ContinuousBatchingConfig, GenerationConfig  # noqa: E402

import splitkv.integrations.transformers as splitkv_hf  # noqa: E402
import transformers_models as models  # noqa: E402

_MODELS = {
    "llama_tiny": models.llama_gqa_config,
    "qwen2_tiny": models.qwen2_like_config,
    "llama3_8b_attention": models.llama3_8b_attention_config,
    # gpt-oss (sinks, alternating window): transformers refuses sdpa for it, so pass
    # --implementations='paged|eager,paged|splitkv'.
    "gpt_oss_tiny": models.gpt_oss_like_config,
}

FLAGS = flags.FLAGS
flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "Where to run; auto: cuda when present.")
flags.DEFINE_enum("model", "auto", ["auto"] + sorted(_MODELS),
                  "Config (random weights); auto: llama3_8b_attention on cuda, llama_tiny on the CPU.")
flags.DEFINE_integer("num_layers", 0, "Layers; 0: the config's default (4 for llama3_8b_attention).")
flags.DEFINE_enum("dtype", "auto", ["auto", "float32", "bfloat16", "float16"],
                  "auto: bfloat16 on cuda, float32 on the CPU.")
flags.DEFINE_integer("num_prompts", 16, "Requests in the batch.")
flags.DEFINE_integer("min_prompt_len", 8, "Shortest prompt, tokens.")
flags.DEFINE_integer("max_prompt_len", 128, "Longest prompt, tokens (lengths spread evenly between).")
flags.DEFINE_integer("max_new_tokens", 32, "Tokens generated per request.")
flags.DEFINE_integer("block_size", 0, "Paged cache block size; 0: 256 on cuda, 16 on the CPU.")
flags.DEFINE_integer("num_blocks", 0, "Cache blocks; 0: enough for every request at once.")
flags.DEFINE_integer("max_batch_tokens", 0, "Tokens per forward; 0: 2048 on cuda, 256 on the CPU.")
flags.DEFINE_integer("repeats", 3, "Timed runs per implementation (the best is reported).")
flags.DEFINE_list("implementations", ["paged|sdpa", splitkv_hf.ATTN_IMPLEMENTATION],
                  "Attention implementations; the first is the reference of the token check.")
flags.DEFINE_string("out_json", "/tmp/splitkv_transformers_bench.json", "Where the results go.")


def _settings():
    device = FLAGS.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    model = FLAGS.model if FLAGS.model != "auto" else ("llama3_8b_attention" if cuda else "llama_tiny")
    dtype = FLAGS.dtype if FLAGS.dtype != "auto" else ("bfloat16" if cuda else "float32")
    block_size = FLAGS.block_size or (256 if cuda else 16)
    longest = FLAGS.max_prompt_len + FLAGS.max_new_tokens
    num_blocks = FLAGS.num_blocks or FLAGS.num_prompts * (-(-longest // block_size) + 1)
    return dict(device=device, model=model, dtype=dtype, block_size=block_size,
                num_blocks=num_blocks, max_batch_tokens=FLAGS.max_batch_tokens or (2048 if cuda else 256))


def _run(model, prompts, settings, max_new_tokens):
    cb_config = ContinuousBatchingConfig(block_size=settings["block_size"],
                                         num_blocks=settings["num_blocks"],
                                         max_batch_tokens=settings["max_batch_tokens"])
    generation_config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                                         eos_token_id=-1, pad_token_id=0)
    start = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=generation_config,
                                   continuous_batching_config=cb_config, progress_bar=False)
    seconds = time.perf_counter() - start
    for rid, output in outputs.items():
        if output.error is not None or len(output.generated_tokens) != max_new_tokens:
            sys.exit(f"transformers_bench: request {rid} failed: {output.error or 'short output'}")
    return seconds, {rid: output.generated_tokens for rid, output in outputs.items()}


def main(argv):
    del argv
    # Continuous batching logs each manager start and stop at INFO: keep the table readable.
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)
    splitkv_hf.register()
    settings = _settings()
    builder = _MODELS[settings["model"]]
    config = builder(num_layers=FLAGS.num_layers) if FLAGS.num_layers else builder()
    model = models.build(config, dtype=getattr(torch, settings["dtype"]), device=settings["device"])
    span = FLAGS.max_prompt_len - FLAGS.min_prompt_len
    lengths = [FLAGS.min_prompt_len + span * i // max(1, FLAGS.num_prompts - 1)
               for i in range(FLAGS.num_prompts)]
    prompts = models.random_prompts(lengths, config.vocab_size)
    prompt_tokens, generated = sum(lengths), FLAGS.num_prompts * FLAGS.max_new_tokens

    rows, reference = [], None
    for implementation in FLAGS.implementations:
        model.set_attn_implementation(implementation)
        _run(model, prompts[:4], settings, 4)  # warm-up: allocator, kernels, workspace
        best, tokens = None, None
        for _ in range(FLAGS.repeats):
            seconds, tokens = _run(model, prompts, settings, FLAGS.max_new_tokens)
            best = seconds if best is None else min(best, seconds)
        reference = tokens if reference is None else reference
        same = sum(tokens[rid] == reference[rid] for rid in reference)
        rows.append(dict(implementation=implementation, seconds=best,
                         generated_tokens_per_s=generated / best,
                         all_tokens_per_s=(prompt_tokens + generated) / best,
                         requests_equal_to_first=same))

    print(f"model {settings['model']} ({config.num_hidden_layers} layers, {settings['dtype']}, "
          f"{settings['device']}), {FLAGS.num_prompts} prompts of {FLAGS.min_prompt_len}.."
          f"{FLAGS.max_prompt_len} tokens, {FLAGS.max_new_tokens} new tokens each, block_size "
          f"{settings['block_size']}, max_batch_tokens {settings['max_batch_tokens']}, best of "
          f"{FLAGS.repeats}\n")
    print("| implementation | generated tok/s | all tok/s | seconds | requests equal to first |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        name = row["implementation"].replace("|", "\\|")  # a literal | in a markdown cell
        print(f"| {name} | {row['generated_tokens_per_s']:.1f} | "
              f"{row['all_tokens_per_s']:.1f} | {row['seconds']:.3f} | "
              f"{row['requests_equal_to_first']}/{FLAGS.num_prompts} |")
    with open(FLAGS.out_json, "w") as f:
        json.dump(dict(settings=settings, num_prompts=FLAGS.num_prompts, prompt_lengths=lengths,
                       max_new_tokens=FLAGS.max_new_tokens, repeats=FLAGS.repeats,
                       torch=torch.__version__, rows=rows), f, indent=2)


if __name__ == "__main__":
    app.run(main)
