#!/usr/bin/env bash
# Session 56 call 3: every GPU test on main 947022a's package (this stop's Python changes:
# the workspace checks' flat counter-region reads on CUDA, the new bad-input case, xfail on
# CUDA), memcheck; on an H200, the fp8 decode split probe (issue 17).
source tools/gpu/call_lib.sh .device_run73/kits.tar.xz
BASEPP="tests/python:.:${PYTHONPATH}"
gpu_tests k3
sanitize k3 memcheck
if on_h200; then
  log "fp8 split probe d128 (H200)"
  PYTHONPATH="$CALL_PKGS/k3:$BASEPP" timeout "$(left 540)" python3 tools/gpu/decode_split_probe.py --kv_dtype=fp8_e4m3 --head_dim=128 --splits=1,2,4,8,16,24,32,48,64 24x4096 1x32768 > "$OUT/probe_fp8_d128.txt" 2>&1
  log "rc=$?"
fi
log "done"
