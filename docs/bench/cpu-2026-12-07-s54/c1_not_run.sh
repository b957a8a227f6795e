#!/usr/bin/env bash
# Session 54 call 1: the runners and the C++ device scope (issue 15) on the GPU, host time
# beside FlashInfer (k2 = main a1991af's package); the fp8 decode split probe (issue 17).
source tools/gpu/call_lib.sh .device_run70/kits.tar.xz
source tools/gpu/install_peers.sh .device_run70/peers.tar.xz > "$OUT/peers.txt" 2>&1
BASEPP="tests/python:.:${PYTHONPATH}"
log "k2 GPU tests: runners, call cache, concurrency"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 70 python3 -m pytest tests/python/runners_test.py tests/python/call_cache_test.py -m gpu -q -rs -p no:cacheprovider > "$OUT/pytest_k2.log" 2>&1
log "rc=$? $(tail -1 $OUT/pytest_k2.log)"
log "overhead k2 (tiny rows + issue rows)"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 120 python3 tools/bench/overhead.py --device=cuda --issue_rows --iters=2000 --out_dir="$OUT/overhead_k2" > "$OUT/overhead_k2.txt" 2>&1
log "rc=$?"
log "fp8 split probe d128"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout "$(left 250)" python3 tools/gpu/decode_split_probe.py --kv_dtype=fp8_e4m3 --head_dim=128 --splits=1,2,3,4,6,8,12,16 24x4096 1x32768 > "$OUT/probe_fp8_d128.txt" 2>&1
log "rc=$?"
