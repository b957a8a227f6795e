#!/usr/bin/env bash
# Session 56 call 2: the new bad-input case on the GPU (an infinite value behind logits that
# overflow to -inf: default and batch-invariant, CUDA); on an H200, the fp8 decode split
# probe (issue 17: does another split count reach 0.55 / 0.6 of bf16 there?).
source tools/gpu/call_lib.sh .device_run72/kits.tar.xz
BASEPP="tests/python:.:${PYTHONPATH}"
log "overflowed-logit cases (cuda)"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 120 python3 -m pytest tests/python/bad_inputs_test.py -m gpu -k "overflowed" -q -rA -p no:cacheprovider > "$OUT/pytest_overflowed.log" 2>&1
log "rc=$? $(tail -1 $OUT/pytest_overflowed.log)"
if on_h200; then
  log "fp8 split probe d128 (H200)"
  PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 200 python3 tools/gpu/decode_split_probe.py --kv_dtype=fp8_e4m3 --head_dim=128 --splits=1,2,3,4,8,16,24,32,48,64 24x4096 1x32768 > "$OUT/probe_fp8_d128.txt" 2>&1
  log "rc=$?"
  log "fp8 split probe d64 (H200)"
  PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout "$(left 540)" python3 tools/gpu/decode_split_probe.py --kv_dtype=fp8_e4m3 --head_dim=64 --splits=1,2,4,8,16,24,32,48,64 24x4096 1x32768 > "$OUT/probe_fp8_d64.txt" 2>&1
  log "rc=$?"
fi
log "done"
