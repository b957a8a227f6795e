"""End-to-end tests of the replay through splitkv: a short replay passes every check with
real values, and each injected fault is caught and makes the binary exit 1."""

import os
import subprocess
import sys

import pytest
import torch

from tools.replay import checks
from tools.replay.presets import PRESETS, AttentionShape
from tools.replay.runner import ReplayConfig, run_replay
from tools.replay.trace import TraceRequest

# (arrival s, prompt tokens, generated tokens): a prompt of one token, page-boundary lengths,
# overlapping decodes, a long one whose decodes the planner splits, a request arriving while
# the batch is idle.
_SPECS = [(0.0, 1, 5), (0.0, 16, 3), (0.01, 17, 40), (0.05, 1100, 12), (0.3, 33, 20), (9.0, 97, 6)]
_REQUESTS = [TraceRequest(i, *spec) for i, spec in enumerate(_SPECS)]


def _config(**overrides):
    values = dict(requests=_REQUESTS, shape=PRESETS["llama3-8b-tp8"], device=torch.device("cpu"),
                  dtype=torch.bfloat16, num_pages=512, max_batch_size=4, check_every=1,
                  workspace_bytes=32 << 20, progress=False)
    values.update(overrides)
    return ReplayConfig(**values)


@pytest.mark.parametrize("overrides", [
    {},
    {"dtype": torch.float32, "kv_layout": "NHD"},
    {"dtype": torch.float16, "decode_num_splits": 3, "prefill_num_splits": 2,
     "shape": AttentionShape(8, 2, 64, 4, "small pages")},
])
def test_short_replay_passes(overrides):
    config = _config(**overrides)
    result = run_replay(config)
    stats = result.check_stats
    assert result.ok, (result.error, result.counter_failure, stats.failures)
    assert result.finished == 6
    assert result.prefill_tokens == sum(s[1] for s in _SPECS) == 1264
    assert result.decode_tokens == sum(s[2] - 1 for s in _SPECS) == 80
    assert result.counter_steps_checked == result.steps > 40
    # Every call was checked, against real values: the error is small but not zero.
    assert stats.calls == {"prefill": result.prefill_calls, "decode": result.decode_calls}
    atol, _ = checks.OUTPUT_TOLERANCES[config.dtype]
    assert 0.0 < stats.max_out_error < 2 * atol and stats.max_lse_error < checks.LSE_ATOL
    # Small batches on few workers split the KV, so the counters were used and reset.
    assert result.split_calls["decode"] > 0
    if config.decode_num_splits:
        assert result.max_num_splits["decode"] == 3 and result.split_calls["prefill"] == result.prefill_calls


def test_batch_invariant_replay_reruns_alone_bitwise():
    """--batch_invariant: every checked call re-runs its requests alone, and none differs;
    the 1100-token prompt crosses the 1024-key invariant split."""
    result = run_replay(_config(batch_invariant=True))
    inv = result.invariance
    assert result.ok, (result.error, result.counter_failure, result.check_stats.failures, inv.failures)
    assert inv.compared["prefill"] == len(_SPECS) and inv.compared["decode"] >= result.decode_calls
    assert inv.differed == 0


def test_output_fault_is_caught():
    result = run_replay(_config(inject_fault="output"))
    assert not result.ok and result.counter_failure is None
    assert len(result.check_stats.failures) == 1
    assert result.check_stats.failures[0].startswith("prefill step 0 request 0 (q_len 1, kv_len 1): out max abs error")
    assert result.finished == 6  # an output mismatch is recorded and the replay goes on


def test_counter_fault_stops_the_replay():
    result = run_replay(_config(inject_fault="counter"))
    assert not result.ok
    assert result.counter_failure == ("counter region not zero after step 0: 1 nonzero counters in bytes "
                                      "[0, 8388608), the first counter 1000 (byte 4000) = 1")
    assert result.finished == 0


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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
