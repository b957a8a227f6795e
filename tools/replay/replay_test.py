"""End-to-end tests of the replay through splitkv: a short replay passes every check with
real values (bf16/fp16/fp32 pools, an fp8 pool, the two-layer gpt-oss-20b preset with its
window and sinks), each injected fault is caught and makes the binary exit 1, and a kernel
call that dropped the window, the sinks or the fp8 scale would fail the checks."""

import os
import subprocess
import sys

import pytest
import torch

from tools.replay import checks
from tools.replay import layers
from tools.replay.presets import PRESETS, AttentionShape
from tools.replay.runner import ReplayConfig, run_replay
from tools.replay.trace import TraceRequest

# (arrival s, prompt tokens, generated tokens): a prompt of one token, page-boundary lengths,
# overlapping decodes, a long one whose decodes the planner splits, a request arriving while
# the batch is idle.
_SPECS = [(0.0, 1, 5), (0.0, 16, 3), (0.01, 17, 40), (0.05, 1100, 12), (0.3, 33, 20), (9.0, 97, 6)]
_REQUESTS = [TraceRequest(i, *spec) for i, spec in enumerate(_SPECS)]
# gpt-oss-20b's 64 qo heads make the float64 checks 16x dearer: a 300-token prompt in place
# of the 1100 one (still past the 128-token window, in its prefill and its decodes).
_GPT_OSS_REQUESTS = [TraceRequest(i, a, 300 if p == 1100 else p, g) for i, (a, p, g) in enumerate(_SPECS)]
FP8 = torch.float8_e4m3fn
GPT_OSS = PRESETS["gpt-oss-20b"]


def _config(**overrides):
    values = dict(requests=_GPT_OSS_REQUESTS if overrides.get("shape") == GPT_OSS else _REQUESTS,
                  shape=PRESETS["llama3-8b-tp8"], device=torch.device("cpu"),
                  dtype=torch.bfloat16, num_pages=512, max_batch_size=4, check_every=1,
                  workspace_bytes=32 << 20, progress=False)
    values.update(overrides)
    return ReplayConfig(**values)


@pytest.mark.parametrize("overrides", [
    {},
    {"dtype": torch.float32, "kv_layout": "NHD"},
    {"dtype": torch.float16, "decode_num_splits": 3, "prefill_num_splits": 2,
     "shape": AttentionShape(8, 2, 64, 4, "small pages")},
    {"kv_dtype": FP8},
    {"kv_dtype": FP8, "dtype": torch.float16, "kv_layout": "NHD", "decode_num_splits": 3,
     "prefill_num_splits": 2, "shape": AttentionShape(8, 2, 64, 4, "small pages")},
    # Forced splits: each row's sink must enter the merge once.
    {"shape": GPT_OSS, "decode_num_splits": 3, "prefill_num_splits": 2, "workspace_bytes": 96 << 20},
])
def test_short_replay_passes(overrides):
    config = _config(**overrides)
    result = run_replay(config)
    stats = result.check_stats
    assert result.ok, (result.error, result.counter_failure, stats.failures)
    assert result.finished == 6
    assert result.prefill_tokens == sum(r.context_tokens for r in config.requests) in (1264, 464)
    assert result.decode_tokens == sum(s[2] - 1 for s in _SPECS) == 80
    assert result.counter_steps_checked == result.steps > 40
    # Every call of every layer was checked, against real values: the error is small but not zero.
    num_layers = len(result.layers)
    assert num_layers == (2 if config.shape.sliding_window else 1)
    assert stats.calls == {"prefill": num_layers * result.prefill_calls, "decode": num_layers * result.decode_calls}
    assert set(stats.layer_requests) == {layer.name for layer in result.layers}
    assert len(set(stats.layer_requests.values())) == 1  # as many checks on each layer
    atol, _ = checks.OUTPUT_TOLERANCES[config.dtype]
    assert 0.0 < stats.max_out_error < 2 * atol and stats.max_lse_error < checks.LSE_ATOL
    # Small batches on few workers split the KV, so the counters were used and reset.
    assert result.split_calls["decode"] > 0
    if config.kv_dtype is not None:
        pool = result.layers[0].cache.kv_cache
        assert pool.dtype == FP8 and result.layers[0].quant.k_scale.shape == (config.shape.num_kv_heads,)
    if config.decode_num_splits:
        assert result.max_num_splits["decode"] == 3
        assert result.split_calls["prefill"] == num_layers * result.prefill_calls


@pytest.mark.parametrize("overrides", [{}, {"kv_dtype": FP8, "shape": GPT_OSS}])
def test_batch_invariant_replay_reruns_alone_bitwise(overrides):
    """--batch_invariant: every checked call re-runs its requests alone, and none differs;
    the 1100-token prompt crosses the 1024-key invariant split. With fp8 and gpt-oss-20b the
    re-runs take the layer's window, sinks and scales (the prompts stay under 1024 there)."""
    result = run_replay(_config(batch_invariant=True, **overrides))
    inv = result.invariance
    num_layers = len(result.layers)
    assert result.ok, (result.error, result.counter_failure, result.check_stats.failures, inv.failures)
    assert inv.compared["prefill"] == num_layers * len(_SPECS)
    assert inv.compared["decode"] >= num_layers * result.decode_calls
    assert inv.differed == 0


@pytest.mark.parametrize("overrides, tag", [({}, ""), ({"kv_dtype": FP8}, ""),
                                            ({"shape": GPT_OSS}, " (sliding layer)")])
