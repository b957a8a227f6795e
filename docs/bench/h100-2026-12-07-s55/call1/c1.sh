#!/usr/bin/env bash
# Session 55 call 1: every GPU test on main 59f4595's package (the runners' CUDA path and the C++
# device scope had not run on a GPU), memcheck, issue 15's host-time table beside FlashInfer, and
# the fp8 decode split probe (issue 17).
source tools/gpu/call_lib.sh .device_run71/kits.tar.xz
source tools/gpu/install_peers.sh .device_run71/peers.tar.xz > "$OUT/peers.txt" 2>&1
BASEPP="tests/python:.:${PYTHONPATH}"
gpu_tests k2
sanitize k2 memcheck
log "overhead k2 (tiny rows + issue rows)"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 120 python3 tools/bench/overhead.py --device=cuda --issue_rows --iters=2000 --out_dir="$OUT/overhead_k2" > "$OUT/overhead_k2.txt" 2>&1
log "rc=$?"
log "fp8 split probe d128"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout "$(left 540)" python3 tools/gpu/decode_split_probe.py --kv_dtype=fp8_e4m3 --head_dim=128 --splits=1,2,3,4,6,8,12,16 24x4096 1x32768 > "$OUT/probe_fp8_d128.txt" 2>&1
log "rc=$?"
log "fp8 split probe d64"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout "$(left 570)" python3 tools/gpu/decode_split_probe.py --kv_dtype=fp8_e4m3 --head_dim=64 --splits=1,2,3,4,6,8,12,16,24 24x4096 1x32768 > "$OUT/probe_fp8_d64.txt" 2>&1
log "rc=$?"
