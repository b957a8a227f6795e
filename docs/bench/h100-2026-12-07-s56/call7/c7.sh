#!/usr/bin/env bash
# Session 56 call 7: on an H200 only, the fp8 decode split probe at d128 (issue 17).
source tools/gpu/call_lib.sh .device_run73/kits.tar.xz
if on_h200; then
  PYTHONPATH="$CALL_PKGS/k3:tests/python:.:${PYTHONPATH}" timeout 240 python3 tools/gpu/decode_split_probe.py --kv_dtype=fp8_e4m3 --head_dim=128 --splits=2,4,16,24,32,48,64 24x4096 1x32768 > "$OUT/probe_fp8_d128.txt" 2>&1
  log "rc=$?"
else
  log "not an H200: nothing run"
fi
