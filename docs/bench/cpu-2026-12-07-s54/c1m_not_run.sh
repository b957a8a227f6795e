#!/usr/bin/env bash
# Session 54, the short form of c1.sh (device time nearly spent on failed starts): the runner
# GPU tests, the tiny host-time rows beside FlashInfer, then the fp8 d128 split probe as time allows.
source tools/gpu/call_lib.sh .device_run70/kits.tar.xz
source tools/gpu/install_peers.sh .device_run70/peers.tar.xz > "$OUT/peers.txt" 2>&1
BASEPP="tests/python:.:${PYTHONPATH}"
log "k2 GPU tests: runners"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 50 python3 -m pytest tests/python/runners_test.py -m gpu -q -rs -p no:cacheprovider > "$OUT/pytest_k2.log" 2>&1
log "rc=$? $(tail -1 $OUT/pytest_k2.log)"
log "overhead k2 (tiny rows)"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 70 python3 tools/bench/overhead.py --device=cuda --iters=1500 --out_dir="$OUT/overhead_k2" > "$OUT/overhead_k2.txt" 2>&1
log "rc=$?"
log "fp8 split probe d128"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout "$(left 190)" python3 tools/gpu/decode_split_probe.py --kv_dtype=fp8_e4m3 --head_dim=128 --splits=2,4,8,16 24x4096 1x32768 > "$OUT/probe_fp8_d128.txt" 2>&1
log "rc=$?"