def test_output_fault_is_caught(overrides, tag):
    result = run_replay(_config(inject_fault="output", **overrides))
    assert not result.ok and result.counter_failure is None
    assert len(result.check_stats.failures) == 1
    assert result.check_stats.failures[0].startswith(
        f"prefill step 0 request 0{tag} (q_len 1, kv_len 1): out max abs error")
    assert result.finished == 6  # an output mismatch is recorded and the replay goes on


def _without(option, scale=1.0):
    """Layer.call_options as a kernel that ignored `option` (or read the K scale times
    `scale`) would behave: the checks still apply the true semantics."""
    honest = layers.Layer.call_options

    def call_options(self):
        options = honest(self)
        options.pop(option, None)
        if scale != 1.0:
            options["k_scale"] = options["k_scale"] * scale
        return options

    return call_options


@pytest.mark.parametrize("option, scale, overrides, failing", [
    ("sinks", 1.0, {"shape": GPT_OSS}, {"sliding", "full"}),
    ("window_left", 1.0, {"shape": GPT_OSS}, {"sliding"}),
    (None, 1.01, {"kv_dtype": FP8}, {"full"}),
])
def test_checks_see_window_sinks_and_scales(monkeypatch, option, scale, overrides, failing):
    """Calls that drop the sinks or the window, or read K 1 % off its scale, fail the
    float64 checks on the layers concerned (and only there)."""
    monkeypatch.setattr(layers.Layer, "call_options", _without(option, scale))
    result = run_replay(_config(**overrides))
    stats = result.check_stats
    assert not result.ok and result.error is None and result.counter_failure is None
    failed = {"sliding" if "(sliding layer)" in m else "full" for m in stats.failures}
    assert failed == failing, stats.failures[:3]


def test_counter_fault_stops_the_replay():
    result = run_replay(_config(inject_fault="counter"))
    assert not result.ok
    assert result.counter_failure == ("counter region not zero after step 0: 1 nonzero counters in bytes "
                                      "[0, 8388608), the first counter 1000 (byte 4000) = 1")
    assert result.finished == 0
    assert result.steps == result.counter_steps_checked == 1  # the step that left it ran its calls


def test_pool_past_memory_is_refused():
    with pytest.raises(ValueError, match="run_replay: KV pool too large: .* lower --num_pages or --page_size"):
        run_replay(_config(num_pages=2**31 - 1))
    # A max_batch_size far past the requests makes no huge slot list or block table.
    result = run_replay(_config(max_batch_size=2**40, check_every=0))
    assert result.ok and result.finished == 6


def _binary(*args):
    replay = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay")
    return subprocess.run([replay, "--max_requests=4", "--noprogress", *args], capture_output=True,
                          text=True, timeout=600)


def test_binary_exit_codes():
    ok = _binary()
    assert ok.returncode == 0, ok.stderr
    assert "requests             4 replayed, 4 finished" in ok.stdout
    assert "result               PASS" in ok.stdout
    for fault in ("output", "counter"):
        bad = _binary(f"--inject_fault={fault}")
        assert bad.returncode == 1, bad.stderr
        assert "result               FAIL" in bad.stdout and "check failed: " in bad.stderr
    usage = _binary("--max_generated_tokens=-1")
    assert usage.returncode == 2 and "replay: --max_generated_tokens invalid: expected >= 0, got -1" in usage.stderr


@pytest.mark.parametrize("flag, rows", [
    ("--kv_dtype=fp8_e4m3", ["KV cache             float8_e4m3fn, per-kv-head scales = amax / 448"]),
    ("--model=gpt-oss-20b", ["model                gpt-oss-20b: 64 qo heads, 8 kv heads, head_dim 64, page_size 16; "
                             "2 layers per step: sliding (128-token window), full; each with its own sinks",
                             "prefill tokens       1,740 in 4 ragged calls per layer"]),
])
def test_binary_new_flags(flag, rows):
    ok = _binary(flag)
    assert ok.returncode == 0, ok.stderr
    assert "result               PASS" in ok.stdout and "; 0 failed" in ok.stdout
    for row in rows:
        assert row in ok.stdout, ok.stdout
    bad = _binary(flag, "--inject_fault=output")
    assert bad.returncode == 1 and "result               FAIL" in bad.stdout and "check failed: " in bad.stderr


@pytest.mark.parametrize("flags, message", [
    (["--kv_dtype=fp8_e4m3", "--dtype=float32"],
     "replay: --kv_dtype=fp8_e4m3 conflicts with --dtype=float32: expected --dtype bfloat16 or float16"),
    # Each of these used to pass silently, crash (a segfault, a traceback) or fail mid-run.
    (["--inject_fault=output", "--check_every=0"],
     "replay: --inject_fault=output conflicts with --check_every=0"),
    (["--torch_threads=100000"], "replay: --torch_threads invalid: expected <= "),
    (["--seed=99999999999999999999"], "replay: --seed invalid: expected -2**63 .. 2**63 - 1 (int64)"),
    (["--decode_num_splits=2147483648"], "replay: --decode_num_splits invalid: expected <= 2147483647"),
    (["--step_ms=inf"], "replay: --step_ms invalid: expected a finite value > 0, got inf"),
    (["--workspace_mb=100000000"], "run_replay: workspace too large: "),
])
def test_binary_refuses_combinations(flags, message):
    """Refused before any process group is joined: exit 2, the reason on stderr."""
    usage = _binary(*flags)
    assert usage.returncode == 2 and message in usage.stderr, usage.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
